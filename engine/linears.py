"""The linear layers the engine runs, and which copy of the weights they read.

Two copies of the same model stay resident when the model came from a GGUF file and the
kernels are built (engine/kernels): the file's own blocks (`stored`: Q4_1 layers and a Q8_0
head for SmolLM2, ~96 MB read per decode step) and their dequantised fp32 matrices
(`dequantised`: 538 MB a step, prepacked for oneDNN). The live `weights` setting picks one.
Reading the blocks, a forward of up to `QUANT_MAX_ROWS` token rows runs the fused 4-bit kernel;
a larger one (a prompt chunk) is compute-bound, and oneDNN's fp32 GEMM on the dequantised copy
measured faster there (docs/performance.md), so it takes that, and says so (`Path`).
"""
from copy import deepcopy
from dataclasses import dataclass

import torch

from . import kernels
from .weights import QuantWeight

# Rows up to which the fused kernel runs (decode batches, speculative verification, small
# chunks). Measured against oneDNN fp32 on SmolLM2's shapes (Intel Xeon, AVX-512, 2 threads;
# docs/performance.md): the 30 layers' linears 20.8 / 39.1 / 57.4 / 70.9 ms at 8 / 16 / 24 / 32
# rows against 53.6 / 54.0 / 59.4 / 62.6 ms; the head (Q8_0) 11.5 against 11.8 ms at 16 rows
# and 16.3 against 13.2 at 24.
QUANT_MAX_ROWS = 24
HEAD_MAX_ROWS = 16
FORMATS = ("stored", "dequantised")


@dataclass(frozen=True)
class Path:
    """What one forward's weights were read through: `weights` the format ("stored" or
    "dequantised"), `kernel` what multiplied them, `weight_bytes` the bytes of every weight it read
    (the decoder's linear layers and the head; the embedding is a row lookup)."""
    weights: str
    kernel: str
    weight_bytes: int


class Formats:
    """Which copy of the weights the linear layers read (`stored`, the live setting), and the sizes
    of each copy."""

    def __init__(self, quant, fp32_linear_bytes, fp32_head_bytes, other_bytes, dense="oneDNN fp32"):
        """`dense`: what multiplies the model's own copy (oneDNN on a CPU in fp32; else torch's)."""
        self.quant = quant if kernels.available() else {}
        self.dense = dense
        self.stored = bool(self.quant)
        self.fp32 = (fp32_linear_bytes, fp32_head_bytes)
        head = self.quant.get("lm_head.weight")
        self.q = (sum(w.nbytes for n, w in self.quant.items() if n.startswith("model.layers.")),
                  head.nbytes if head else fp32_head_bytes)
        self.other = other_bytes     # norms: read every forward in either format

    @property
    def available(self):
        return FORMATS if self.quant else FORMATS[1:]

    def path(self, tokens, logit_rows):
        """The `Path` of a forward over `tokens` rows with `logit_rows` rows of logits."""
        if not self.stored:
            return Path("dequantised", self.dense, sum(self.fp32) + self.other)
        small, head_small = tokens <= QUANT_MAX_ROWS, 0 < logit_rows <= HEAD_MAX_ROWS
        nbytes = (self.q[0] if small else self.fp32[0]) + (self.q[1] if head_small else self.fp32[1])
        kernel = f"4-bit {kernels.status()['isa']}" if small else f"{self.dense} (rows > {QUANT_MAX_ROWS})"
        return Path("stored", kernel, nbytes + self.other)

    def describe(self, bandwidth_bps):
        """What `hello.weights` carries: each format's bytes per decode step and its estimated floor."""
        out = {}
        for name in self.available:
            p = Path(name, "", (sum(self.q) if name == "stored" else sum(self.fp32)) + self.other)
            kinds = sorted({w.name for w in self.quant.values()}) if name == "stored" else ["F32"]
            out[name] = {"decode_bytes": p.weight_bytes, "floor_s": p.weight_bytes / bandwidth_bps,
                         "blocks": kinds}
        return {"formats": out, "kernel": kernels.status()["isa"], "why": kernels.status()["why"],
                "max_rows": QUANT_MAX_ROWS, "head_max_rows": HEAD_MAX_ROWS}


