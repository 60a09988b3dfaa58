"""'Why does this response feel slow?' in real Chromium: diagnose() (static/teach/ft-diagnose.js) on
engineered situations (queue-bound, cache-bound, prefill-bound, decode-bound, stalled behind
another request's prefill) names the cause with the measured numbers, the request panel shows it, a
first token slowed by a new shape's first forward says that cost once it is measured, and on the
live tiny engine a request queued behind a full batch is diagnosed as queueing, not as the
clumps a busy machine's websocket can make."""
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
