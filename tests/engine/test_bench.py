"""The performance pieces: bandwidth floor in hello, the fast output head, and the bench's
equal-work contenders (on the tiny random model, so this stays quick)."""

import pytest
import torch

from bench import contenders, tables
from engine import Engine, EngineConfig
from engine.timing import bandwidth
from engine.model.linears import OutputHead
from helpers import ticking_clock


def test_bandwidth_measurement_stops_at_its_budget_and_is_in_hello(tiny, monkeypatch):
    bps = bandwidth.read_bandwidth("cpu", nbytes=64 * bandwidth.MIB, budget_s=0.5)
    assert 1e8 < bps < 1e13
    # The budget judged on a synthetic clock (0.2 s a reading), not this machine's speed: one pass
    # (0.2 s) and the next would end past 0.5 s, so it stops; with room for all, 8 passes.
    for budget, passes in ((0.5, 1), (100.0, 8)):
        with monkeypatch.context() as m:
            readings = ticking_clock(m, bandwidth, 0.2)
            assert bandwidth.read_bandwidth("cpu", nbytes=bandwidth.MIB, budget_s=budget) == \
                pytest.approx(bandwidth.MIB / 0.2)
        assert len(readings) == 1 + 3 * passes      # the start, then each pass's start, end and check
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


# ---- every bench module, its smallest configuration on the tiny model (the benchmarks cannot rot) ----
# Each runs as `make bench` runs it (python -m bench.NAME, its own process), on the tiny random model:
# saved as a model directory for the benches that start app.py or load a model (FIRST_TOKEN_BENCH_MODEL,
# bench/launch.py), as its Q4_1 blocks in process for bench.weights. Only that it runs to the end and
# writes its figures is checked: no timing verdicts. The modules with no command of their own
# (contenders, tables, launch, machine, coldstart, vs_reference) run inside these.
import json as _json
import os as _os
import shutil as _shutil
import subprocess as _subprocess
import sys as _sys

from helpers import ROOT


def bench(module, *args, model=None, timeout=300, env=None):
    """`python -m MODULE ARGS` on the tiny model; its output (it must exit 0)."""
    env = {**_os.environ, **(env or {}), "PYTHONPATH": _os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    if model is not None:
        env["FIRST_TOKEN_BENCH_MODEL"] = str(model)
    done = _subprocess.run([_sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=env)
    assert done.returncode == 0, f"{module} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def written(path):
    return _json.loads(path.read_text())


REFERENCE = _shutil.which("llama-server") or str(__import__("pathlib").Path.home() / ".cache" / "first-token" /
                                                 "reference" / "llama.cpp" / "llama-server")


@pytest.mark.slow
def test_bench_main_smoke(tiny_dir, tmp_path):
    out = tmp_path / "r.json"
    bench("bench", "--smoke", "--out", str(out), model=tiny_dir)
    r = written(out)
    assert [row["batch"] for row in r["decode"]] == [1, 2] and r["cold_start"].get("second_start_s")


@pytest.mark.slow
def test_bench_roofline_and_first_shape_smoke(tiny_dir):
    assert "| decode batch 2" in bench("bench.roofline", "--smoke", model=tiny_dir)
    assert "seen before (control)" in bench("bench.first_shape", "--rounds", "1", model=tiny_dir)


@pytest.mark.slow
def test_bench_weights_smoke(tmp_path):
    out = tmp_path / "w.json"
    text = bench("bench.weights", "--smoke", "--only", "stored,dequantised", "--out", str(out),
                 model="helpers:tiny_quant_bundle")
    r = written(out)
    assert set(r["median"]) == {"stored", "dequantised"} and "batch-1 step profile" in text
    assert all(m["predicted"]["1"] > 0 and m["rss_mb"] > 0 for m in r["median"].values())


@pytest.mark.slow
def test_bench_serve_and_speculative_smoke(tiny_dir, tmp_path):
    bench("bench.serve", "--smoke", "--out", str(tmp_path / "s.json"), model=tiny_dir)
    assert written(tmp_path / "s.json")["L2"]["tokens_per_s"] > 0
    bench("bench.speculative", "--smoke", "--out", str(tmp_path / "p.json"), model=tiny_dir)
    assert written(tmp_path / "p.json")["results"]


@pytest.mark.slow
def test_bench_disagg_smoke(tiny_dir, tmp_path):
    bench("bench.disagg", "--rounds", "1", "--streams", "1", "--stream-new", "4", "--longs", "1", "--long-new", "2",
          "--prompts", "16", "--rates", "2", "--out", str(tmp_path / "d.json"), model=tiny_dir)
    assert written(tmp_path / "d.json")["points"]


@pytest.mark.slow
def test_bench_soak_and_page_fps_smoke(tiny_dir, tmp_path):
    bench("bench.soak", "--minutes", "0.05", "--clients", "1", "--out", str(tmp_path / "soak.json"), model=tiny_dir)
    assert written(tmp_path / "soak.json")["rss_mb"]["start"] > 0
    assert "fps" in bench("bench.page_fps", "--seconds", "1", "--rows", "2", model=tiny_dir)


@pytest.mark.slow
def test_bench_load_phases_smoke(tmp_path):
    import tiny_gguf
    path = tiny_gguf.write(tmp_path / "tiny.gguf", "llama")
    out = bench("bench.load_phases", "--model", str(path), "--cache", str(tmp_path / "cache"))
    assert "(first start, " in out and "(config and tokenizer from the cache, " in out
    assert out.count("until: ready") == 2


@pytest.mark.slow
def test_bench_gpu_check_and_reference_path():
    """gpu_check on a machine without CUDA says so and stops; bench.reference names its binary."""
    import torch
    out = bench("bench.gpu_check")
    assert ("no CUDA device" in out) != torch.cuda.is_available()
    if _os.path.exists(REFERENCE):
        assert bench("bench.reference", "--path").strip().endswith("llama-server")


@pytest.mark.slow
@pytest.mark.skipif(not _os.path.exists(REFERENCE), reason="llama.cpp's llama-server is not built here "
                    "(python -m bench.reference --build): the benches against it need it and a GGUF")
def test_bench_against_llamacpp_smoke(tmp_path):
    """The two benches that run llama.cpp itself (a GGUF, so the bundled model, not the tiny one)."""
    bench("bench.observe_llamacpp", "--smoke", "--out", str(tmp_path / "o.json"), "--shot", str(tmp_path / "o.png"))
    assert written(tmp_path / "o.json")["finished"] >= 1
    bench("bench.serve", "--reference", "--smoke", "--rounds", "1", "--threads", "1", "--out", str(tmp_path / "v.json"),
          timeout=600)
    assert written(tmp_path / "v.json")
