"""Engine unit tests: `Engine.step()` driven directly on a tiny random Llama (built from a
config), with no threads and no sleeps: arrivals happen at chosen steps."""
import pytest
import torch

from engine import Engine, EngineConfig, SettingError
from engine import events as ev
from engine.broadcast import Broadcaster, Wire
from engine.teach.loadgen import LoadGenerator
from engine.core.policies import Blocked
from engine.core.request import GenerateRequest, RequestHandle
from engine.model.runner import Segment
from engine.core.sequence import SamplingParams, Sequence, Status
from engine.settings import make_settings, validate
from engine.core.step_output import Ended, Placed, StepOutput
from engine.timing.recorder import StepRecorder
from stepping import Run, assert_clean
from helpers import reference

PROMPTS = ["We hold these truths", "Four score and seven years ago our fathers brought forth",
           "He has refused", "When in the Course of human events, it becomes necessary for one people",
           "Liberty", "that all men are created equal, that they are endowed"]


@pytest.fixture
def engine(tiny):
    return Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))


@pytest.mark.parametrize("settings", [{}, {"max_batched_tokens": 16}, {"kv_cache": False},
                                      {"schedule": "prefill-first"}, {"schedule": "static"},
                                      {"prefix_caching": False}],
                         ids=["mixed", "small-budget", "no-kv-cache", "prefill-first", "static", "no-prefix-cache"])
def test_greedy_equals_generate_with_joins_and_leaves(tiny, engine, settings):
    """Six prompts of different lengths through 4 slots, arriving two steps apart, leaving at
    different steps (different max_new_tokens): each equals generate() run alone."""
    if settings:
        engine.apply_settings(validate(engine.specs, settings))
    run = Run(engine)
    for i, p in enumerate(PROMPTS):
        run.add(p, max_new_tokens=6 + 5 * i)
        run.step(2)
    run.until_idle()
    for i, p in enumerate(PROMPTS):
        assert run.finished(run.ids[i]).reason in ("length", "stop")
        assert run.tokens(run.ids[i]) == reference(tiny, p, 6 + 5 * i), f"prompt {i} diverged"
    assert_clean(engine)


def test_step_returns_typed_events_that_serialise(engine):
    run = Run(engine)
    rid = run.add(PROMPTS[0], max_new_tokens=3)
    run.until_idle()
    kinds = [type(e).__name__ for e in run.events if getattr(e, "id", None) == rid]
    assert kinds[:4] == ["Request", "Tokenized", "Admitted", "Prefill"]
    assert kinds[-1] == "Finished" and kinds.count("Token") == 3
    wire = run.finished(rid).to_dict()
    assert wire["type"] == "finished" and wire["id"] == rid and wire["output_tokens"] == 3
    assert set(wire["stages"]) == {"tokenize", "load", "queue", "prefill", "transfer", "first_sample", "delivery", "other"}


def test_batches_really_form(engine):
    run = Run(engine)
    for i, p in enumerate(PROMPTS[:4]):
        run.add(p, max_new_tokens=4 + 6 * i)
    run.until_idle()
    sizes = [len(e.ids) for e in run.of(ev.Step) if e.kind == "decode"]
    assert max(sizes) == 4, sizes            # all four decoded together
    assert sizes[-1] == 1                     # the longest one ends alone after others left
    assert_clean(engine)


def test_no_kv_cache_recomputes_whole_sequence(engine):
    engine.apply_settings({"kv_cache": False})
    run = Run(engine)
    rid = run.add(PROMPTS[0], max_new_tokens=5)
    run.until_idle()
    n_prompt = run.finished(rid).prompt_tokens
    decode = [e for e in run.of(ev.Step) if e.kind == "decode"]
    # step k recomputes prompt + k tokens: the work grows every step, and nothing is cached
    assert [e.tokens for e in decode] == [n_prompt + k for k in range(1, len(decode) + 1)]
    assert all(e.kv_cache is False and e.cache_tokens == 0 for e in decode)
    assert_clean(engine)


