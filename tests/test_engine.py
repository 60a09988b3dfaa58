"""Engine unit tests on a tiny random Llama (built from a config; runs in seconds)."""
import time

import pytest
import torch

from engine import Engine, SettingError, control
from engine.events import Broadcaster
from engine.loadgen import LoadGenerator
from engine.settings import make_settings, validate

PROMPTS = ["We hold these truths", "Four score and seven years ago our fathers brought forth",
           "He has refused", "When in the Course of human events, it becomes necessary for one people",
           "Liberty", "that all men are created equal, that they are endowed"]


def run(engine, submissions, stagger_s=0.0, timeout=60):
    """Submit (prompt, kwargs) pairs; return {prompt index: (token ids, finished event)}."""
    handles = []
    for prompt, kw in submissions:
        handles.append(engine.submit(prompt=prompt, stream=True, **kw))
        time.sleep(stagger_s)
    out = {}
    for i, h in enumerate(handles):
        ids, end = [], None
        for item in h.outputs(timeout=timeout):
            if item[0] == "token":
                ids.append(item[2])
            else:
                end = item
        out[i] = (ids, end)
    return out


def reference(bundle, prompt, max_new):
    ids = bundle.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    out = bundle.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture
def engine(tiny):
    eng = Engine(tiny, slots=4, kv_tokens=4096, block_size=16, max_context=512).start()
    yield eng
    eng.shutdown()