def _onednn_ok(linear):
    """Whether oneDNN can run this linear layer here: fp32 on a CPU with oneDNN, no bias (the
    Llama family has none). Elsewhere (GPU, bf16, MPS) the model's own modules run."""
    w = linear.weight
    return (w.device.type == "cpu" and w.dtype == torch.float32 and linear.bias is None
            and torch.backends.mkldnn.is_available())


class PackedLinear(torch.nn.Module):
    """A bias-free nn.Linear on oneDNN with its weight prepacked once.

    Measured on this 2-core AVX2 CPU over the 7 linear layers of all 30 SmolLM2-135M layers
    (fp32, median of 8, docs/performance.md): MKL's `F.linear` 31.5 / 40.8 / 43.6 / 317 ms for
    1 / 4 / 16 / 256 rows, the prepacked oneDNN kernel 21.8 / 20.3 / 26.4 / 149 ms. The packed
    copy costs the layer's bytes again; the model keeps its own weights for `generate`."""

    def __init__(self, weight):
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, None, "none", [], "")
        return y.view(*x.shape[:-1], y.shape[-1])


class QuantLinear(torch.nn.Module):
    """A linear layer that reads its blocks through the fused kernel while `formats.stored` and
    the rows are few, and its prepacked fp32 copy otherwise."""

    def __init__(self, fp32, blocks: QuantWeight, formats):
        super().__init__()
        self.fp32, self.blocks, self.formats = fp32, blocks, formats

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        if self.formats.stored and rows.shape[0] <= QUANT_MAX_ROWS:
            return kernels.quant_linear(rows, self.blocks).view(*x.shape[:-1], self.blocks.rows)
        return self.fp32(x)


def engine_decoder(decoder, formats, prefix="model."):
    """The decoder the engine runs: a copy of the module tree sharing every tensor with the
    model, its linear layers on prepacked oneDNN weights where that runs (`_onednn_ok`) and on
    their blocks too where the file stored them (`formats.quant`, keyed by the model's parameter
    names). The model itself stays as transformers made it, so `generate` (tests, the bench's
    transformers contenders) measures transformers as shipped."""
    linears = [(name, m) for name, m in decoder.named_modules() if isinstance(m, torch.nn.Linear) and _onednn_ok(m)]
    if not linears:
        return decoder
    memo = {id(t): t for t in list(decoder.parameters()) + list(decoder.buffers())}
    copy = deepcopy(decoder, memo)
    for name, m in linears:
        parent, _, attr = name.rpartition(".")
        layer = PackedLinear(m.weight)
        blocks = formats.quant.get(f"{prefix}{name}.weight")
        setattr(copy.get_submodule(parent), attr, QuantLinear(layer, blocks, formats) if blocks else layer)
    return copy


class OutputHead:
    """hidden -> vocab logits with the model's own head weights, on faster CPU kernels.

    The head is the largest single matrix (49152 x 576 for SmolLM2-135M, 16 % of a batch-1
    decode step in the profile, 21 % at batch 16). Measured on this 2-core CPU
    (fp32, cache-cold, best of 8; docs/performance.md): `F.linear` (MKL) takes ~22 ms for one
    row and ~110 ms for 16; `h @ W^T` on a contiguous transposed copy ~7 ms for one row (it
    streams the matrix) but ~110 ms for 16; oneDNN on a prepacked copy ~18 ms / ~45 ms. So:
    one row -> the transposed copy, several -> oneDNN. Each copy costs the head's bytes again
    (2 x 113 MB here). Reading the stored blocks (SmolLM2's tied embedding, Q8_0, 30 MB), the
    fused kernel takes up to `HEAD_MAX_ROWS` rows. Elsewhere (GPU, non-fp32, no oneDNN, a
    bias) the plain module is used."""

    def __init__(self, head, formats=None):
        self.head, self.formats = head, formats
        self.blocks = formats.quant.get("lm_head.weight") if formats else None
        w = head.weight.detach()
        self.fast = _onednn_ok(head)
        if self.fast:
            self.wt = w.t().contiguous()
            self.packed = PackedLinear(w)

    def __call__(self, h):
        if self.blocks is not None and self.formats.stored and h.shape[0] <= HEAD_MAX_ROWS:
            return kernels.quant_linear(h, self.blocks)
        if not self.fast:
            return self.head(h)
        if h.shape[0] == 1:
            return h @ self.wt
        return self.packed(h)
