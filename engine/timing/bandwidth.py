"""Memory read bandwidth, measured, and the decode-step floor it implies.

A decode step at small batch reads every weight once, so its time cannot go below
weight bytes / read bandwidth. The bandwidth is measured here, not looked up: time
a reduction over a buffer much larger than any CPU cache (or on the GPU, in its own
memory), best of several passes, within a fixed time budget so it can run at start-up.
"""
import functools
import time

import torch

MIB = 2 ** 20


def read_bandwidth(device="cpu", nbytes=None, budget_s=0.5, passes=8):
    """Best-of-`passes` bytes/s of summing an `nbytes` float32 buffer; stops early at `budget_s`.

    256 MiB is far beyond a CPU's last-level cache, so every pass reads DRAM; `sum` reads
    each byte once and writes nothing, which is the access pattern of a weight read. On a
    GPU 1 GiB, so one pass lasts long enough (~0.2-1 ms) for launch overhead not to count."""
    cuda = torch.device(device).type == "cuda"
    nbytes = nbytes or (1024 if cuda else 256) * MIB
    t_start = time.perf_counter()
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)   # ones: pages really committed
    best = float("inf")
    for _ in range(passes):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        x.sum()
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - t_start + best > budget_s:   # the next pass would overrun
            break
    return x.numel() * 4 / best


@functools.lru_cache(maxsize=None)
def startup_bandwidth(device):
    """Measured once per process and device (tests build many engines; the machine stays the same)."""
    return read_bandwidth(device)


def floor(weight_bytes, device="cpu"):
    """What `hello.bandwidth` carries: measured GB/s and the implied step floor."""
    bps = startup_bandwidth(str(device))
    return {"gbs": round(bps / 1e9, 2), "weight_bytes": int(weight_bytes),
            "floor_s": weight_bytes / bps, "estimated": True}

