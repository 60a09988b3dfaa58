"""The performance pieces: bandwidth floor in hello, the fast output head, and the bench's
equal-work contenders (on the tiny random model, so this stays quick)."""
import time

import pytest
import torch

from bench import contenders, tables
from engine import Engine, EngineConfig, bandwidth
from engine.linears import OutputHead


def test_bandwidth_measurement_is_quick_and_in_hello(tiny):
    t0 = time.perf_counter()
    bps = bandwidth.read_bandwidth("cpu", budget_s=0.5)
    assert time.perf_counter() - t0 < 1.5          # allocation + passes stop at the budget
    assert 1e8 < bps < 1e13
    hello = Engine(tiny, EngineConfig(slots=2, kv_tokens=256, max_context=128)).hello().to_dict()
    bw = hello["bandwidth"]
    assert bw["estimated"] is True and bw["gbs"] > 0
    assert bw["weight_bytes"] == hello["weight_bytes"]
    assert abs(bw["floor_s"] - bw["weight_bytes"] / (bw["gbs"] * 1e9)) / bw["floor_s"] < 0.01
    assert hello["bench"] is None                   # none handed in


def test_fast_head_matches_the_model_head(tiny):
    head = tiny.model.get_output_embeddings()
    fast = OutputHead(head)
    assert fast.fast                                # fp32 on CPU with oneDNN: the fast path
    with torch.inference_mode():
        for rows in (1, 3):
            h = torch.randn(rows, head.in_features)
            torch.testing.assert_close(fast(h), head(h), rtol=1e-5, atol=1e-4)


def test_contenders_do_equal_work_and_agree(tiny):
    batch = contenders.prompts(tiny.tokenizer, 3, 12)
    assert all(len(ids) == 12 and tiny.tokenizer(text, add_special_tokens=False)["input_ids"] == ids
               for text, ids in batch)
    eng = contenders.run_engine(tiny, batch, 6, slots=3, max_context=128)
    seq = contenders.run_sequential(tiny.model, batch, 6)
    assert eng.output_tokens == seq.output_tokens == 18
    assert eng.tokens == seq.tokens


def test_tables_have_every_row(tiny):
    pre = tables.prefill_table(tiny, [4, 16], repeats=1)
    dec = tables.decode_table(tiny, [1, 3], context=8, repeats=1)
    assert [r["tokens"] for r in pre] == [4, 16] and all(r["s"] > 0 for r in pre)
    assert [r["batch"] for r in dec] == [1, 3] and all(r["tokens_per_s"] > 0 for r in dec)


def test_the_disaggregation_bench_figures_come_from_what_its_client_saw():
    """bench/disagg.py's figures of one run: the streams' gaps, the long prompts' TTFT, tokens/s and
    goodput (both objectives met by a request's own TTFT and mean gap), from `stream` results."""
    from bench import disagg
    out = {"stream": [("a", 0.0, [0.1, 0.12, 0.14], {"completion_tokens": 3}),     # gaps 20 ms: meets both
                      ("b", 0.0, [0.1, 0.2, 0.3], {"completion_tokens": 3})],      # gaps 100 ms: misses the gap objective
           "long": [("c", 0.5, [1.0, 1.01], {"completion_tokens": 2}),             # TTFT 0.5 s, gap 10 ms: meets both
                    ("d", 0.5, [1.7], {"completion_tokens": 1})]}                  # TTFT 1.2 s: misses the TTFT objective
    f = disagg.figures(out, wall=2.0, ttft_s=0.6, tpot_s=0.05)
    assert (f["itl_p50"], f["itl_p99"]) == pytest.approx((0.1, 0.1))   # the streams' gaps only: 20, 20, 100, 100 ms
    assert f["ttft_p50"] == pytest.approx(0.5)                    # the long prompts' (0.5 and 1.2 s: bench.serve's percentile rounds half to even)
    assert f["tokens_per_s"] == pytest.approx(9 / 2.0)
    assert f["goodput"] == pytest.approx(2 / 2.0)
    point = {"prompt_tokens": 256, "rate": 2.0, "colocated": f, "disaggregated": f}
    text = disagg.report({"load": {"streams": 2, "stream_new": 3, "longs": 2, "long_new": 2, "rounds": 1,
                                   "ttft_ms": 600, "tpot_ms": 50}, "points": [point]})
    assert "cores" in text.splitlines()[0]      # the processor is named
    assert "   256    2.0  colocated" in text and "disaggregated" in text