def test_stage_accounting_sums_to_ttft(engine):
    run = Run(engine)
    for p in PROMPTS:
        run.add(p, max_new_tokens=8)
    run.until_idle()
    fins = run.of(ev.Finished)
    for fin in fins:
        stages = fin.stages
        assert sum(stages.values()) == pytest.approx(fin.ttft, abs=1e-9)
        assert all(v >= 0 for k, v in stages.items() if k != "other")
        # what no stage covers is, for a prompt of one chunk, exactly the engine's own gap from its
        # forward's end to the sampling's start (its events' clock reads), however slow the machine
        (prefill,), first = run.of(ev.Prefill, fin.id), run.of(ev.Token, fin.id)[0]
        assert stages["other"] == pytest.approx(first.sampled - first.sample_s - prefill.end, abs=1e-9)
        assert stages["other"] >= 0 and stages["prefill"] > 0
        assert fin.tpot > 0 and fin.later["decode"] > 0
    # 6 requests through 4 slots: somebody queued
    assert max(f.stages["queue"] for f in fins) > 0


def test_the_recorder_makes_stages_and_events_from_a_step_output_alone():
    """One request's step, written as a StepOutput on a clock the test sets: the recorder turns
    it into the step's events, in order, and the TTFT stages are the clock's own differences."""
    now = [0.0]
    clock = type("Clock", (), {"now": lambda self: now[0]})()
    seq = Sequence(id="r1", source="api", prompt="x", prompt_ids=[1, 2, 3], params=SamplingParams(),
                   arrival=0.0, tokenize_end=0.2, slot=0, handle=RequestHandle("r1", True))
    seg = Segment(seq, 0, 3, cached=True, logits=True)
    out = StepOutput(clock, scheduled=1.0, admitted=[Placed.of(seq)], running=[seq], segments=[seg],
                     forward=(1.0, 1.5), cache=(3, 1), sampling=(1.5, 1.6))
    now[0] = 1.7
    seq.output_ids.append(7)
    out.hand_out(seq, 7, "a", "a")
    out.ended.append(Ended(seq, "length", None, 1.8))
    recorder = StepRecorder(clock)
    events = recorder.record(out)
    assert [e.type for e in events] == ["admitted", "prefill", "step", "token", "finished"]
    admitted, prefill, step, token, fin = events
    assert admitted.queue_s == 1.0 and (prefill.start, prefill.end, prefill.tokens) == (1.0, 1.5, 3)
    assert (step.kind, step.prefill_tokens, step.cache_tokens, step.spec) == ("prefill", 3, 3, None)
    assert (token.sampled, token.sample_s) == (1.6, pytest.approx(0.1))
    assert fin.ttft == 1.7 and fin.e2e == 1.8 and fin.tpot is None and fin.slo is None
    assert fin.stages == pytest.approx({"tokenize": 0.2, "load": 0.0, "queue": 0.8, "prefill": 0.5, "transfer": 0.0,
                                        "first_sample": 0.1, "delivery": 0.1, "other": 0.0})
    assert list(seq.handle.events(timeout=0)) == [token, fin]          # the client's own events
    assert seq.times.first_delivered == 1.7                              # its record is the request's own


LONG = " ".join(PROMPTS * 4)


def test_small_cache_budget_makes_requests_wait(engine):
    """4 blocks of 16: the first request's 40-token prompt takes 3 and grows into the 4th; the
    second (20 tokens, 2 blocks) cannot be admitted until the first has finished."""
    engine.apply_settings({"cache_tokens": 64, "prefix_caching": False})   # (the prompts share a prefix)
    run = Run(engine)
    first = run.add(LONG, prompt_tokens=40, max_new_tokens=20)
    second = run.add(LONG, prompt_tokens=20, max_new_tokens=20)
    run.until_idle()
    assert max(e.cache_blocks_used for e in run.of(ev.Step)) <= 4
    assert not run.of(ev.Preempted)
    (admitted,) = run.of(ev.Admitted, second)
    assert admitted.t >= run.finished(first).t
    assert any(s.blocked_on == "cache" for s in run.of(ev.Stats))
    assert_clean(engine)


