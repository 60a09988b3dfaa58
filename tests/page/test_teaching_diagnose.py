"""'Why does this response feel slow?' in real Chromium: diagnose() (static/teach/ft-diagnose.js) on
engineered situations (queue-bound, cache-bound, prefill-bound, decode-bound, stalled behind
another request's prefill) names the cause with the measured numbers, the request panel shows it, a
first token slowed by a new shape's first forward says that cost once it is measured, and on the
live tiny engine a request queued behind a full batch is diagnosed as queueing, not as the
clumps a busy machine's websocket can make. What sharing the batch cost a request, and the tour's
and the many-users lesson's words about batching, follow the step costs the events measured
(static/teach/ft-relations.js); a mean per token is named beside its median."""
import pytest

from helpers import page_module
from test_teaching import tpage  # noqa: F401  (a fixture)


def request_events(rid, arrival, *, queue, prefill, tokens, later, prompt=64, first_sample=0.002, delivery=0.001):
    """The events of one finished request with the given measured stages (seconds)."""
    tok_end = arrival + 0.001
    admitted = tok_end + queue
    p_end = admitted + prefill
    first = p_end + first_sample + delivery
    per = sum(later.values())
    end = first + per * (tokens - 1)
    ttft = first - arrival
    stages = {"tokenize": 0.001, "queue": queue, "prefill": prefill, "first_sample": first_sample, "delivery": delivery}
    stages["other"] = ttft - sum(stages.values())
    evs = [
        {"type": "request", "t": arrival, "id": rid, "source": "load", "prompt_tokens": prompt, "max_new_tokens": tokens,
         "preview": "x", "estimated": False},
        {"type": "tokenized", "t": tok_end, "id": rid, "start": arrival, "end": tok_end, "n": prompt, "ids": [1], "pieces": ["x"],
         "truncated": True},
        {"type": "admitted", "t": admitted, "id": rid, "slot": 0, "queue_s": queue, "blocks": 4, "prompt_tokens": prompt,
         "cached_tokens": 0, "resumed": False},
        {"type": "prefill", "t": p_end, "id": rid, "start": admitted, "end": p_end, "pos": 0, "tokens": prompt, "done": True},
    ]
    for i in range(tokens):
        t = first + per * i
        evs.append({"type": "token", "t": t, "id": rid, "index": i, "token_id": 5, "text": "a", "first": i == 0,
                    "sampled": t, "sample_s": 0.0001})
    evs.append({"type": "finished", "t": end, "id": rid, "reason": "length", "source": "load", "prompt_tokens": prompt,
                "output_tokens": tokens, "e2e": end - arrival, "ttft": ttft, "tpot": per if tokens > 1 else None,
                "stages": stages, "later": later, "cached_tokens": 0, "preemptions": 0, "client_side": False,
                "chunks": None, "gaps": None, "error": None})
    return evs


LATER = {"decode": 0.02, "mixed": 0.0, "stalled": 0.0, "preempted": 0.0, "sample": 0.0005, "delivery": 0.0002}


def stats(t, waiting, blocked_on, running=4):
    return {"type": "stats", "t": t, "queue": len(waiting), "running": running, "waiting_ids": waiting, "slots": [],
            "cache_blocks_used": 60, "cache_blocks": 64, "cache_tokens": 900, "cache_blocks_shared": 0,
            "cache_blocks_cached": 0, "block_tables": {}, "prefix_queries": 0, "prefix_hits": 0, "preemptions": 0,
            "subscribers": 1, "tokens_per_s": 10.0, "ttft": None, "itl": None, "finished": 0, "blocked_on": blocked_on,
            "in_flight": None, "cache_usage": None, "server": None}


def busy_batch(prefix, n=4):
    """n requests holding every slot from t=0 to about t=2.2."""
    evs = []
    for i in range(n):
        evs += request_events(f"{prefix}b{i}", 0.0, queue=0.0, prefill=0.05, tokens=100, later=LATER)
    return evs


def waiting_ahead(prefix, n=3):
    """n requests that arrived just before the target and waited too."""
    evs = []
    for i in range(n):
        evs += request_events(f"{prefix}w{i}", 0.01 + 0.001 * i, queue=1.0, prefill=0.05, tokens=4, later=LATER)
    return evs