def wait_idle(engine, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not engine.scheduler.running and not engine.scheduler.waiting and engine._inbox.empty():
            return
        time.sleep(0.01)
    raise AssertionError("engine did not go idle")


def assert_clean(engine):
    wait_idle(engine)
    assert engine.account.used == 0
    assert engine.scheduler.slots == [None] * engine.scheduler.max_slots
    assert engine.scheduler.cache_tokens == 0
    assert not engine._by_id


@pytest.mark.parametrize("settings", [{}, {"prefill_chunk": 16}, {"kv_cache": False}],
                         ids=["kv-cache", "chunked-prefill", "no-kv-cache"])
def test_greedy_equals_generate_with_joins_and_leaves(tiny, engine, settings):
    """Six prompts of different lengths through 4 slots, arriving at different steps, leaving
    at different steps (different max_new_tokens): each equals generate() run alone."""
    if settings:
        engine.update_settings(settings)
    subs = [(p, {"max_new_tokens": 6 + 5 * i}) for i, p in enumerate(PROMPTS)]
    got = run(engine, subs, stagger_s=0.02)
    for i, (p, kw) in enumerate(subs):
        ids, end = got[i]
        assert end[0] == "finished"
        assert ids == reference(tiny, p, kw["max_new_tokens"]), f"prompt {i} diverged"
    assert_clean(engine)


def test_batches_really_form_and_rows_compact(engine):
    sub = engine.events.subscribe(replay=False)
    run(engine, [(p, {"max_new_tokens": 4 + 6 * i}) for i, p in enumerate(PROMPTS[:4])])
    steps = [e for e in sub.get(1) if e["type"] == "step" and e["kind"] == "decode"]
    sizes = [len(e["ids"]) for e in steps]
    assert max(sizes) == 4, sizes            # all four decoded together
    assert sizes[-1] == 1                     # the longest one ends alone after others left
    assert_clean(engine)


def test_no_kv_cache_recomputes_whole_sequence(engine):
    engine.update_settings({"kv_cache": False})
    sub = engine.events.subscribe(replay=False)
    got = run(engine, [(PROMPTS[0], {"max_new_tokens": 5})])
    n_prompt = got[0][1][1]["prompt_tokens"]
    decode = [e for e in sub.get(1) if e["type"] == "step" and e["kind"] == "decode"]
    # step k recomputes prompt + k tokens: the work grows every step, and nothing is cached
    assert [e["tokens"] for e in decode] == [n_prompt + k for k in range(1, len(decode) + 1)]
    assert all(e["kv_cache"] is False and e["cache_tokens"] == 0 for e in decode)
    assert_clean(engine)


def test_stage_accounting_sums_to_ttft(engine):
    got = run(engine, [(p, {"max_new_tokens": 8}) for p in PROMPTS])
    for _, (_, (_, ev)) in got.items():
        stages = ev["stages"]
        assert set(stages) == {"tokenize", "queue", "prefill", "first_sample", "delivery", "other"}
        assert sum(stages.values()) == pytest.approx(ev["ttft"], abs=1e-9)
        assert all(v >= 0 for k, v in stages.items() if k != "other")
        assert abs(stages["other"]) < 0.05 * ev["ttft"] + 0.005
        assert stages["prefill"] > 0
        assert ev["tpot"] > 0 and ev["later"]["decode"] > 0
    # 6 requests through 4 slots: somebody queued
    assert max(ev["stages"]["queue"] for _, (_, (_, ev)) in got.items()) > 0


def test_small_cache_budget_makes_requests_wait(engine):
    sub = engine.events.subscribe(replay=False)
    need = max(len(engine.tokenizer(p)["input_ids"]) for p in PROMPTS[:3:2]) + 20
    blocks = -(-need // 16)
    engine.update_settings({"cache_tokens": 16 * blocks})   # room for one request at a time
    got = run(engine, [(PROMPTS[0], {"max_new_tokens": 20}), (PROMPTS[2], {"max_new_tokens": 20})])
    evs = sub.get(1)
    steps = [e for e in evs if e["type"] == "step"]
    assert max(e["cache_blocks_used"] for e in steps) <= blocks
    assert max(len(e["ids"]) for e in steps) == 1        # never batched: the cache was full
    second = got[1][1][1]
    assert second["stages"]["queue"] >= got[0][1][1]["e2e"] * 0.5
    assert_clean(engine)


def test_too_long_prompt_rejected_and_nothing_leaks(engine):
    h = engine.submit(prompt="truths " * 600, max_new_tokens=10, stream=True)
    items = list(h.outputs(timeout=10))
    assert items[-1][0] == "rejected" and "context" in items[-1][1]
    ok = run(engine, [(PROMPTS[0], {"max_new_tokens": 3})])
    assert ok[0][1][0] == "finished"
    assert_clean(engine)


def test_cancel_frees_slot_and_blocks(engine):
    h = engine.submit(prompt=PROMPTS[1], max_new_tokens=400, stream=True)
    for item in h.outputs(timeout=10):
        if item[0] == "token":
            engine.cancel(h.id)
        if item[0] == "finished":
            assert item[1]["reason"] == "cancelled"
    assert_clean(engine)


def test_seeded_sampling_is_reproducible(engine):
    kw = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9}
    a = run(engine, [(PROMPTS[0], {**kw, "seed": 7}), (PROMPTS[0], {**kw, "seed": 7}),
                     (PROMPTS[0], {**kw, "seed": 8})])
    assert a[0][0] == a[1][0]
    assert a[0][0] != a[2][0]


def test_stop_string(engine, tiny):
    ref = reference(tiny, PROMPTS[3], 20)
    text = tiny.tokenizer.decode(ref, skip_special_tokens=True)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    got = run(engine, [(PROMPTS[3], {"max_new_tokens": 20, "stop": [stop]})])
    assert got[0][1][1]["reason"] == "stop_string"
    assert len(got[0][0]) < len(ref) or ref[-1] in engine.eos


@pytest.mark.parametrize("bad,field", [
    ({"slots": 0}, "slots"), ({"slots": "4"}, "slots"), ({"slots": 2.5}, "slots"), ({"nope": 1}, "nope"),
    ({"rate": float("nan")}, "rate"), ({"kv_cache": 1}, "kv_cache"), ({"prefill_chunk": 8}, "prefill_chunk"),
    ({"rate": 1.0, "slots": 99}, "slots"), ({}, "settings"), ([], "settings")])
def test_bad_settings_change_nothing(engine, bad, field):
    before = dict(engine.settings)
    with pytest.raises(SettingError) as e:
        engine.update_settings(bad)
    assert e.value.field == field
    time.sleep(0.05)
    assert engine.settings == before


@pytest.mark.parametrize("raw,field", [
    ("not json", "message"), ("[1,2]", "message"), (b"\x00", "message"), ('{"type":"fly"}', "type"),
    ('{"type":"submit"}', "prompt"), ('{"type":"submit","prompt":""}', "prompt"),
    ('{"type":"submit","prompt":"hi","max_new_tokens":-1}', "max_new_tokens"),
    ('{"type":"submit","prompt":"hi","temperature":"hot"}', "temperature"),
    ('{"type":"submit","prompt":"hi","chat":"yes"}', "chat"),
    ('{"type":"burst","n":1000}', "n"), ('{"type":"load","on":"yes"}', "load"),
    ('{"type":"sync","client_t":"x"}', "client_t"), ("x" * 300_000, "message")])
def test_bad_control_messages_get_named_errors(engine, raw, field):
    replies = control.handle(engine, raw)
    assert [r["type"] for r in replies] == ["error"]
    assert replies[0]["field"] == field
    assert_clean(engine)


def test_control_submit_and_sync(engine):
    sub = engine.events.subscribe(replay=False)
    assert control.handle(engine, '{"type":"submit","prompt":"<script>x</script>","max_new_tokens":2}') == []
    reply = control.handle(engine, '{"type":"sync","client_t":12.5}')
    assert reply[0]["type"] == "sync" and reply[0]["client_t"] == 12.5
    wait_idle(engine)
    evs = sub.get(1)
    req = next(e for e in evs if e["type"] == "request")
    assert req["source"] == "page" and "<script>" in req["preview"]


def test_settings_event_broadcast_and_load_generator(engine):
    sub = engine.events.subscribe(replay=False)
    engine.update_settings({"prompt_tokens": 48, "max_new_tokens": 2, "rate": 16.0, "load": True})
    time.sleep(1.0)
    engine.update_settings({"load": False})
    wait_idle(engine, 30)
    evs = sub.get(1)
    assert any(e["type"] == "settings" and "rate" in e["changed"] for e in evs)
    reqs = [e for e in evs if e["type"] == "request"]
    assert 4 <= len(reqs) <= 40                    # Poisson at 16/s for ~1 s
    assert all(e["source"] == "load" and e["prompt_tokens"] == 48 for e in reqs)
    assert_clean(engine)


def test_burst_and_reset(engine):
    engine.update_settings({"max_new_tokens": 200})
    sub = engine.events.subscribe(replay=False)
    engine.burst(10)
    time.sleep(0.3)
    engine.reset()
    assert_clean(engine)
    evs = sub.get(1)
    fins = [e for e in evs if e["type"] == "finished"]
    assert len(fins) == 10 and all(e["reason"] in ("cancelled", "length", "stop") for e in fins)
    assert any(e["type"] == "reset" for e in evs)


def test_slow_subscriber_drops_without_blocking():
    b = Broadcaster(history=10, per_client=20)
    slow = b.subscribe()
    t0 = time.perf_counter()
    for i in range(1000):
        b.publish({"type": "x", "t": float(i)})
    assert time.perf_counter() - t0 < 1.0
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


def test_uninitialised_cache_memory_cannot_leak_into_attention(tiny):
    """The store starts as torch.empty; whatever garbage it holds (here NaN) must never reach
    the logits, although attention reads a masked window wider than a short row."""
    eng = Engine(tiny, slots=3, kv_tokens=2048, max_context=256)
    for t in (*eng.store.k, *eng.store.v):
        t.fill_(float("nan"))
    eng.start()
    try:
        subs = [(PROMPTS[3], {"max_new_tokens": 12}), (PROMPTS[4], {"max_new_tokens": 12})]
        got = run(eng, subs)
        for i, (p, kw) in enumerate(subs):
            assert got[i][0] == reference(tiny, p, kw["max_new_tokens"])
    finally:
        eng.shutdown()


def test_a_failing_forward_fails_its_batch_not_the_engine(engine, monkeypatch):
    sub = engine.events.subscribe(replay=False)
    real_decode = engine.runner.decode
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated out of memory")
        return real_decode(*args)
    monkeypatch.setattr(engine.runner, "decode", flaky)
    bad = run(engine, [(PROMPTS[0], {"max_new_tokens": 10})])
    assert bad[0][1][1]["reason"] == "error"
    assert any(e["type"] == "error" and "simulated out of memory" in e["message"] for e in sub.get(1))
    assert_clean(engine)
    good = run(engine, [(PROMPTS[0], {"max_new_tokens": 3})])   # the engine still serves
    assert good[0][1][1]["reason"] in ("length", "stop")


def test_scheduler_says_what_the_queue_waits_for():
    from engine.kv_cache import BlockAccount
    from engine.scheduler import Scheduler
    from engine.sequence import SamplingParams, Sequence

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