def test_preemption_recomputes_and_the_output_is_unchanged(tiny, engine):
    """Two requests that both fit when admitted but not once they grow: the newer one is
    preempted (blocks freed, tokens kept), recomputed later, and still equals generate()."""
    # ~34-token prompts: 3 blocks each when admitted (6 of 7), 4 each once they pass 48 tokens
    engine.apply_settings({"cache_tokens": 112})
    run = Run(engine)
    a = run.add(PROMPTS[1], max_new_tokens=30)
    b = run.add(PROMPTS[3], max_new_tokens=30)
    run.until_idle()
    pre = run.of(ev.Preempted)
    assert pre and {p.id for p in pre} <= {a, b}
    assert run.finished(pre[0].id).preemptions >= 1
    resumed = [e for e in run.of(ev.Admitted) if e.resumed]
    assert resumed and resumed[0].prompt_tokens > len(engine.tokenizer(PROMPTS[1])["input_ids"])
    assert max(e.cache_blocks_used for e in run.of(ev.Step)) <= 7
    assert run.tokens(a) == reference(tiny, PROMPTS[1], 30)
    assert run.tokens(b) == reference(tiny, PROMPTS[3], 30)
    # Preempted after its first token: the time until its next one is named `preempted`.
    victim = pre[0]
    assert run.of(ev.Token, victim.id)[0].t < victim.t
    fin = run.finished(victim.id)
    back = next(e for e in run.of(ev.Token, victim.id) if e.t > victim.t)
    assert fin.later["preempted"] * (fin.output_tokens - 1) == pytest.approx(back.sampled - victim.t, abs=1e-3)
    assert_clean(engine)


def test_prefix_cache_reuses_full_prompt_blocks(tiny, engine):
    """Three requests with the same 70-token prefix: the first computes it, the later ones
    find its 4 full blocks, share them while running, and still equal generate()."""
    shared = engine.tokenizer.decode(engine.tokenizer(LONG)["input_ids"][:70])
    prompts = [shared + tail for tail in (" Liberty", " He has refused", " We hold")]
    run = Run(engine)
    first = run.add(prompts[0], max_new_tokens=8)
    run.until_idle()
    later = [run.add(p, max_new_tokens=8) for p in prompts[1:]]
    run.step()
    assert engine.blocks.shared == 4                     # both later requests hold the 4 prefix blocks
    run.until_idle()
    hits = {e.id: e.cached_tokens for e in run.of(ev.Admitted)}
    assert hits[first] == 0 and all(hits[r] == 64 for r in later)
    assert all(run.finished(r).cached_tokens == 64 for r in later)
    prefill = {r: sum(e.tokens for e in run.of(ev.Prefill, r)) for r in [first] + later}
    assert all(prefill[r] == run.finished(r).prompt_tokens - 64 for r in later)
    for r, p in zip([first] + later, prompts):
        assert run.tokens(r) == reference(tiny, p, 8)
    assert engine.blocks.hits >= 128
    assert_clean(engine)


def later_total(run, rid, steps):
    """Seconds of `steps` (Step events) between `rid`'s first token and its finish."""
    first = run.of(ev.Token, rid)[0].t
    end = run.finished(rid).t
    return sum(e.end - e.start for e in steps if first <= e.start and e.end <= end)


def test_mixed_steps_keep_decodes_flowing_during_a_long_prefill(engine):
    """A 300-token prompt arrives while another request decodes: under `mixed` its prefill is
    chunked by the 64-token budget and every step also carries the running decode; under
    `prefill-first` the decode waits for the whole prompt. The decoding request's later-token
    accounting names that time: forwards shared with the prompt (`mixed`) or spent waiting
    outside them (`stalled`)."""
    def decode_during_prefill(policy):
        engine.apply_settings({"schedule": policy, "max_batched_tokens": 64})
        run = Run(engine)
        a = run.add(PROMPTS[0], max_new_tokens=40)
        run.step(3)
        b = run.add(LONG, prompt_tokens=300, max_new_tokens=2)
        run.until_idle()
        steps = [e for e in run.of(ev.Step) if b in e.ids and e.prefill_tokens]
        return run, steps, a
    run, steps, a = decode_during_prefill("mixed")
    assert len(steps) >= 5 and all(a in e.ids and e.kind == "mixed" for e in steps)
    assert all(e.tokens <= 64 for e in steps)
    fin = run.finished(a)
    n_later = fin.output_tokens - 1
    assert fin.later["mixed"] * n_later == pytest.approx(later_total(run, a, steps), rel=1e-9)
    assert fin.later["stalled"] == 0 and fin.later["decode"] > 0
    assert sum(fin.later.values()) <= fin.tpot

    run, steps, a = decode_during_prefill("prefill-first")
    assert len(steps) == 1 and steps[0].ids == [steps[0].ids[0]] and a not in steps[0].ids
    fin = run.finished(a)
    assert fin.later["stalled"] * (fin.output_tokens - 1) == pytest.approx(later_total(run, a, steps), rel=1e-9)
    assert fin.later["stalled"] > 0 and fin.later["mixed"] == 0
    assert_clean(engine)