def situations():
    """name -> (events, target id, expected cause, the figure the text must carry (seconds))."""
    q = busy_batch("q") + waiting_ahead("q") + request_events("qx", 0.05, queue=1.6, prefill=0.05, tokens=10, later=LATER)
    c = (busy_batch("c") + request_events("cx", 0.05, queue=1.2, prefill=0.05, tokens=10, later=LATER)
         + [stats(0.3, ["cx"], "cache"), stats(0.8, ["cx"], "cache")])
    p = request_events("px", 5.0, queue=0.0, prefill=0.9, tokens=2, later=LATER, prompt=2000)
    d = request_events("dx", 8.0, queue=0.0, prefill=0.03, tokens=120, later=LATER)
    st_later = dict(LATER, stalled=0.06)
    st = request_events("sx", 12.0, queue=0.0, prefill=0.03, tokens=40, later=st_later)
    q, c = sorted(q, key=lambda e: e["t"]), sorted(c, key=lambda e: e["t"])   # as the engine sends them: in time order
    return {
        "queue-bound": (q, "qx", "queueing", 1.6, ["3 requests were ahead of it", "all 4 slots were busy"]),
        "cache-bound": (c, "cx", "cache", 1.2, ["KV-cache blocks"]),
        "prefill-bound": (p, "px", "prefill", 0.9, ["2000-token prompt"]),
        "decode-bound": (d, "dx", "decode", 119 * (LATER["decode"] + LATER["sample"]) + 0.002, ["119 later tokens"]),
        "stalled": (st, "sx", "stalled", 39 * 0.06, ["waiting behind other requests' prefill"]),
    }


