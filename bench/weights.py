"""`python -m bench.weights` (part of `make bench`): what reading the file's own 4-bit blocks buys.

Arrangements, each in a fresh process of its own, run in turn `--rounds` times (interleaved, so a
change in the machine's load hits all alike; figures are the median over rounds):

    stored        this tree: the fused Llama forward, linears and head on the 4-bit blocks
    dequantised   this tree: the fused Llama forward, linears and head on oneDNN fp32
    int8          this tree on the blocks with `activations: int8` (another arithmetic: the
                  activations rounded per block, VNNI dot products; the head stays fp32)
    transformers  this tree with FIRST_TOKEN_KERNELS=off: transformers' decoder, oneDNN fp32
                  (the path a machine without a compiler runs)
    before        `--before REV` (e.g. main): that tree's code as it was, from a temporary git
                  worktree, reading its stored blocks; `before-dequantised` the same tree on its
                  fp32 copy

Each process loads the bundled model as the server does (its load time: a warm start, the cache
made beforehand; `--first-start` also times this tree's and `--before`'s first start, into an
empty cache), reports its resident memory after start and after the timings, times a decode
step at batch 1..32 (context 128, median of 15) beside the engine's roofline estimate for it,
a whole prompt's prefill of 512 and 1024 tokens (median of 3), and profiles ten steps at batch
1 and at batch 16 (torch.profiler: the top ops by self CPU time). The processor is named in the
table and the JSON (bench/results-weights.json). `--smoke` runs one round of the smallest
configuration (batch 1 and 2, a 16-token prompt) on whatever model FIRST_TOKEN_BENCH_MODEL names
(tests/engine/test_bench.py: the tiny model), no timing verdicts.
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
PROMPTS = (512, 1024)
CONTEXT = 128
SMOKE = {"batches": (1, 2), "prompts": (16,), "repeats": 2, "profile_batches": (1,)}
FULL = {"batches": BATCHES, "prompts": PROMPTS, "repeats": 15, "profile_batches": (1, 16)}


def _load(loading):
    """The model as the server loads it: its blocks alone where this tree can (`dense=False`), or
    the model FIRST_TOKEN_BENCH_MODEL names (bench/launch.py). A tree from before either: its default."""
    import inspect
    try:
        from bench.launch import load_bundle
    except ImportError:
        return loading.load(device="cpu", dtype="float32")
    server_like = {"dense": False} if "dense" in inspect.signature(loading.load).parameters else {}
    return load_bundle(device="cpu", dtype="float32", **server_like)


def child(out, plan):
    """Runs inside the arrangement's process (its tree first on sys.path): one JSON line."""
    t0 = time.perf_counter()
    import torch
    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    # one thread: its CPU time, which other processes on a shared machine do not stretch
    clock = time.thread_time if os.environ.get("BENCH_CLOCK") == "cpu" else time.perf_counter
    try:    # engine/ in folders by job; a tree from before them: one flat folder
        from engine.model import loading
        from engine.core.engine import Engine
        from engine.timing.measure import _Synthetic
        from engine.model.runner import Segment
    except ImportError:
        from engine import model as loading
        from engine.engine import Engine
        from engine.measure import _Synthetic
        from engine.runner import Segment
    bundle = _load(loading)
    load_s = time.perf_counter() - t0
    from engine.config import EngineConfig
    # as the server builds it (a tree from before the field existed: its default)
    release = "release_model_weights" in EngineConfig.__dataclass_fields__
    eng = Engine(bundle, EngineConfig(release_model_weights=True) if release else None)
    if os.environ.get("BENCH_WEIGHTS"):
        eng.apply_settings({"weights": os.environ["BENCH_WEIGHTS"]})
    if os.environ.get("BENCH_ACTIVATIONS"):   # int8: another arithmetic (its agreement is measured as it is set)
        eng.apply_settings({"activations": os.environ["BENCH_ACTIVATIONS"]})
    runner, vocab = eng.runner, bundle.model.config.vocab_size
    # the synthetic requests take blocks from the pool (engine/timing/measure.py); a tree from before the
    # block manager handed its pool out as `eng.blocks`
    pool = getattr(eng.blocks, "pool", eng.blocks)
    rss = _rss()

    def timed(segs, repeats):
        for _ in range(min(3, repeats)):
            runner.forward(segs)
        times = []
        for _ in range(repeats):
            w0 = clock()
            runner.forward(segs)
            times.append(clock() - w0)
        return statistics.median(times)

    def predicted(segs):
        path = getattr(runner, "path", None)
        return eng.roofline.predict_segments(segs, getattr(path, "weight_bytes", None))[0] if hasattr(eng, "roofline") else None

    steps, roof, prefill = {}, {}, {}
    for batch in plan["batches"]:
        with _Synthetic(pool, vocab) as syn:
            segs = [Segment(syn.seq(CONTEXT + 1), CONTEXT, 1, cached=True, logits=True) for _ in range(batch)]
            steps[batch] = timed(segs, plan["repeats"])
            roof[batch] = predicted(segs)
    for n in plan["prompts"]:
        with _Synthetic(pool, vocab) as syn:
            segs = [Segment(syn.seq(n), 0, n, cached=True, logits=True)]
            prefill[n] = timed(segs, 3)
    profiles = {}
    for batch in plan["profile_batches"]:
        with _Synthetic(pool, vocab) as syn:
            segs = [Segment(syn.seq(CONTEXT + 1), CONTEXT, 1, cached=True, logits=True) for _ in range(batch)]
            runner.forward(segs)
            with torch.profiler.profile() as prof:
                for _ in range(10):
                    runner.forward(segs)
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        profiles[batch] = {"top": [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / 10,
                                    "calls_per_step": e.count / 10} for e in ops[:8]],
                           "total_ms": sum(e.self_cpu_time_total for e in ops) / 1e3 / 10,
                           "ops_per_step": sum(e.count for e in ops) / 10}
    path = getattr(runner, "path", None)
    out.write(json.dumps({"load_s": load_s, "rss_mb": rss / 2 ** 20, "rss_after_mb": _rss() / 2 ** 20,
                          "steps": steps, "predicted": roof, "prefill": prefill, "profiles": profiles,
                          "decode_bytes": getattr(path, "weight_bytes", None) or eng.weight_bytes,
                          "threads": torch.get_num_threads(), "clock": os.environ.get("BENCH_CLOCK", "wall")}) + "\n")


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