def test_static_batching_admits_nobody_while_a_batch_runs(engine):
    engine.apply_settings({"schedule": "static", "slots": 2})
    run = Run(engine)
    ids = [run.add(p, max_new_tokens=4 + 8 * (i % 2)) for i, p in enumerate(PROMPTS[:4])]
    run.until_idle()
    admitted = {e.id: e.t for e in run.of(ev.Admitted)}
    first_batch_done = max(run.finished(r).t for r in ids[:2])
    assert all(admitted[r] >= first_batch_done for r in ids[2:])
    assert any(s.blocked_on == "batch" for s in run.of(ev.Stats))


def test_too_long_prompt_rejected_and_nothing_leaks(engine):
    run = Run(engine)
    rid = run.add("truths " * 600, max_new_tokens=10)
    (rej,) = run.of(ev.Rejected)
    assert rej.id == rid and rej.code == "context_length_exceeded" and "context" in rej.reason
    ok = run.add(PROMPTS[0], max_new_tokens=3)
    run.until_idle()
    assert run.finished(ok).reason in ("length", "stop")
    assert_clean(engine)


def test_cancel_frees_slot_and_blocks(engine):
    run = Run(engine)
    rid = run.add(PROMPTS[1], max_new_tokens=400)
    while not run.of(ev.Token, rid):
        run.step()
    assert engine.blocks.used > 0
    run.events += engine.cancel(rid)
    assert run.finished(rid).reason == "cancelled"
    assert_clean(engine)


def test_seeded_sampling_is_reproducible(engine):
    run = Run(engine)
    kw = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9}
    a, b, c = (run.add(PROMPTS[0], **kw, seed=s) for s in (7, 7, 8))
    run.until_idle()
    assert run.tokens(a) == run.tokens(b)
    assert run.tokens(a) != run.tokens(c)


def test_stop_string(engine, tiny):
    ref = reference(tiny, PROMPTS[3], 20)
    text = tiny.tokenizer.decode(ref, skip_special_tokens=True)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    run = Run(engine)
    rid = run.add(PROMPTS[3], max_new_tokens=20, stop=[stop])
    run.until_idle()
    assert run.finished(rid).reason == "stop_string"
    produced = tiny.tokenizer.decode(run.tokens(rid), skip_special_tokens=True)
    assert stop in produced and stop not in tiny.tokenizer.decode(run.tokens(rid)[:-1], skip_special_tokens=True)
    tokens = run.of(ev.Token, rid)
    assert "".join(t.text for t in tokens) == produced                 # the page: every token's own text
    assert "".join(t.client() for t in tokens) == text[:text.find(stop)]   # its client: up to the stop


def test_a_possible_stop_is_held_back_then_given_out_with_the_last_token(engine):
    """The tail that might begin a stop string is not given to the client until later text
    rules it out; when the request ends otherwise (here at max_new_tokens), the last token
    carries it. The page's `text` is each token's own throughout."""
    run = Run(engine)
    plain = run.add(PROMPTS[3], max_new_tokens=12, ignore_eos=True)
    run.until_idle()
    text = "".join(t.text for t in run.of(ev.Token, plain))
    stop = text[-2:] + "\u2603never"   # begins with the output's last two characters
    rid = run.add(PROMPTS[3], max_new_tokens=12, stop=[stop], ignore_eos=True)
    run.until_idle()
    tokens = run.of(ev.Token, rid)
    assert run.finished(rid).reason == "length" and "".join(t.text for t in tokens) == text
    assert "".join(t.client() for t in tokens) == text
    assert tokens[-1].client_text is not None and tokens[-1].client_text.endswith(text[-2:])
    assert "".join(t.client() for t in tokens[:-1]) == text[:len(text) - len(tokens[-1].client_text)]


