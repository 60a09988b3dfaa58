"""bench/candidates.py at its smallest size on the tiny model, so it cannot rot: it times both
sides and counts the bytes a page gets (no verdict on the times: they are the bench's to report)."""
from bench import candidates
from engine import Engine, EngineConfig


def test_the_candidates_bench_runs_and_counts_what_a_page_gets(tiny, capsys):
    engine = Engine(tiny, EngineConfig(slots=4, kv_tokens=2048, max_context=256))
    cost = candidates.step_cost(engine, 6, batch=2)
    assert cost["steps"] == 6 and cost["on_s"] > 0 and cost["off_s"] > 0
    assert engine.candidates() and not engine.scheduler.running      # left as it was found, idle
    sizes = candidates.viewer_bytes(engine, requests=3, new_tokens=8)
    assert sizes["tokens"] == 24 and sizes["frames"] >= 1
    lean, full = sizes["lean"], sizes["candidates"]
    assert 0 < lean["wire_per_token"] < lean["json_per_token"] < full["json_per_token"]   # deflate; top costs
    assert 0 < full["wire_per_token"] < full["json_per_token"]
    candidates.report([cost], sizes)
    assert "kB/s" in capsys.readouterr().out