ARRANGEMENTS = {"stored": {"BENCH_WEIGHTS": "stored"}, "dequantised": {"BENCH_WEIGHTS": "dequantised"},
                "int8": {"BENCH_WEIGHTS": "stored", "BENCH_ACTIVATIONS": "int8"},
                "transformers": {"FIRST_TOKEN_KERNELS": "off"}}


def run_child(tree, env, smoke=False):
    """This file run as a script with `tree` first on the path: `engine` is that tree's."""
    done = subprocess.run([sys.executable, __file__, "--child"] + (["--smoke"] if smoke else []), cwd=tree,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH")))), **env}, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    from bench import machine
    ap = argparse.ArgumentParser(prog="python -m bench.weights", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--before", default=None, help="a git revision to measure as it was (a temporary worktree)")
    ap.add_argument("--first-start", action="store_true", help="also time a first start (an empty cache)")
    ap.add_argument("--only", default=",".join(ARRANGEMENTS),
                    help=f"arrangements of this tree to run, comma-separated (default: {','.join(ARRANGEMENTS)})")
    ap.add_argument("--smoke", action="store_true", help="one round of the smallest configuration (a check, not a figure)")
    ap.add_argument("--threads", type=int, default=None, help="model threads in each process (default: torch's)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="with --threads 1: time each forward by the thread's CPU time, not the wall clock "
                         "(a shared machine's other processes then do not stretch it; memory stalls still count)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-weights.json"))
    args = ap.parse_args(argv)
    if args.cpu_clock and args.threads != 1:
        ap.error("--cpu-clock needs --threads 1 (the thread's CPU time is one thread's)")
    if args.threads:
        os.environ["BENCH_THREADS"] = str(args.threads)
    if args.cpu_clock:
        os.environ["BENCH_CLOCK"] = "cpu"
    plan = SMOKE if args.smoke else FULL
    rounds = 1 if args.smoke else args.rounds
    arrangements = {name: (ROOT, ARRANGEMENTS[name]) for name in args.only.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            subprocess.run(["git", "worktree", "add", "--detach", tmp + "/before", args.before], cwd=ROOT,
                           check=True, capture_output=True)
            # the tree as it was, in both of its formats (a tree from before the setting: its one)
            arrangements["before"] = (Path(tmp) / "before", {"BENCH_WEIGHTS": "stored"})
            arrangements["before-dequantised"] = (Path(tmp) / "before", {"BENCH_WEIGHTS": "dequantised"})
        try:
            if not args.smoke:
                for tree, env in arrangements.values():     # a warm start for every arrangement's cache
                    run_child(tree, env)
            first = {}
            for name in ("stored", "before") if args.first_start else ():
                if name in arrangements:
                    with tempfile.TemporaryDirectory() as cache:
                        tree, env = arrangements[name]
                        first[name] = run_child(tree, {**env, "FIRST_TOKEN_CACHE": cache})["load_s"]
            runs = {name: [] for name in arrangements}
            for r in range(rounds):
                for name, (tree, env) in (arrangements.items() if r % 2 == 0 else reversed(arrangements.items())):
                    print(f"  .. round {r + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
                    runs[name].append(run_child(tree, env, args.smoke))
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", tmp + "/before"], cwd=ROOT)
    med = {name: _median(rs) for name, rs in runs.items()}
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "processor": machine.processor(),
              "threads": next(iter(med.values()))["threads"], "clock": "thread CPU" if args.cpu_clock else "wall",
              "load_before": os.getloadavg(), "before": args.before, "rounds": rounds, "context": CONTEXT,
              "repeats": plan["repeats"], "first_start_s": first, "median": med, "runs": runs}
    print(report(result))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwritten: {args.out}")


def _median(rs):
    """Each figure's median over the rounds (JSON keys are strings); the last round's profiles."""
    def each(key):
        return {k: (None if rs[0][key][k] is None else statistics.median(x[key][k] for x in rs)) for k in rs[0][key]}
    return {"load_s": statistics.median(x["load_s"] for x in rs), "rss_mb": statistics.median(x["rss_mb"] for x in rs),
            "rss_after_mb": statistics.median(x["rss_after_mb"] for x in rs), "steps": each("steps"),
            "predicted": each("predicted"), "prefill": each("prefill"), "decode_bytes": rs[0]["decode_bytes"],
            "profiles": rs[-1]["profiles"], "threads": rs[0]["threads"]}


def report(r):
    p = r["processor"]
    batches = list(next(iter(r["median"].values()))["steps"])
    prompts = list(next(iter(r["median"].values()))["prefill"])
    lines = ["", f"decode step (context {r['context']}, median of {r['repeats']}, median of {r['rounds']} rounds) on "
                 f"{p['model']} ({p['isa']}, {p['cores']} cores; load average before {r['load_before'][0]:.1f}), "
                 f"{r.get('threads')} model threads, {r.get('clock', 'wall')} clock, each arrangement in its own "
                 "process; x: step / the roofline's estimate (its rates measured with those threads)",
             f"{'arrangement':14s} {'MB/step':>8s} " + " ".join(f"{'b' + b:>14s}" for b in batches) +
             " " + " ".join(f"{'prefill ' + n:>13s}" for n in prompts) + f" {'RSS MB':>7s} {'after':>6s} {'load s':>7s}"]
    for name, m in r["median"].items():
        cells = []
        for b in batches:
            x = m["predicted"][b]
            cells.append(f"{1e3 * m['steps'][b]:6.1f}ms" + (f" {m['steps'][b] / x:4.1f}x" if x else "      "))
        lines.append(f"{name:14s} {m['decode_bytes'] / 1e6:8.0f} " + " ".join(f"{c:>14s}" for c in cells) + " " +
                     " ".join(f"{1e3 * m['prefill'][n]:11.0f}ms" for n in prompts) +
                     f" {m['rss_mb']:7.0f} {m['rss_after_mb']:6.0f} {m['load_s']:7.1f}")
    for name, s in r["first_start_s"].items():
        lines.append(f"first start (empty cache), {name}: {s:.1f} s")
    for name, m in r["median"].items():
        for batch, prof in m["profiles"].items():
            lines.append(f"\n{name}: batch-{batch} step profile, self CPU {prof['total_ms']:.1f} ms/step, "
                         f"{prof['ops_per_step']:.0f} ops:")
            lines += [f"  {o['op']:45s} {o['ms_per_step']:6.2f} ms  {o['calls_per_step']:5.0f} calls" for o in prof["top"]]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.stdout, SMOKE if "--smoke" in sys.argv else FULL)
    else:
        main()
