"""Engine unit tests: `Engine.step()` driven directly on a tiny random Llama (built from a
config), with no threads and no sleeps: arrivals happen at chosen steps."""
import pytest

from engine import Engine, EngineConfig, SettingError
from engine import events as ev
from engine.broadcast import Broadcaster
from engine.kv_cache import BlockAccount
from engine.loadgen import LoadGenerator
from engine.scheduler import Scheduler
from engine.sequence import SamplingParams, Sequence
from engine.settings import make_settings, validate
from helpers import reference

PROMPTS = ["We hold these truths", "Four score and seven years ago our fathers brought forth",
           "He has refused", "When in the Course of human events, it becomes necessary for one people",
           "Liberty", "that all men are created equal, that they are endowed"]


class Run:
    """Requests added at chosen steps; every event the engine returned, in order."""

    def __init__(self, engine):
        self.engine = engine
        self.events = []
        self.ids = []

    def add(self, prompt, **kw):
        seq = self.engine.new_sequence(prompt=prompt, **kw)
        self.ids.append(seq.id)
        self.events += self.engine.add(seq)
        return seq.id

    def step(self, n=1):
        for _ in range(n):
            self.events += self.engine.step()

    def until_idle(self, limit=5000):
        for _ in range(limit):
            if not (self.engine.scheduler.running or self.engine.scheduler.waiting):
                return self
            self.step()
        raise AssertionError("engine did not go idle")

    def of(self, kind, rid=None):
        return [e for e in self.events if isinstance(e, kind) and (rid is None or e.id == rid)]

    def tokens(self, rid):
        return [e.token_id for e in self.of(ev.Token, rid)]

    def finished(self, rid):
        (fin,) = self.of(ev.Finished, rid)
        return fin


@pytest.fixture
def engine(tiny):
    return Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))


def assert_clean(engine):
    assert engine.account.used == 0
    assert engine.scheduler.slots == [None] * engine.scheduler.max_slots
    assert engine.scheduler.cache_tokens == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.in_flight == 0


@pytest.mark.parametrize("settings", [{}, {"prefill_chunk": 16}, {"kv_cache": False}],
                         ids=["kv-cache", "chunked-prefill", "no-kv-cache"])
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
    assert set(wire["stages"]) == {"tokenize", "queue", "prefill", "first_sample", "delivery", "other"}


def test_batches_really_form_and_rows_compact(engine):
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
        assert abs(stages["other"]) < 0.05 * fin.ttft + 0.005
        assert stages["prefill"] > 0
        assert fin.tpot > 0 and fin.later["decode"] > 0
    # 6 requests through 4 slots: somebody queued
    assert max(f.stages["queue"] for f in fins) > 0


def test_small_cache_budget_makes_requests_wait(engine):
    need = max(len(engine.tokenizer(p)["input_ids"]) for p in PROMPTS[:3:2]) + 20
    blocks = -(-need // 16)
    engine.apply_settings({"cache_tokens": 16 * blocks})   # room for one request at a time
    run = Run(engine)
    first, second = run.add(PROMPTS[0], max_new_tokens=20), run.add(PROMPTS[2], max_new_tokens=20)
    run.until_idle()
    steps = run.of(ev.Step)
    assert max(e.cache_blocks_used for e in steps) <= blocks
    assert max(len(e.ids) for e in steps) == 1        # never batched: the cache was full
    assert run.finished(second).stages["queue"] >= run.finished(first).e2e * 0.5
    assert_clean(engine)


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
    assert engine.account.used > 0
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


def test_uninitialised_cache_memory_cannot_leak_into_attention(tiny):
    """The store starts as torch.empty; whatever garbage it holds (here NaN) must never reach
    the logits, although attention reads a masked window wider than a short row."""
    eng = Engine(tiny, EngineConfig(slots=3, kv_tokens=2048, max_context=256))
    for t in (*eng.store.k, *eng.store.v):
        t.fill_(float("nan"))
    run = Run(eng)
    a, b = run.add(PROMPTS[3], max_new_tokens=12), run.add(PROMPTS[4], max_new_tokens=12)
    run.until_idle()
    assert run.tokens(a) == reference(tiny, PROMPTS[3], 12)
    assert run.tokens(b) == reference(tiny, PROMPTS[4], 12)


def test_a_failing_forward_fails_its_batch_not_the_engine(engine, monkeypatch):
    real_decode = engine.runner.decode
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated out of memory")
        return real_decode(*args)
    monkeypatch.setattr(engine.runner, "decode", flaky)
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
    assert stats.running == 1 and stats.queue == 2 and stats.blocked_on == "slot"
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
    assert len(fresh.get(0)) == 10                 # bounded replay history


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


def test_scheduler_says_what_the_queue_waits_for():
    def seq(i, prompt=20, new=12):
        return Sequence(id=f"r{i}", source="load", prompt="x", prompt_ids=[1] * prompt,
                        params=SamplingParams(max_new_tokens=new))
    sched = Scheduler(BlockAccount(block_size=16, num_blocks=4), max_slots=2)
    assert sched.blocked_on(True) is None                  # nobody waiting
    sched.waiting.extend([seq(1), seq(2), seq(3)])         # 32 tokens = 2 blocks each
    assert [s.id for s in sched.admit(True)] == ["r1", "r2"]
    assert sched.blocked_on(True) == "slot"                # 2 slots busy, cache full too
    sched.slot_limit = 3
    assert sched.blocked_on(True) == "cache"               # a slot is free, 4/4 blocks reserved
    sched.remove(sched.running[0])
    assert sched.blocked_on(False) == "drain"              # cache turned off: r2 must finish first
    assert sched.blocked_on(True) is None                  # fits now: admitted on the next turn
    assert [s.id for s in sched.admit(True)] == ["r3"]