def test_stale_cache_memory_cannot_leak_into_attention(tiny):
    """What blocks hold before a request writes them (here large random values, as a block
    freed by another request would) must never reach its logits, although attention reads
    whole blocks, and a batched decode reads a window padded to the longest request."""
    eng = Engine(tiny, EngineConfig(slots=3, kv_tokens=2048, max_context=256))
    g = torch.Generator().manual_seed(0)
    for t in (*eng.store.k, *eng.store.v):
        t[:eng.store.zero_block] = 1e3 * torch.randn(t[:eng.store.zero_block].shape, generator=g)
    run = Run(eng)
    a, b = run.add(PROMPTS[3], max_new_tokens=12), run.add(PROMPTS[4], max_new_tokens=12)
    run.until_idle()
    assert run.tokens(a) == reference(tiny, PROMPTS[3], 12)
    assert run.tokens(b) == reference(tiny, PROMPTS[4], 12)


def test_a_failing_forward_fails_its_batch_not_the_engine(engine, monkeypatch):
    real_decode = engine.runner.forward
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated out of memory")
        return real_decode(*args)
    monkeypatch.setattr(engine.runner, "forward", flaky)
    run = Run(engine)
    bad = run.add(PROMPTS[0], max_new_tokens=10)
    run.until_idle()
    assert run.finished(bad).reason == "error" and "simulated out of memory" in run.finished(bad).error
    assert any("simulated out of memory" in e.message for e in run.of(ev.Error))
    assert_clean(engine)
    good = run.add(PROMPTS[0], max_new_tokens=3)   # the engine still serves
    run.until_idle()
    assert run.finished(good).reason in ("length", "stop")


def test_reset_cancels_everything(engine):
    run = Run(engine)
    for p in PROMPTS:
        run.add(p, max_new_tokens=200)
    run.step(3)
    run.events += engine.reset()
    assert_clean(engine)
    assert len(run.of(ev.Finished)) == len(PROMPTS)
    assert {f.reason for f in run.of(ev.Finished)} == {"cancelled"}
    assert isinstance(run.events[-1], ev.Reset)


def test_stats_report_the_queue_when_due(engine):
    engine.apply_settings({"slots": 1})
    run = Run(engine)
    for p in PROMPTS[:3]:
        run.add(p, max_new_tokens=4)
    run.step()                                # the first step is always due for stats
    stats = run.of(ev.Stats)[-1]
    assert stats.running == 1 and stats.queue == 2 and stats.blocked_on is Blocked.SLOT
    assert '"blocked_on":"slot"' in Wire(stats.to_dict()).json
    assert engine.scheduler.running[0].status is Status.RUNNING
    assert all(s.status is Status.WAITING for s in engine.scheduler.waiting)
    assert stats.waiting_ids == run.ids[1:] and stats.slots[0] == run.ids[0]


def test_slow_subscriber_drops_without_blocking():
    b = Broadcaster(history=10, per_client=20)
    slow = b.subscribe()
    for i in range(1000):
        b.publish(ev.Reset(t=float(i)))
    got = slow.get(0)
    assert got[0] == {"type": "dropped", "t": 980.0, "count": 980}
    assert [e["t"] for e in got[1:]] == [float(i) for i in range(980, 1000)]
    fresh = b.subscribe()
    assert fresh.get(0) == [{"type": "reset", "t": 999.0, "cached_blocks": None}]   # its catch-up starts at the last reset
    for i in range(30):
        b.publish(ev.Sync(t=1000.0 + i, client_t=0.0, server_time=0.0))
    later = b.subscribe()
    assert [e["t"] for e in later.get(0)] == [1000.0 + i for i in range(20, 30)]   # bounded replay history


