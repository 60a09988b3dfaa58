"""`python -m bench.weights` (part of `make bench`): what reading the file's own 4-bit blocks buys.

Arrangements, each in a fresh process of its own, run in turn `--rounds` times (interleaved, so a
change in the machine's load hits all alike; figures are the median over rounds):

    stored        this tree: the fused Llama forward, linears and head on the 4-bit blocks
    dequantised   this tree: the fused Llama forward, linears and head on oneDNN fp32
    transformers  this tree with FIRST_TOKEN_KERNELS=off: transformers' decoder, oneDNN fp32
                  (the path a machine without a compiler runs)
    before        `--before REV` (e.g. the commit before the kernels): that tree's code as it was,
                  from a temporary git worktree

Each process loads the bundled model (its load time: a warm start, the cache made beforehand;
`--first-start` also times this tree's and `--before`'s first start, into an empty cache),
reports its resident memory, times a decode step at batch 1..32 (context 128, median of 15)
and profiles ten batch-1 steps (torch.profiler: the top ops by self CPU time). The processor
is named in the table and the JSON (bench/results-weights.json).
"""
import argparse
import json
import os
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 4, 8, 16, 32)
CONTEXT = 128


def child(out):
    """Runs inside the arrangement's process (its tree first on sys.path): one JSON line."""
    t0 = time.perf_counter()
    import psutil
    import torch
    from engine import model
    from engine.engine import Engine
    from engine.measure import _Synthetic
    from engine.runner import Segment
    bundle = model.load(device="cpu", dtype="float32")
    load_s = time.perf_counter() - t0
    from engine.config import EngineConfig
    # as the server builds it (a tree from before the field existed: its default)
    release = "release_model_weights" in EngineConfig.__dataclass_fields__
    eng = Engine(bundle, EngineConfig(release_model_weights=True) if release else None)
    if os.environ.get("BENCH_WEIGHTS"):
        eng.apply_settings({"weights": os.environ["BENCH_WEIGHTS"]})
    runner, vocab = eng.runner, bundle.model.config.vocab_size
    # the synthetic requests take blocks from the pool (engine/measure.py); a tree from before the
    # block manager handed its pool out as `eng.blocks`
    pool = getattr(eng.blocks, "pool", eng.blocks)
    rss = psutil.Process().memory_info().rss
    steps = {}
    for batch in BATCHES:
        with _Synthetic(pool, vocab) as syn:
            segs = [Segment(syn.seq(CONTEXT + 1), CONTEXT, 1, cached=True, logits=True) for _ in range(batch)]
            for _ in range(3):
                runner.forward(segs)
            times = []
            for _ in range(15):
                w0 = time.perf_counter()
                runner.forward(segs)
                times.append(time.perf_counter() - w0)
            steps[batch] = statistics.median(times)
    with _Synthetic(pool, vocab) as syn:
        segs = [Segment(syn.seq(CONTEXT + 1), CONTEXT, 1, cached=True, logits=True)]
        with torch.profiler.profile() as prof:
            for _ in range(10):
                runner.forward(segs)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    top = [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / 10, "calls_per_step": e.count / 10}
           for e in ops[:8]]
    total = sum(e.self_cpu_time_total for e in ops) / 1e3 / 10
    path = getattr(runner, "path", None)
    out.write(json.dumps({"load_s": load_s, "rss_mb": rss / 2 ** 20, "steps": steps, "profile": top,
                          "profile_total_ms": total, "ops_per_step": sum(e.count for e in ops) / 10,
                          "decode_bytes": getattr(path, "weight_bytes", None) or eng.weight_bytes}) + "\n")


ARRANGEMENTS = {"stored": {"BENCH_WEIGHTS": "stored"}, "dequantised": {"BENCH_WEIGHTS": "dequantised"},
                "transformers": {"FIRST_TOKEN_KERNELS": "off"}}


def run_child(tree, env):
    """This file run as a script with `tree` first on the path: `engine` is that tree's."""
    done = subprocess.run([sys.executable, __file__, "--child"], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree), **env}, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    from bench import machine
    ap = argparse.ArgumentParser(prog="python -m bench.weights", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default=None, help="a git revision to measure as it was (a temporary worktree)")
    ap.add_argument("--first-start", action="store_true", help="also time a first start (an empty cache)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-weights.json"))
    args = ap.parse_args(argv)
    arrangements = {name: (ROOT, env) for name, env in ARRANGEMENTS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", tmp + "/before", args.before], cwd=ROOT,
                           check=True, capture_output=True)
            arrangements["before"] = (Path(tmp) / "before", {})
        try:
            for tree, env in arrangements.values():     # a warm start for every arrangement's cache
                run_child(tree, env)
            first = {}
            for name in ("stored", "before") if args.first_start else ():
                if name in arrangements:
                    with tempfile.TemporaryDirectory() as cache:
                        tree, env = arrangements[name]
                        first[name] = run_child(tree, {**env, "FIRST_TOKEN_CACHE": cache})["load_s"]
            runs = {name: [] for name in arrangements}
            for r in range(args.rounds):
                for name, (tree, env) in (arrangements.items() if r % 2 == 0 else reversed(arrangements.items())):
                    print(f"  .. round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                    runs[name].append(run_child(tree, env))
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", tmp + "/before"], cwd=ROOT)
    med = {name: {"load_s": statistics.median(x["load_s"] for x in rs),
                  "rss_mb": statistics.median(x["rss_mb"] for x in rs),
                  "steps": {b: statistics.median(x["steps"][str(b)] for x in rs) for b in BATCHES},
                  "decode_bytes": rs[0]["decode_bytes"], "profile": rs[-1]["profile"],
                  "profile_total_ms": rs[-1]["profile_total_ms"], "ops_per_step": rs[-1]["ops_per_step"]}
           for name, rs in runs.items()}
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "processor": machine.processor(),
              "before": args.before, "rounds": args.rounds, "context": CONTEXT, "first_start_s": first,
              "median": med, "runs": runs}
    print(report(result))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwritten: {args.out}")


def report(r):
    p = r["processor"]
    lines = ["", f"decode step (context {r['context']}, median of 15, median of {r['rounds']} rounds) on {p['model']} "
                 f"({p['isa']}, {p['cores']} cores), each arrangement in its own process",
             f"{'arrangement':14s} {'MB/step':>8s} " + " ".join(f"{'b' + str(b):>8s}" for b in BATCHES) +
             f" {'ops/step':>9s} {'RSS MB':>7s} {'load s':>7s}"]
    for name, m in r["median"].items():
        lines.append(f"{name:14s} {m['decode_bytes'] / 1e6:8.0f} " +
                     " ".join(f"{1e3 * m['steps'][b]:6.1f}ms" for b in BATCHES) +
                     f" {m['ops_per_step']:9.0f} {m['rss_mb']:7.0f} {m['load_s']:7.1f}")
    for name, s in r["first_start_s"].items():
        lines.append(f"first start (empty cache), {name}: {s:.1f} s")
    for name, m in r["median"].items():
        lines.append(f"\n{name}: batch-1 step profile, self CPU {m['profile_total_ms']:.1f} ms/step:")
        lines += [f"  {o['op']:45s} {o['ms_per_step']:6.2f} ms  {o['calls_per_step']:5.0f} calls" for o in m["profile"]]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child(sys.stdout)
    else:
        main()