def test_diagnose_names_the_cause_with_the_measured_numbers(tpage):
    """The pure function, on a fresh state per situation: cause, the dominant figure, the scene."""
    for name, (events, rid, cause, figure, phrases) in situations().items():
        d = tpage.js("""([state, diagnosis, evs, rid]) => {
            const s = state.createState();
            state.ingest(s, Object.assign({}, firstToken.state.hello, {t: 0}), null);
            s.settings.slots = 4;
            for (const ev of evs) state.ingest(s, ev, null);
            return diagnosis.diagnose(s.reqs.get(rid), s);
        }""", [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose"), events, rid])
        assert d["cause"] == cause, (name, d)
        main = {"queueing": "queue", "cache": "queue", "stalled": "stalled"}.get(cause, cause)
        assert d["numbers"][main] == pytest.approx(figure, rel=0.02), (name, d["numbers"])
        assert tpage.fmt(d["numbers"][main]) in d["text"], (name, d["text"])
        assert tpage.fmt(d["numbers"]["total"]) in d["text"]
        for phrase in phrases:
            assert phrase in d["text"], (name, d["text"])
        assert "likely" in d["text"] or "cause" in d["text"]   # phrased as a hypothesis


def test_the_request_panel_shows_the_diagnosis_of_the_selected_request(tpage):
    """The same situations fed into the page's own state: selecting a request shows its cause."""
    sit = situations()
    for name in ("queue-bound", "prefill-bound", "decode-bound", "stalled"):
        events, rid, cause, figure, phrases = sit[name]
        tpage.js("""([state, evs, rid]) => { const s = firstToken.state;
            for (const ev of evs) state.ingest(s, ev, null);
            firstToken.select(rid); }""", [page_module(tpage.page, "state"), events, rid])
        tpage.wait("c => document.getElementById('d-why').dataset.cause === c", cause, timeout=5_000)
        text = tpage.page.text_content("#d-why")
        assert phrases[0] in text
        tpage.js("firstToken.send({type: 'reset'})")
        tpage.wait("() => firstToken.state.order.length === 0", timeout=5_000)
    assert tpage.errors == []


def test_a_request_queued_behind_a_full_batch_is_diagnosed_as_queueing(tpage):
    """On the live tiny engine: one slot, a burst of six; the last waits for the five before it."""
    tpage.js("firstToken.send({type: 'set', settings: {slots: 1, max_new_tokens: 24, prompt_tokens: 32}})")
    tpage.wait("() => firstToken.state.settings.slots === 1 && firstToken.state.settings.max_new_tokens === 24")
    ids = tpage.burst(6)
    tpage.wait_finished(ids)
    last = ids[-1]
    d = tpage.js("([diagnosis, id]) => diagnosis.diagnose(firstToken.state.reqs.get(id), firstToken.state)",
                 [page_module(tpage.page, "diagnose"), last])
    assert d["cause"] == "queueing", d
    assert d["numbers"]["ahead"] >= 3 and d["numbers"]["busy"] == 1
    assert d["numbers"]["queue"] > d["numbers"]["prefill"]
    tpage.js("id => firstToken.select(id)", last)
    tpage.wait("() => document.getElementById('d-why').dataset.cause === 'queueing'", timeout=5_000)
    assert "the only slot was busy" in tpage.page.text_content("#d-why")
    assert tpage.errors == []


def with_step(evs, first_shape):
    """A one-request request's events with the `step` event of its prefill forward after its `prefill`."""
    i = next(k for k, e in enumerate(evs) if e["type"] == "prefill")
    p = evs[i]
    step = {"type": "step", "t": p["end"], "kind": "prefill", "start": p["start"], "end": p["end"], "ids": [p["id"]],
            "tokens": p["tokens"], "prefill_tokens": p["tokens"], "decode_tokens": 0, "kv_cache": True,
            "cache_tokens": p["tokens"], "cache_blocks_used": 16, "per_request": {p["id"]: p["tokens"]},
            "predicted_s": None, "bound": None, "spec": None, "first_shape": first_shape}
    return evs[:i + 1] + [step] + evs[i + 1:]


def test_a_first_token_slowed_by_a_new_shape_says_what_that_cost_only_once_measured(tpage):
    """A prompt whose forward was the first of its shape: the diagnosis says how much of its TTFT
    that forward took over later forwards like it, once one has run (never before), and not for
    the later request."""
    first = with_step(request_events("fx", 20.0, queue=0.0, prefill=0.5, tokens=2, later=LATER, prompt=256), True)
    again = with_step(request_events("gx", 30.0, queue=0.0, prefill=0.2, tokens=2, later=LATER, prompt=256), False)
    run = """([state, diagnosis, evs, rid]) => { const s = state.createState();
        state.ingest(s, Object.assign({}, firstToken.state.hello, {t: 0}), null);
        for (const ev of evs) state.ingest(s, ev, null);
        return diagnosis.diagnose(s.reqs.get(rid), s).text; }"""
    mods = [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose")]
    alone = tpage.js(run, mods + [first, "fx"])
    assert "setting up of kernels" not in alone, alone          # nothing like it has run yet: not measured
    text = tpage.js(run, mods + [first + again, "fx"])
    assert f"{tpage.fmt(0.3)} of its time to first token was the setting up of kernels" in text, text
    assert "setting up of kernels" not in tpage.js(run, mods + [first + again, "gx"])


def test_clumps_with_nothing_set_between_are_buffering_only_when_they_made_the_first_token_late(tpage):
    """A busy machine can clump this page's own websocket: with no proxy or delay set, clumped
    arrivals name buffering only when the first token came late here by a fifth of what the page
    saw; a request that queued for 1.9 s and then arrived in clumps is not a buffering story."""
    def case(first_arrival):
        made = [2.0 + 0.01 * i for i in range(24)]                        # the engine: steady, 10 ms apart
        arrivals = [first_arrival + 0.15 * (i // 6) for i in range(24)]   # here: four clumps, 150 ms apart
        r = {"arrival": 0.0, "ttft": 2.0, "first": made[0], "tokens": made, "arrivals": arrivals,
             "tokenSpec": [None] * 24, "stages": {"queue": 1.9, "prefill": 0.09}}
        d = tpage.js("([delivery, r]) => delivery.diagnoseDelivery(r, {settings: {}, loads: []})",
                     [page_module(tpage.page, "delivery"), r])
        return d and d["cause"]
    assert case(2.02) is None                  # 20 ms late here: the queue is the story
    assert case(2.8) == "buffering"            # 0.8 s of 2.8 s late here, in clumps


def decode_steps(ids, start, ms, n, first_shape=0):
    """`n` decode steps of the requests `ids`, `ms` each, back to back from engine time `start` (the
    first `first_shape` of them the first forwards of their shape)."""
    evs, t = [], start
    for i in range(n):
        evs.append({"type": "step", "t": t + ms / 1000, "kind": "decode", "start": t, "end": t + ms / 1000, "ids": ids,
                    "tokens": len(ids), "prefill_tokens": 0, "decode_tokens": len(ids), "kv_cache": True,
                    "cache_tokens": 64 * len(ids), "cache_blocks_used": 4 * len(ids), "per_request": {i: 64 for i in ids},
                    "predicted_s": 0.004, "bound": "memory", "spec": None, "first_shape": i < first_shape})
        t += ms / 1000
    return evs


def sweep(steps_ms, t=1.0):
    """A finished decode-cost sweep (a `measure` event) at context 128: batch -> ms."""
    return {"type": "measure", "t": t, "status": "done", "batches": sorted(steps_ms), "contexts": [128],
            "decode": [{"batch": b, "context": 128, "step_s": ms / 1000, "floor_s": 0.002, "predicted_s": 0.003, "bound": "memory"}
                       for b, ms in sorted(steps_ms.items())],
            "kv": [], "prefill": [], "skipped": [], "seconds": 2.0, "weights": None}


DIAGNOSE = """([state, diagnosis, evs, rid]) => { const s = state.createState();
    state.ingest(s, Object.assign({}, firstToken.state.hello, {t: 0}), null);
    for (const ev of evs) state.ingest(s, ev, null);
    return diagnosis.diagnose(s.reqs.get(rid), s); }"""


def test_the_diagnosis_says_what_sharing_the_batch_cost_from_the_step_costs_measured(tpage):
    """A decode-bound request that shared its steps with three others: what that cost it is the
    measured steps' (batch 4 against batch 1), said from the steps seen so far, and from the
    decode-cost sweep once one has run; the same request reads 'only a little' under flat costs
    and '3.5× slower' under steep ones. The costs are the events' (engine times), not this machine's."""
    d = request_events("dx", 8.0, queue=0.0, prefill=0.03, tokens=120, later=LATER)
    first = next(e["t"] for e in d if e["type"] == "token")
    alone = decode_steps(["a1"], 1.0, 20, 5)               # a lone request's steps, earlier: 20 ms each

    def text(batch4_ms, extra=()):
        evs = alone + list(extra) + d + decode_steps(["dx", "o1", "o2", "o3"], first, batch4_ms, 30)
        evs.sort(key=lambda e: e["t"])
        got = tpage.js(DIAGNOSE, [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose"), evs, "dx"])
        assert got["cause"] == "decode", got
        return got["text"]

    flat = text(22)
    assert "Its decode steps held a median of 4 requests" in flat, flat
    assert "the 35 decode steps seen so far" in flat and "a step of 4 requests takes 1.1× a step of 1" in flat, flat
    assert "sharing the batch slowed it only a little" in flat
    steep = text(70)
    assert "a step of 4 requests takes 3.5× a step of 1 (70 ms against 20 ms)" in steep, steep
    assert "about 3.5× slower than alone" in steep and "fewer requests at once would likely help" in steep
    assert "only a little" not in steep
    # a sweep measured the costs: its figures, and it says so, over the steps seen
    swept = text(70, [sweep({1: 5.0, 2: 6.0, 4: 9.5})])
    assert "(the decode-cost sweep, context 128 tokens), a step of 4 requests takes 1.9× a step of 1" in swept, swept
    assert tpage.errors == []


def test_a_per_token_time_says_it_is_a_mean_beside_its_median_and_the_new_shapes_in_it(tpage):
    """The decode-bound request's later tokens: their mean (finished.tpot) named as one, the median
    gap beside it, and the three forwards among them that were the first of their shape (what they
    took, measured); the request panel's bar says the same."""
    d = request_events("mx", 8.0, queue=0.0, prefill=0.03, tokens=60, later=LATER)
    first = next(e["t"] for e in d if e["type"] == "token")
    steps = decode_steps(["mx"], first, 20.5, 59, first_shape=3)
    evs = sorted(d + steps, key=lambda e: e["t"])
    got = tpage.js(DIAGNOSE, [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose"), evs, "mx"])
    mean = LATER["decode"] + LATER["sample"] + LATER["delivery"]
    took = tpage.fmt(3 * 0.0205)
    assert f"59 later tokens at {tpage.fmt(mean)} each on average (mean of 59; median {tpage.fmt(mean)}; the first 3 " \
           f"forwards of their shape took {took} setting up their kernels" in got["text"], got["text"]
    tpage.js("""([state, evs]) => { for (const ev of evs) state.ingest(firstToken.state, ev, null); firstToken.select("mx"); }""",
             [page_module(tpage.page, "state"), evs])
    tpage.wait("() => document.getElementById('d-accounting').textContent.includes('per later token (mean of 59; median')",
               timeout=5_000)
    assert "the first 3 forwards of their shape" in tpage.page.text_content("#d-accounting")
    # its finish reason in plain words, in the panel's title
    assert "stopped at the token limit" in tpage.page.text_content("#d-title")
    tpage.js("firstToken.send({type: 'reset'})")
    tpage.wait("() => firstToken.state.order.length === 0", timeout=5_000)
    assert tpage.errors == []


def test_a_request_in_flight_counts_its_tokens_in_words(tpage):
    """'1 token so far', not '1 tokens so far'."""
    d = [e for e in request_events("ix", 8.0, queue=0.0, prefill=0.03, tokens=5, later=LATER) if e["type"] != "finished"]
    one = [e for e in d if e["type"] != "token" or e["index"] == 0]
    got = tpage.js(DIAGNOSE, [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose"), one, "ix"])
    assert "; 1 token so far." in got["text"], got["text"]
    got = tpage.js(DIAGNOSE, [page_module(tpage.page, "state"), page_module(tpage.page, "diagnose"), d, "ix"])
    assert "; 5 tokens so far." in got["text"], got["text"]


def test_the_tour_and_the_many_users_lesson_state_the_measured_relation_and_the_ridge(tpage):
    """The Batching step's words and the many-users lesson's live figure: from the sweep, a busier
    step against a lone one and the batch where arithmetic takes over (measured), and the roofline's
    ridge computed from hello.roofline (an estimate); before anything is measured, they say so."""
    hello = tpage.js("firstToken.state.hello")
    run = """([state, tour, figures, evs]) => { const s = state.createState();
        state.ingest(s, Object.assign({}, firstToken.state.hello, {t: 0}), null);
        for (const ev of evs) state.ingest(s, ev, null);
        return {tour: tour.STEPS.find((x) => x.key === "batching").text(s, {}),
                lesson: figures.proofText("many-users", s, 0)}; }"""
    mods = [page_module(tpage.page, n) for n in ("state", "tour", "figures")]
    before = tpage.js(run, mods + [[stats(0.5, [], None)]])
    assert "How much a busier batch slows a step is not measured yet" in before["tour"], before
    assert "slows only a little" not in before["tour"] and "measured" not in before["lesson"]
    got = tpage.js(run, mods + [[sweep({1: 5.0, 2: 5.5, 4: 6.0, 8: 15.0, 16: 30.0}), stats(2.0, [], None)]])
    assert "(the decode-cost sweep, context 128 tokens): a step of 16 requests takes 6.0× a step of 1" in got["tour"], got
    assert "batching is nearly free up to batch 4 (a step within 1.25× of a lone one); by batch 8 arithmetic takes over" \
        in got["tour"], got["tour"]
    # the roofline's ridge, as engine/timing/roofline.py counts a decode step at context 128
    R, kvb = hello["roofline"], hello["kv_bytes_per_token"]
    fmt = hello["settings"]["weights"] if hello.get("weights") else None
    weight_bytes = hello["weights"]["formats"][fmt]["decode_bytes"] if fmt else hello["bandwidth"]["weight_bytes"]
    bw, peak = R["gbs"] * 1e9, R["peak_gflops"] * 1e9
    row = (2 * (R["linear_params"] + R["head_params"]) + R["attention_flops_per_pair"] * 129) / peak - 130 * kvb / bw
    ridge = (weight_bytes / bw) / row if row > 0 else None
    said = "at no batch" if ridge is None else \
        f"near batch {1 if ridge < 1.5 else int(ridge + 0.5) if ridge < 10 else int(ridge / 2 + 0.5) * 2}"   # as Math.round
    assert f"the roofline puts the ridge {said} (an estimate" in got["tour"], (ridge, got["tour"])
    assert "measured (the sweep): a step of 16 requests takes 6.0× a step of 1" in got["lesson"], got["lesson"]
    assert "arithmetic takes over by batch 8" in got["lesson"] and "roofline estimate" in got["lesson"]
