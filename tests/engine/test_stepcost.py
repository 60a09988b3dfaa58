"""The step-time target (`max_step_ms`): the scheduler cuts prompt chunks to what the measured
forwards say fits beside the decode rows. Driven on the tiny model with a clock the test
moves: each forward "costs" a known linear function of its rows and prompt tokens."""
import pytest

from engine import Engine, EngineConfig
from engine import events as ev
from engine.core.request import GenerateRequest
from engine.timing.stepcost import MIN_CHUNK, StepCost

C0, C_DECODE, C_PREFILL = 0.010, 0.002, 0.0005   # seconds: per forward, per decode row, per prompt token


def test_the_cost_model_recovers_a_linear_cost_and_answers_only_when_it_can():
    cost = StepCost()
    for _ in range(10):
        cost.observe(4, 0, C0 + 4 * C_DECODE)
    assert cost.prefill_tokens(0.04, 4) is None            # prompt tokens never varied: no answer
    for rows, tokens in ((0, 64), (4, 400), (2, 128)):
        cost.observe(rows, tokens, C0 + rows * C_DECODE + tokens * C_PREFILL)
    assert cost.coefficients() == pytest.approx((C0, C_DECODE, C_PREFILL), rel=1e-6)
    assert cost.prefill_tokens(0.040, 4) == 44                # (0.040 - 0.010 - 0.008) / 0.0005
    assert cost.prefill_tokens(0.012, 4) == MIN_CHUNK         # a prompt always progresses


def run_with_fake_costs(tiny, max_step_ms):
    """Four streams, then a 400-token prompt (the model learns), then another: its prefill events
    and every step, on a clock advanced only by the known costs."""
    engine = Engine(tiny, EngineConfig(slots=8, kv_tokens=4096, block_size=16, max_context=1024))
    now = [0.0]
    engine.clock.now = lambda: now[0]
    forward = engine.runner.forward

    def costed(segments):
        out = forward(segments)
        rows = sum(1 for s in segments if s.decode)
        now[0] += C0 + rows * C_DECODE + sum(s.n for s in segments if not s.decode) * C_PREFILL
        return out
    engine.runner.forward = costed
    engine.apply_settings({"max_step_ms": max_step_ms, "max_batched_tokens": 512})
    events = []

    def add(n_tokens, new):
        seq = engine.new_sequence(GenerateRequest(prompt=engine.loadgen.prompt(n_tokens), prompt_tokens=n_tokens,
                                                  max_new_tokens=new, ignore_eos=True))
        assert len(seq.prompt_ids) == n_tokens
        events.extend(engine.add(seq))
        return seq.id

    for _ in range(4):
        add(16, 60)
    for _ in range(6):
        events.extend(engine.step())
    add(400, 4)
    for _ in range(6):
        events.extend(engine.step())
    second = add(400, 4)
    while engine.scheduler.running or engine.scheduler.waiting:
        events.extend(engine.step())
    return events, second


@pytest.mark.slow
def test_mixed_steps_stay_under_the_target_and_the_prompt_takes_more_steps(tiny):
    events, rid = run_with_fake_costs(tiny, max_step_ms=40)
    chunks = [e.tokens for e in events if isinstance(e, ev.Prefill) and e.id == rid]
    assert sum(chunks) == 400 and max(chunks) <= 44 and len(chunks) >= 400 // 44
    after = [e for e in events if isinstance(e, ev.Step) and e.start >= min(
        p.start for p in events if isinstance(p, ev.Prefill) and p.id == rid)]
    assert after and all(s.end - s.start <= 0.040 + 1e-9 for s in after)
    (fin,) = [e for e in events if isinstance(e, ev.Finished) and e.id == rid]

    untargeted, rid0 = run_with_fake_costs(tiny, max_step_ms=0)
    chunks0 = [e.tokens for e in untargeted if isinstance(e, ev.Prefill) and e.id == rid0]
    assert chunks0 == [400]                                   # off: the whole prompt beside the streams
    longest = max(s.end - s.start for s in untargeted if isinstance(s, ev.Step))
    assert longest == pytest.approx(C0 + 4 * C_DECODE + 400 * C_PREFILL)   # the streams' step stretched to 0.218 s
    (fin0,) = [e for e in untargeted if isinstance(e, ev.Finished) and e.id == rid0]
    assert fin.ttft > fin0.ttft                               # the trade: that prompt's first token later


def test_the_engine_feeds_the_scheduler_s_cost_model_each_forward_its_step_event_reports(tiny):
    """The cost model is the engine's, handed to the scheduler when it is made, and fed every
    forward's decode and prompt tokens and measured time: the very figures its `step` event carries."""
    engine = Engine(tiny, EngineConfig(slots=4, kv_tokens=1024, block_size=16, max_context=512))
    assert engine.scheduler.step_cost is engine.step_cost
    events = []
    for n_tokens in (40, 24):
        seq = engine.new_sequence(GenerateRequest(prompt=engine.loadgen.prompt(n_tokens), prompt_tokens=n_tokens,
                                                  max_new_tokens=5, ignore_eos=True))
        events.extend(engine.add(seq))
        events.extend(engine.step())
    while engine.scheduler.running or engine.scheduler.waiting:
        events.extend(engine.step())
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert {s.kind for s in steps} == {"prefill", "mixed", "decode"}
    assert list(engine.step_cost.samples) == [(s.decode_tokens, s.prefill_tokens, s.end - s.start) for s in steps]
