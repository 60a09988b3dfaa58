"""The roofline: what a forward must at least cost, from the model's shapes and two rates
measured on this machine.

A forward reads bytes (every weight once, the keys/values its queries attend over, the
keys/values it writes) and does arithmetic (two flops per weight per token for the linear
layers, the output head for each row that wants logits, and attention: query·key and
weights·value for every pair a query may see). It cannot be faster than the slower of

    bytes / measured read bandwidth      (the memory roof: decode at small batch)
    flops / measured peak matmul rate    (the compute roof: prefill of long prompts)

Both rates are estimates measured at start (bandwidth.py reads a buffer far larger than the
caches; `peak_flops` times a large square matmul), so every figure here is labelled an
estimate. With int8 activations (the `activations` setting) the linear layers' multiply-adds
are integer ones: their flops go at the int8 path's measured rate (engine/model/kernels `int8_peak`,
a register-resident loop of its instructions), the head's and attention's at the fp32 rate. A forward's measured time above its prediction is overhead the roofline does not
model (Python, kernel launches, gathers of paged blocks, a kernel below peak); the page
shows both rather than hiding the difference.
"""
import functools
import time

import torch

from .bandwidth import startup_bandwidth
from ..core.kv_cache import head_dim


def peak_flops(device="cpu", dtype=torch.float32, budget_s=0.4, passes=6):
    """Best-of-`passes` flop/s of an n x n x n matmul in `dtype` on `device`, within `budget_s`.
    n = 1024 on a CPU (2 Gflop, tens of ms), 4096 on a GPU (long enough for launches not to count)."""
    cuda = torch.device(device).type == "cuda"
    n = 4096 if cuda else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t_start, best = time.perf_counter(), float("inf")
    for _ in range(passes + 1):   # the first is a warm-up (threads, allocation)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - t_start + best > budget_s:
            break
    return 2 * n ** 3 / best


@functools.lru_cache(maxsize=None)
def startup_peak_flops(device, dtype):
    """Measured once per process, device and dtype (tests build many engines)."""
    return peak_flops(device, dtype)


@functools.lru_cache(maxsize=None)
def startup_int8_rate():
    """The int8 path's rate (ops/s), measured once per process; None without the kernels."""
    from ..model import kernels
    return kernels.int8_peak(0.2) if kernels.available() else None


class Roofline:
    """Predicted forward times for one model on one machine."""

    def __init__(self, model, weight_bytes, kv_bytes_per_token, bandwidth_bps, flops_per_s, int8_ops_per_s=None):
        cfg = model.config
        head = model.get_output_embeddings()
        self.head_params = head.weight.numel()
        # Every linear layer of the decoder (attention projections, MLP); the embedding is a
        # lookup (no arithmetic) and the head is counted per row that wants logits.
        self.linear_params = sum(m.weight.numel() for m in model.get_decoder().modules()
                                 if isinstance(m, torch.nn.Linear))
        self.pair_flops = 4 * cfg.num_attention_heads * head_dim(cfg) * cfg.num_hidden_layers
        self.weight_bytes = weight_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.bandwidth_bps = bandwidth_bps
        self.flops_per_s = flops_per_s
        self.int8_ops_per_s = int8_ops_per_s
        # the linear layers' arithmetic now (the engine sets it from the `activations` setting)
        self.int8 = False

    @classmethod
    def measured(cls, model, weight_bytes, kv_bytes_per_token, device, dtype, int8=False):
        """With this machine's bandwidth and matmul rate, measured once per process (and the int8
        path's rate where `int8`: the model's blocks can be read so)."""
        return cls(model, weight_bytes, kv_bytes_per_token, startup_bandwidth(str(device)),
                   startup_peak_flops(str(device), dtype), startup_int8_rate() if int8 else None)

    def describe(self):
        """What `hello.roofline` carries (estimates, labelled)."""
        return {"peak_gflops": round(self.flops_per_s / 1e9, 1), "gbs": round(self.bandwidth_bps / 1e9, 2),
                "int8_peak_gops": self.int8_ops_per_s and round(self.int8_ops_per_s / 1e9, 1),
                "linear_params": self.linear_params, "head_params": self.head_params,
                "attention_flops_per_pair": self.pair_flops, "estimated": True}

    def cost(self, parts, weight_bytes=None):
        """(flops, bytes) of one forward over `parts`: (start, n, logits) per segment, n new
        positions from `start` on, each query seeing every earlier position of its sequence;
        `logits`: the rows of it that want logits (True: one). `weight_bytes`: what the forward's
        weights path read (engine/model/linears.py Path; the 4-bit blocks or fp32), else the model's."""
        linear, other, nbytes = self._cost(parts, weight_bytes)
        return linear + other, nbytes

    def _cost(self, parts, weight_bytes):
        """`cost` with the linear layers' flops apart: int8 activations do them at another rate."""
        tokens = sum(n for _, n, _ in parts)
        rows = sum(int(logits) for _, _, logits in parts)
        pairs = sum(n * start + n * (n + 1) // 2 for start, n, _ in parts)   # query-key pairs
        other = 2 * self.head_params * rows + self.pair_flops * pairs
        kv_read = sum(start + n for start, n, _ in parts) * self.kv_bytes_per_token
        kv_written = tokens * self.kv_bytes_per_token
        return 2 * self.linear_params * tokens, other, (weight_bytes or self.weight_bytes) + kv_read + kv_written

    def predict(self, parts, weight_bytes=None):
        """(predicted seconds, "memory" or "compute": the roof that bounds it)."""
        linear, other, nbytes = self._cost(parts, weight_bytes)
        rate = self.int8_ops_per_s if self.int8 and self.int8_ops_per_s else self.flops_per_s
        memory_s, compute_s = nbytes / self.bandwidth_bps, linear / rate + other / self.flops_per_s
        return max(memory_s, compute_s), "memory" if memory_s >= compute_s else "compute"

    def predict_segments(self, segments, weight_bytes=None):
        """`predict` for runner Segments (engine/model/runner.py); a speculating one wants logits at
        each guess too."""
        return self.predict([(s.start, s.n, (1 + len(s.draft)) * s.logits) for s in segments], weight_bytes)
