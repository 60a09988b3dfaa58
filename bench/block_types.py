"""`python -m bench.block_types`: each block type's batch-1 decode matvec read as stored, against
the same matrix's fp32 dequantised copy read as the engine reads it (prepacked oneDNN,
engine/model/linears.py PackedLinear).

One matrix per type (`--rows` x `--cols`, random valid blocks: engine/model/weights.py
random_blocks), one activation row, one thread (so that other processes on a shared machine
stretch both alike); the two are timed in turn, `--repeats` calls each a round, `--rounds`
rounds, and each figure is the median over rounds of the round's fastest call. The bytes each
reads and the rate that makes (bytes / time) are beside it. The processor is named
(bench/machine.py). A benchmark, not a test: no verdict.
"""
import argparse
import statistics
import time

import torch

from bench.machine import describe
from engine.model import kernels, weights
from engine.model.linears import PackedLinear

KINDS = (weights.Q4_0, weights.Q4_1, weights.Q5_0, weights.Q5_1, weights.Q8_0, weights.Q4_K, weights.Q5_K,
         weights.Q6_K, weights.F16, weights.BF16)


def fastest(f, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(kind, rows, cols, rounds, repeats):
    """(stored seconds, fp32 seconds, stored bytes, fp32 bytes) of one type's matvec."""
    w = weights.QuantWeight.from_blocks(kind, weights.random_blocks(kind, rows, cols, seed=kind))
    dense = PackedLinear(w.dequantise())
    x = torch.randn(1, cols)
    stored, fp32 = [], []
    for _ in range(rounds):
        stored.append(fastest(lambda: kernels.quant_linear(x, w), repeats))
        fp32.append(fastest(lambda: dense(x), repeats))
    return statistics.median(stored), statistics.median(fp32), w.nbytes, rows * cols * 4


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.block_types", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1536)
    p.add_argument("--cols", type=int, default=1536, help="a multiple of 256 (the K-quants' super-block)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    assert kernels.available(), kernels.describe()
    print(f"{describe()}; kernel path {kernels.status()['isa']}; one thread; "
          f"{a.rows} x {a.cols}, batch 1, median over {a.rounds} rounds of the fastest of {a.repeats}")
    print("| type | stored: bytes | stored: time | GB/s | fp32 copy: bytes | fp32 copy: time | GB/s | stored vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        s, f, sb, fb = measure(kind, a.rows, a.cols, a.rounds, a.repeats)
        print(f"| {weights.KIND_NAMES[kind]} | {sb / 1e6:.2f} MB | {s * 1e6:.0f} us | {sb / s / 1e9:.1f} "
              f"| {fb / 1e6:.2f} MB | {f * 1e6:.0f} us | {fb / f / 1e9:.1f} | {f / s:.2f}x |")


if __name__ == "__main__":
    main()