def test_loadgen_prompt_length_and_poisson_rate(tiny):
    lg = LoadGenerator(tiny.tokenizer, seed=1)
    for n in (16, 100, 1000):                      # 1000 > corpus size in tokens: wraps round
        assert len(lg.prompt(n)) > 0
    assert lg.due(0.0, True, 10.0) == 0
    assert 150 <= lg.due(20.0, True, 10.0) <= 250  # 200 expected in 20 s at 10/s
    assert lg.due(21.0, False, 10.0) == 0 and lg.next_arrival is None


def test_settings_spec_validates_against_limits():
    specs = make_settings(max_slots=8, cache_tokens_max=1024, block_size=16, max_context=512)
    assert validate(specs, {"slots": 8, "load": True}) == {"slots": 8, "load": True}
    with pytest.raises(SettingError):
        validate(specs, {"prompt_tokens": 4096})


def test_prefix_caching_turned_on_while_a_prompt_is_computed(tiny, engine):
    """A prompt admitted with prefix caching off has no block names yet; turned on before its
    last chunk, the blocks computed from then on are named: nothing fails, the output is
    unchanged."""
    engine.apply_settings({"prefix_caching": False, "max_batched_tokens": 16})
    run = Run(engine)
    rid = run.add(LONG, max_new_tokens=3)
    run.step(2)
    run.events += engine.apply_settings({"prefix_caching": True})
    run.until_idle()
    assert not run.of(ev.Error) and run.finished(rid).reason == "length"
    assert run.tokens(rid) == reference(tiny, LONG, 3)
    assert engine.blocks.pool.by_hash
    assert_clean(engine)


def test_ignore_eos_and_min_tokens(tiny, engine):
    """With the greedy first token declared end-of-sequence: a plain request stops after it;
    `ignore_eos` runs to max_new_tokens; `min_tokens` lets nothing end it before that many."""
    ref = reference(tiny, PROMPTS[2], 12)
    engine.eos = {ref[0]}
    run = Run(engine)
    plain = run.add(PROMPTS[2], max_new_tokens=12)
    ignore = run.add(PROMPTS[2], max_new_tokens=12, ignore_eos=True)
    least = run.add(PROMPTS[2], max_new_tokens=12, min_tokens=5)
    run.until_idle()
    assert run.tokens(plain) == ref[:1] and run.finished(plain).reason == "stop"
    assert run.tokens(ignore) == ref and run.finished(ignore).reason == "length"
    got = run.tokens(least)
    assert len(got) >= 5 and got == ref[:len(got)]
    stops = [i for i in range(4, 12) if ref[i] == ref[0]]
    assert len(got) == (stops[0] + 1 if stops else 12)
    with pytest.raises(SettingError) as e:
        engine.new_sequence(GenerateRequest(prompt="x", max_new_tokens=3, min_tokens=4))
    assert e.value.field == "min_tokens"


def test_reset_empties_the_prefix_cache(engine):
    """A prompt seen before a reset is computed again after it, all of it."""
    run = Run(engine)
    first = run.add(LONG, max_new_tokens=2)
    run.until_idle()
    again = run.add(LONG, max_new_tokens=2)
    run.until_idle()
    assert run.finished(again).cached_tokens > 0          # the cache works ...
    run.events += engine.reset()
    assert run.events[-1].cached_blocks == 0 and engine.blocks.cached_free == 0
    after = run.add(LONG, max_new_tokens=2)
    run.until_idle()
    assert run.finished(after).cached_tokens == 0          # ... and a reset empties it
    assert run.finished(first).cached_tokens == 0
    assert_clean(engine)


def test_ttft_percentiles_count_a_request_from_its_first_token(engine):
    """The headline TTFT must not stay "no data" while a long answer is still decoding."""
    run = Run(engine)
    rid = run.add(PROMPTS[0], max_new_tokens=400)
    while not run.of(ev.Token, rid):
        run.step()
    assert run.of(ev.Finished) == []
    ttft = engine.timing.stats.snapshot(engine.clock.now())["ttft"]["p50"]
    assert ttft == pytest.approx(run.of(ev.Token, rid)[0].t - run.of(ev.Request, rid)[0].t, abs=0.05)
    assert engine.timing.stats.finished == 0
