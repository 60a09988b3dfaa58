"""The roofline (each forward's predicted time from the model's shapes and two measured rates)
and service-level objectives (each completed request met or missed; goodput), on the tiny model."""

import pytest

from engine import Engine, EngineConfig
from engine import events as ev
from engine.core.kv_cache import head_dim
from engine.core.request import GenerateRequest
from engine.timing import roofline
from engine.timing.roofline import Roofline, peak_flops
from engine.timing.stats import RollingStats
from helpers import ticking_clock


@pytest.fixture
def engine(tiny):
    return Engine(tiny, EngineConfig(slots=2, kv_tokens=1024, block_size=16, max_context=256))


def test_peak_matmul_rate_stops_at_its_budget_and_is_plausible(monkeypatch):
    assert 1e8 < peak_flops("cpu", budget_s=0.3) < 1e15
    # The budget judged on a synthetic clock (0.2 s a reading), not this machine's speed: the
    # warm-up pass (0.2 s) and the next would end past 0.3 s, so it stops after one; with room
    # for all, the warm-up and 6 passes. The best pass is what the rate is of.
    n = 1024
    for budget, passes in ((0.3, 1), (100.0, 7)):
        with monkeypatch.context() as m:
            readings = ticking_clock(m, roofline, 0.2)
            assert peak_flops("cpu", budget_s=budget) == pytest.approx(2 * n ** 3 / 0.2)
        assert len(readings) == 1 + 3 * passes      # the start, then each pass's start, end and check


def test_roofline_counts_flops_and_bytes_from_the_model_shapes(tiny):
    cfg = tiny.model.config
    h, kvh, d, layers, inter = (cfg.hidden_size, cfg.num_key_value_heads, head_dim(cfg),
                                cfg.num_hidden_layers, cfg.intermediate_size)
    # q and o (h x h), k and v (h x kv_heads*d), gate, up and down (h x intermediate), per layer
    linear = layers * (2 * h * cfg.num_attention_heads * d + 2 * h * kvh * d + 3 * h * inter)
    roof = Roofline(tiny.model, weight_bytes=1000, kv_bytes_per_token=10, bandwidth_bps=1e9, flops_per_s=1e9)
    assert roof.linear_params == linear and roof.head_params == cfg.vocab_size * h
    pair = 4 * cfg.num_attention_heads * d * layers
    # one decode token at position 9 (sees 10 positions) and a 4-token prompt chunk from position 0
    flops, nbytes = roof.cost([(9, 1, True), (0, 4, False)])
    assert flops == 2 * linear * 5 + 2 * roof.head_params * 1 + pair * (10 + (1 + 2 + 3 + 4))
    assert nbytes == 1000 + (10 + 4) * 10 + 5 * 10     # weights, KV read (positions seen), KV written
    # the slower roof bounds it
    assert roof.predict([(9, 1, True)]) == (max(roof.cost([(9, 1, True)])[0] / 1e9, 1160 / 1e9), "compute")
    fast_math = Roofline(tiny.model, weight_bytes=10**9, kv_bytes_per_token=10, bandwidth_bps=1e9, flops_per_s=1e15)
    assert fast_math.predict([(9, 1, True)])[1] == "memory"


def test_every_step_carries_its_prediction_and_hello_the_measured_rates(engine):
    hello = engine.hello().to_dict()
    roof = hello["roofline"]
    assert roof["estimated"] is True and roof["peak_gflops"] > 0 and roof["gbs"] == hello["bandwidth"]["gbs"]
    seq = engine.new_sequence(GenerateRequest(prompt="We hold these truths to be self-evident", max_new_tokens=3))
    events = engine.add(seq)
    while engine.scheduler.running or engine.scheduler.waiting:
        events += engine.step()
    steps = [e for e in events if isinstance(e, ev.Step)]
    assert len(steps) == 3
    for step in steps:
        assert step.predicted_s > 0 and step.bound in ("memory", "compute")
    # the prefill forward does more of both than a decode step: predicted longer
    assert steps[0].kind == "prefill" and steps[0].predicted_s > steps[1].predicted_s


def test_rolling_goodput_counts_met_requests_over_the_window():
    stats = RollingStats(started=100.0)
    assert stats.goodput(101.0) == (None, None)             # nothing judged yet: no figure, not zero
    for t, met in ((101.0, True), (102.0, False), (103.0, True), (104.0, True)):
        stats.slo(t, met)
    assert stats.goodput(110.0) == (3 / 10.0, 3 / 4)        # 3 met over the 10 s since counting began
    assert stats.goodput(132.5) == (2 / 30.0, 2 / 2)        # the window (30 s) keeps the last two
    assert stats.goodput(200.0) == (0.0, None)              # none in the window: 0/s, no attainment
    assert (stats.slo_met, stats.slo_judged) == (3, 4)


def test_requests_are_judged_by_their_own_measured_ttft_and_tpot(engine):
    """An engineered run on a clock the test sets: known TTFTs and gaps, known marks and goodput."""
    now = [0.0]
    engine.clock.now = lambda: now[0]
    engine.reset()                                             # counting starts at 0
    engine.apply_settings({"slo_ttft_ms": 2000, "slo_tpot_ms": 100, "slots": 1})

    def run(arrive, first_at, gap, tokens=4):
        now[0] = arrive
        seq = engine.new_sequence(GenerateRequest(prompt="Four score and seven years ago", max_new_tokens=tokens,
                                                  ignore_eos=True))
        events = engine.add(seq)
        now[0] = first_at
        while engine.scheduler.running or engine.scheduler.waiting:
            events += engine.step()
            now[0] += gap
        (fin,) = [e for e in events if isinstance(e, ev.Finished)]
        return fin

    ok = run(0.0, 0.5, 0.05)            # TTFT 0.5 s, 50 ms per token: met
    slow_first = run(10.0, 13.0, 0.05)  # TTFT 3 s: missed
    slow_later = run(20.0, 20.5, 0.2)   # 200 ms per token: missed
    assert ok.ttft == pytest.approx(0.5) and ok.tpot == pytest.approx(0.05)
    assert ok.slo == {"ttft_met": True, "tpot_met": True, "met": True, "ttft_target_s": 2.0, "tpot_target_s": 0.1}
    assert slow_first.slo["ttft_met"] is False and slow_first.slo["tpot_met"] is True and not slow_first.slo["met"]
    assert slow_later.slo["ttft_met"] is True and slow_later.slo["tpot_met"] is False and not slow_later.slo["met"]
    now[0] = 25.0
    snap = engine.timing.stats.snapshot(now[0])
    assert snap["goodput"] == pytest.approx(1 / 25.0) and snap["slo_attainment"] == pytest.approx(1 / 3)
    assert (snap["slo_met"], snap["slo_judged"]) == (1, 3)
    # a looser TPOT target applies to the next finished request, not retroactively
    engine.apply_settings({"slo_tpot_ms": 500})
    assert run(30.0, 30.5, 0.2).slo["met"] is True


def test_cancelled_requests_are_not_judged(engine):
    seq = engine.new_sequence(GenerateRequest(prompt="He has refused his Assent", max_new_tokens=8))
    events = engine.add(seq)
    events += engine.step() + engine.step()
    events += engine.cancel(seq.id)
    (fin,) = [e for e in events if isinstance(e, ev.Finished)]
    assert fin.reason == "cancelled" and fin.ttft is not None and fin.slo is None
    assert engine.timing.stats.slo_judged == 0
