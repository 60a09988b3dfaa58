"""`python -m bench`: measured throughput, step times and start-up, printed and saved as JSON.

Everything runs in one process on the bundled model (or `--model`), on the same prompts:
our engine at batch 1 and batch 16, transformers' `generate_batch`, sequential `generate`,
events on vs off, the decode step against the memory-bandwidth floor, prefill vs prompt
length, decode step vs batch size, and the start-up time of `python app.py`.
`--quick` is a short run (fewer requests and tokens, shorter tables) for a smoke check.
"""
import argparse
import datetime
import json
import os
from pathlib import Path
import platform
import sys
import time

import torch

from bench import coldstart, contenders, roofline, tables
from bench.launch import load_bundle
from engine.model import loading as model_mod

ROOT = Path(__file__).resolve().parents[1]

TARGETS = {"vs_generate_batch": 1.5, "vs_sequential": 4.0, "floor_ratio": 1.5, "events_cost": 0.03,
           "second_start_s": 10.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (~2 min): fewer requests, tokens, table rows")
    p.add_argument("--model", default=None, help="model directory or .gguf (default: the bundled GGUF, "
                                                 "or FIRST_TOKEN_BENCH_MODEL: bench/launch.py)")
    p.add_argument("--smoke", action="store_true", help="the smallest configuration (a check, not a figure)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--first-start", action="store_true",
                   help="also time a first start (GGUF dequantised into a temporary cache, ~1 min)")
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers contenders (engine only)")
    p.add_argument("--batches", default=None, help="decode-table batch sizes, e.g. 1,4,16,64 (default: the plan's)")
    p.add_argument("--prefill", default=None, help="prefill-table prompt lengths, e.g. 16,128,512 (default: the plan's)")
    p.add_argument("--out", default=None, help="JSON file to write (default bench/results-<device>.json)")
    return p.parse_args(argv)


def plan(quick, smoke=False):
    if smoke:                       # the smallest configuration (tests/engine/test_bench.py): a check, not a figure
        return dict(requests=2, prompt=16, new=4, prefill=[16], batches=[1, 2], repeats=1, events_runs=1, kv_read=[16])
    if quick:
        return dict(requests=8, prompt=64, new=16, prefill=[16, 128, 512], batches=[1, 4, 16],
                    repeats=2, events_runs=1, kv_read=[128, 1024])
    return dict(requests=16, prompt=64, new=64, prefill=[16, 64, 256, 1024, 2048],
                batches=[1, 2, 4, 8, 16, 32], repeats=3, events_runs=2, kv_read=[128, 512, 2048])


def log(msg):
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def throughput(bundle, p, skip_hf):
    batch = contenders.prompts(bundle.tokenizer, p["requests"], p["prompt"])
    n = p["requests"]
    runs = {}
    log(f"engine, batch {n}: {n} requests x {p['new']} tokens")
    runs["engine_batch"] = contenders.run_engine(bundle, batch, p["new"], slots=n)
    log("engine, batch 1")
    runs["engine_b1"] = contenders.run_engine(bundle, batch, p["new"], slots=1)
    # Events on/off: alternate, best of N each, so drift in machine load hits both alike.
    on, off = [runs["engine_batch"]], []
    for i in range(p["events_runs"]):
        log(f"engine, batch {n}, events off ({i + 1}/{p['events_runs']})")
        off.append(contenders.run_engine(bundle, batch, p["new"], slots=n, events=False))
        if i + 1 < p["events_runs"]:
            on.append(contenders.run_engine(bundle, batch, p["new"], slots=n))
    runs["engine_batch"] = max(on, key=lambda r: r.tokens_per_s)
    runs["engine_batch_events_off"] = max(off, key=lambda r: r.tokens_per_s)
    if not skip_hf:
        log("model.generate_batch")
        try:
            runs["generate_batch"] = contenders.run_generate_batch(bundle.model, batch, p["new"])
        except Exception as e:  # reported, not fatal: the brief asks why it fails if it does
            runs["generate_batch"] = contenders.Result("model.generate_batch", float("nan"), 0,
                                                       note=f"failed: {type(e).__name__}: {e}")
        log("model.generate, sequential")
        runs["sequential"] = contenders.run_sequential(bundle.model, batch, p["new"])
    return runs


def agreement(runs):
    """How many prompts got identical tokens from every contender that produced tokens."""
    outs = [r.tokens for r in runs.values() if r.tokens]
    return sum(all(o[i] == outs[0][i] for o in outs) for i in range(len(outs[0]))), len(outs[0])


def main(argv=None):
    args = parse_args(argv)
    p = plan(args.quick, args.smoke)
    for key in ("batches", "prefill"):
        if getattr(args, key):
            p[key] = [int(x) for x in getattr(args, key).split(",")]
    t_start = time.perf_counter()
    bundle = model_mod.load(args.model, device=args.device, dtype=args.dtype) if args.model else \
        load_bundle(device=args.device, dtype=args.dtype)
    model_bytes = sum(t.numel() * t.element_size() for t in bundle.model.parameters())
    log(f"{bundle.name} on {bundle.device}, {torch.get_num_threads()} threads")

    log("memory read bandwidth and peak matmul rate")
    roof = roofline.measured_roofline(bundle, model_bytes, args.smoke)
    bw = roof.bandwidth_bps

    runs = throughput(bundle, p, args.skip_hf)
    log("prefill vs prompt length")
    prefill = tables.prefill_table(bundle, p["prefill"], p["repeats"])
    log("decode step vs batch size")
    decode = tables.decode_table(bundle, p["batches"], context=p["prompt"] + p["new"] // 2, repeats=p["repeats"] + 2)
    roofline.annotate(roof, prefill, decode, p["prompt"] + p["new"] // 2)
    weight_bytes = decode[0]["weight_bytes"]       # what a decode step read (the blocks, where the model has them)
    floor_s = weight_bytes / bw
    log("paged vs contiguous KV reads")
    kv_read = tables.kv_read_table(bundle, 16, p["kv_read"], p["repeats"] + 2)
    log("cold start of app.py" + (" (first and second)" if args.first_start else ""))
    try:
        start = coldstart.measure(args.first_start)
    except RuntimeError as e:
        start = {"first_start_s": None, "second_start_s": None, "error": str(e)}

    tps = {k: r.tokens_per_s for k, r in runs.items()}
    gb = runs.get("generate_batch")
    gb_steady = gb.tokens_per_s_after_setup if gb and gb.output_tokens else None
    same, total = agreement(runs)
    step1 = decode[0]["step_s"]
    result = {
        "version": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "model": bundle.name, "device": bundle.device, "dtype": bundle.dtype_name,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "cores": os.cpu_count(), "torch": torch.__version__},
        "workload": {"requests": p["requests"], "prompt_tokens": p["prompt"], "new_tokens": p["new"],
                     "greedy": True, "eos": "ignored"},
        "bandwidth": {"gbs": bw / 1e9, "weight_bytes": weight_bytes, "floor_s": floor_s,
                      "step_s_batch1": step1, "ratio": step1 / floor_s},
        "roofline": roof.describe(),
        "throughput": {k: {"label": r.name, "tokens_per_s": r.tokens_per_s, "seconds": r.seconds,
                           "output_tokens": r.output_tokens, "setup_s": r.setup_s, "note": r.note}
                       for k, r in runs.items()},
        "ratios": {
            # judged against generate_batch without its one-off setup (the stricter comparison)
            "vs_generate_batch": tps["engine_batch"] / gb_steady if gb_steady else None,
            "vs_generate_batch_whole_call": tps["engine_batch"] / tps["generate_batch"] if gb_steady else None,
            "vs_sequential": tps["engine_batch"] / tps["sequential"] if "sequential" in tps else None,
            "batch_vs_batch1": tps["engine_batch"] / tps["engine_b1"],
        },
        "events_cost": 1 - tps["engine_batch"] / tps["engine_batch_events_off"],
        # the same cost measured directly, immune to load noise: CPU spent on events / run time
        "events_cpu_share": runs["engine_batch"].events_cpu_s / runs["engine_batch"].seconds,
        "identical_outputs": {"prompts": total, "identical": same},
        "prefill": prefill,
        "decode": decode,
        "decode_context": p["prompt"] + p["new"] // 2,
        "kv_read": kv_read,
        "cold_start": start,
        "targets": TARGETS,
        "bench_s": time.perf_counter() - t_start,
    }
    print(report(result))
    out = Path(args.out) if args.out else ROOT / "bench" / f"results-{bundle.device}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwritten: {out}")


def _mark(value, target, higher_is_better):
    if value is None or value != value:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return ("met" if ok else "MISSED") + f" (target {'>=' if higher_is_better else '<='} {target:g})"


def report(r):
    w, bw = r["workload"], r["bandwidth"]
    lines = [f"First Token bench — {r['model']} on {r['device']} ({r['dtype']}, {r['machine']['threads']} threads)"
             f"{'  [--quick]' if r['quick'] else ''}",
             f"workload: {w['requests']} requests x {w['prompt_tokens']} prompt tokens -> {w['new_tokens']} new "
             f"tokens each, greedy, EOS ignored", "",
             f"{'contender':34s} {'tokens/s':>9s} {'seconds':>8s} {'tokens':>7s}  note"]
    for res in r["throughput"].values():
        lines.append(f"{res['label']:34s} {res['tokens_per_s']:9.1f} {res['seconds']:8.1f} "
                     f"{res['output_tokens']:7d}  {res['note']}")
    ra, t = r["ratios"], r["targets"]
    lines += ["", f"identical tokens across contenders: {r['identical_outputs']['identical']}/"
                  f"{r['identical_outputs']['prompts']} prompts", ""]
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
    n = w["requests"]
    lines.append(f"{f'engine b{n} / generate_batch (after its setup)':46s} {fmt(ra['vs_generate_batch']):>7s}   "
                 f"{_mark(ra['vs_generate_batch'], t['vs_generate_batch'], True)}")
    lines.append(f"{f'engine b{n} / generate_batch (whole call)':46s} {fmt(ra['vs_generate_batch_whole_call']):>7s}")
    lines.append(f"{f'engine b{n} / sequential generate':46s} {fmt(ra['vs_sequential']):>7s}   "
                 f"{_mark(ra['vs_sequential'], t['vs_sequential'], True)}")
    lines.append(f"{f'engine b{n} / engine b1':46s} {fmt(ra['batch_vs_batch1']):>7s}")
    lines.append(f"events on vs off: throughput cost {100 * r['events_cost']:.1f}% (noisy); CPU spent on events "
                 f"{100 * r['events_cpu_share']:.1f}% of the run   {_mark(r['events_cpu_share'], t['events_cost'], False)}")
    lines += ["", f"memory read bandwidth (best of N, 256 MiB sum): {bw['gbs']:.1f} GB/s",
              f"weights read per decode step: {bw['weight_bytes'] / 1e6:.0f} MB -> floor {1e3 * bw['floor_s']:.1f} ms",
              f"decode step at batch 1: {1e3 * bw['step_s_batch1']:.1f} ms = {bw['ratio']:.2f}x the floor   "
              f"{_mark(bw['ratio'], t['floor_ratio'], False)}", "",
              f"peak matmul rate (best of N, 1024^3): {r['roofline']['peak_gflops']:.0f} GFLOP/s; "
              "x roof = measured / the roofline's prediction (estimates)", "",
              f"prefill (one prompt)                decode step (context {r['decode_context']})",
              f"{'tokens':>7s} {'ms':>9s} {'ms/tok':>7s} {'x roof':>7s}    {'batch':>5s} {'ms':>8s} {'tok/s':>7s} "
              f"{'x floor':>7s} {'x roof':>7s}"]
    pre, dec = r["prefill"], r["decode"]
    for i in range(max(len(pre), len(dec))):
        left = (f"{pre[i]['tokens']:7d} {1e3 * pre[i]['s']:9.1f} {pre[i]['ms_per_token']:7.2f} "
                f"{pre[i]['s'] / pre[i]['predicted_s']:7.2f}" if i < len(pre) else " " * 33)
        right = (f"{dec[i]['batch']:5d} {1e3 * dec[i]['step_s']:8.1f} {dec[i]['tokens_per_s']:7.1f} "
                 f"{dec[i]['step_s'] / bw['floor_s']:7.2f} {dec[i]['step_s'] / dec[i]['predicted_s']:7.2f}"
                 if i < len(dec) else "")
        lines.append(f"{left}    {right}")
    lines += ["", "decode attention, all layers, batch 16: keys/values gathered from paged blocks vs contiguous rows"]
    for k in r["kv_read"]:
        lines.append(f"  context {k['context']:5d}: paged {1e3 * k['paged_s']:7.1f} ms, contiguous "
                     f"{1e3 * k['contiguous_s']:7.1f} ms ({k['paged_s'] / k['contiguous_s']:.2f}x)")
    cs = r["cold_start"]
    lines.append("")
    if cs.get("error"):
        lines.append(f"cold start: failed: {cs['error']}")
    else:
        first = "not measured (use --first-start)" if cs["first_start_s"] is None else f"{cs['first_start_s']:.1f} s"
        lines.append(f"start of app.py to /healthz ok: second start {cs['second_start_s']:.1f} s   "
                     f"{_mark(cs['second_start_s'], t['second_start_s'], False)}; first start {first}")
    lines.append(f"bench wall time: {r['bench_s']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
