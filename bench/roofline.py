"""`python -m bench.roofline`: the roofline's predicted forward times (engine/timing/roofline.py) next
to measured ones, for decode at batch 1..16 and prefill of 64..1024 tokens, on this machine.

Both rates are measured here first (read bandwidth, best of three 2-second runs; peak matmul
rate, best of three), then the same runner timings as `python -m bench`'s tables. A forward
measured more than 2x its prediction is flagged: that is overhead the roofline does not model.
`python -m bench` prints the same columns in its tables.
"""
import argparse

from bench import tables
from bench.launch import load_bundle
from engine.timing import bandwidth
from engine.model import loading as model_mod
from engine.core.kv_cache import kv_bytes_per_token
from engine.timing.roofline import Roofline, peak_flops

PREFILL = (64, 128, 256, 512, 1024)
BATCHES = (1, 2, 4, 8, 16)
CONTEXT = 128


def measured_roofline(bundle, weight_bytes, smoke=False):
    """A Roofline with this machine's rates, each the best of three longer measurements (one short
    one each for a smoke run)."""
    runs, scale = (1, 0.1) if smoke else (3, 1.0)
    bw = max(bandwidth.read_bandwidth(bundle.device, budget_s=2.0 * scale, passes=20) for _ in range(runs))
    flops = max(peak_flops(bundle.device, bundle.dtype, budget_s=1.0 * scale, passes=10) for _ in range(runs))
    return Roofline(bundle.model, weight_bytes, kv_bytes_per_token(bundle.model.config, bundle.dtype), bw, flops)


def annotate(roof, prefill, decode, context):
    """Add `predicted_s` and `bound` to `tables.prefill_table` and `tables.decode_table` rows."""
    for row in prefill:
        row["predicted_s"], row["bound"] = roof.predict([(0, row["tokens"], True)], row.get("weight_bytes"))
    for row in decode:
        row["predicted_s"], row["bound"] = roof.predict([(context, 1, True)] * row["batch"], row.get("weight_bytes"))


def markdown(roof, prefill, decode, context):
    """The table docs/engine.md carries, and the forwards more than 2x off their prediction."""
    lines = [f"peak matmul {roof.flops_per_s / 1e9:.0f} GFLOP/s, read bandwidth {roof.bandwidth_bps / 1e9:.1f} GB/s "
             "(both measured here, estimates)", "",
             "| forward | measured ms | predicted ms | bound | measured / predicted |", "|---|---|---|---|---|"]
    rows = [(f"prefill {r['tokens']} tokens", r["s"], r) for r in prefill]
    rows += [(f"decode batch {r['batch']} (context {context})", r["step_s"], r) for r in decode]
    off = []
    for name, measured, r in rows:
        ratio = measured / r["predicted_s"]
        lines.append(f"| {name} | {1e3 * measured:.1f} | {1e3 * r['predicted_s']:.1f} | {r['bound']} | {ratio:.2f} |")
        if not 0.5 <= ratio <= 2.0:
            off.append(f"{name}: {ratio:.2f}x its prediction")
    return lines + ["", "more than 2x off: " + ("; ".join(off) if off else "none")]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.roofline", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--smoke", action="store_true", help="one prompt length and two batches (a check, not a figure)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    bundle = model_mod.load(args.model, device=args.device, dtype=args.dtype) if args.model else \
        load_bundle(device=args.device, dtype=args.dtype)
    weight_bytes = sum(t.numel() * t.element_size() for t in bundle.model.parameters())
    roof = measured_roofline(bundle, weight_bytes, args.smoke)
    prefill = tables.prefill_table(bundle, [16] if args.smoke else list(PREFILL), 1 if args.smoke else 3)
    decode = tables.decode_table(bundle, [1, 2] if args.smoke else list(BATCHES), context=CONTEXT,
                                 repeats=1 if args.smoke else 5)
    annotate(roof, prefill, decode, CONTEXT)
    print("\n".join(markdown(roof, prefill, decode, CONTEXT)))


if __name__ == "__main__":
    main()
