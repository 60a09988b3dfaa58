"""The linear layers the engine runs, and which copy of the weights they read.

Where the model came from a GGUF file and the kernels are built (engine/model/kernels), the engine
keeps the file's own blocks (`stored`: Q4_1 layers and a Q8_0 head for SmolLM2, ~97 MB read a
decode step) and reads them through the 4-bit kernel at every row count: decode batches,
verification rows and prompt chunks alike. The fp32 matrices they mean (`dequantised`: 538 MB a
step, prepacked for oneDNN) exist only while the live `weights` setting asks for them: made from
the blocks when it is switched to `dequantised` (the time it took is said in the `settings`
event), freed when it is switched back. A model without blocks has only its own fp32 copy.
The `activations` setting picks the stored layers' arithmetic: fp32 activations (the default:
results equal fp32 matmul on the dequantised weights) or int8 ones, rounded as llama.cpp rounds
them, with integer dot products (engine/model/kernels `quant_linear_int8`; Q4_1 layers, the head keeps fp32).
"""
from dataclasses import dataclass
import time

import torch

from . import kernels
from ..timing.memory import return_freed_memory
from .weights import Q4_1

FORMATS = ("stored", "dequantised")


@dataclass(frozen=True)
class Path:
    """What one forward's weights were read through: `weights` the format ("stored" or
    "dequantised"), `kernel` what multiplied them, `weight_bytes` the bytes of every weight it read
    (the decoder's linear layers and the head; the embedding is a row lookup)."""
    weights: str
    kernel: str
    weight_bytes: int
    int8: bool = False           # the 4-bit layers multiplied int8 activations (`activations`)


class Formats:
    """Which copy of the weights the linear layers read (`stored`, the live setting), the sizes of
    each copy, and the fp32 copy made on demand: every layer that has blocks registers here
    (`layers`) and makes or frees its fp32 copy when `use` says."""

    def __init__(self, quant, fp32_linear_bytes, fp32_head_bytes, other_bytes, dense="oneDNN fp32"):
        """`dense`: what multiplies the fp32 copy (oneDNN on a CPU in fp32; else torch's)."""
        self.quant = quant if kernels.available() else {}
        self.dense = dense
        self.stored = bool(self.quant)
        self.fp32 = (fp32_linear_bytes, fp32_head_bytes)
        head = self.quant.get("lm_head.weight")
        self.q = (sum(w.nbytes for n, w in self.quant.items() if n.startswith("model.layers.")),
                  head.nbytes if head else fp32_head_bytes)
        self.other = other_bytes     # norms: read every forward in either format
        self.layers = []             # QuantLinear / OutputHead with blocks: their fp32 copies on demand
        self.made_s = None           # how long the fp32 copy took to make, the last time it was made
        self.int8 = False            # the `activations` setting is int8 (read while `stored`)

    @property
    def activations(self):
        """The `activations` choices: int8 only where there are Q4_1 blocks to read so."""
        return ("fp32", "int8") if any(w.kind == Q4_1 for w in self.quant.values()) else ("fp32",)

    @property
    def available(self):
        return FORMATS if self.quant else FORMATS[1:]

    @property
    def fp32_resident(self):
        """Whether an fp32 copy of the weights is in memory now (always, for a model without blocks)."""
        return not self.quant or any(layer.fp32 is not None for layer in self.layers)

    def use(self, fmt):
        """Read `fmt` from the next forward on. Switching to `dequantised` makes the fp32 copy from
        the blocks (returns the seconds it took); switching to `stored` frees it (returns None)."""
        stored = fmt == "stored" and bool(self.quant)
        made = None
        if not stored and self.quant and not self.fp32_resident:
            t0 = time.perf_counter()
            for layer in self.layers:
                layer.make_fp32()
            made = self.made_s = time.perf_counter() - t0
        elif stored and self.quant and self.fp32_resident:
            for layer in self.layers:
                layer.fp32 = None
            return_freed_memory()
        self.stored = stored
        return made

    def path(self, tokens, logit_rows):
        """The `Path` of a forward over `tokens` rows with `logit_rows` rows of logits."""
        head = 1 if logit_rows > 0 else 0
        if not self.stored:
            return Path("dequantised", self.dense, self.fp32[0] + head * self.fp32[1] + self.other)
        kernel = self.kernel_name()
        if self.int8:
            kernel += f", int8 activations ({kernels.int8_path()})"
        return Path("stored", kernel, self.q[0] + head * self.q[1] + self.other, self.int8)

    def kernel_name(self):
        """What multiplies the stored blocks, named by their types: "Q4_1/Q8_0 avx2" (SmolLM2's
        layers and head), "Q4_K/Q5_0/Q6_K/Q8_0 avx2" (a small model's Q4_K_M file)."""
        return f"{'/'.join(sorted({w.name for w in self.quant.values()}))} {kernels.status()['isa']}"

    def describe(self, bandwidth_bps):
        """What `hello.weights` carries: each format's bytes per decode step and its estimated floor."""
        out = {}
        for name in self.available:
            p = Path(name, "", (sum(self.q) if name == "stored" else sum(self.fp32)) + self.other)
            kinds = sorted({w.name for w in self.quant.values()}) if name == "stored" else ["F32"]
            out[name] = {"decode_bytes": p.weight_bytes, "floor_s": p.weight_bytes / bandwidth_bps,
                         "blocks": kinds}
        return {"formats": out, "kernel": kernels.status()["isa"], "why": kernels.status()["why"],
                "fp32_on_demand": bool(self.quant),
                "int8_path": kernels.int8_path() if "int8" in self.activations else None}


def on_cpu(t):
    """Whether a weight is the CPU's: a CPU tensor, or one left unmade (meta) because the engine
    reads it from its blocks (engine/model/loading.py loads the server's model so; it is never on a GPU)."""
    return t.device.type == "cpu" or t.is_meta


def _onednn_ok(linear):
    """Whether oneDNN can run this linear layer here: fp32 on a CPU with oneDNN, no bias (the
    Llama family has none). Elsewhere (GPU, bf16, MPS) the model's own modules run."""
    w = linear.weight
    return on_cpu(w) and w.dtype == torch.float32 and linear.bias is None and torch.backends.mkldnn.is_available()


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
    """A linear layer kept as blocks: read through the fused kernel while `formats.stored`, else
    through an fp32 copy made from the blocks when the formats ask (`make_fp32`)."""

    def __init__(self, blocks, formats):
        super().__init__()
        self.blocks, self.formats = blocks, formats
        self.fp32 = None
        formats.layers.append(self)

    def make_fp32(self):
        self.fp32 = PackedLinear(self.blocks.dequantise())

    def forward(self, x):
        if self.formats.stored:
            rows = x.reshape(-1, x.shape[-1])
            int8 = self.formats.int8 and self.blocks.kind == Q4_1
            y = (kernels.quant_linear_int8 if int8 else kernels.quant_linear)(rows, self.blocks)
            return y.view(*x.shape[:-1], self.blocks.rows)
        return self.fp32(x)


def engine_decoder(decoder, formats, prefix="model."):
    """The decoder the engine runs: a copy of the module tree sharing every tensor with the
    model, its linear layers on prepacked oneDNN weights where that runs (`_onednn_ok`), or on
    their blocks where the file stored them (`formats.quant`, keyed by the model's parameter
    names). The model itself stays as transformers made it, so `generate` (tests, the bench's
    transformers contenders) measures transformers as shipped."""
    linears = [(name, m) for name, m in decoder.named_modules() if isinstance(m, torch.nn.Linear) and _onednn_ok(m)]
    if not linears:
        return decoder
    memo = {id(t): t for t in list(decoder.parameters()) + list(decoder.buffers())}
    from copy import deepcopy
    copy = deepcopy(decoder, memo)
    for name, m in linears:
        parent, _, attr = name.rpartition(".")
        blocks = formats.quant.get(f"{prefix}{name}.weight")
        setattr(copy.get_submodule(parent), attr, QuantLinear(blocks, formats) if blocks else PackedLinear(m.weight))
    return copy


class OutputHead:
    """hidden -> vocab logits with the model's head, on faster CPU kernels.

    The head is the largest single matrix (49152 x 576 for SmolLM2-135M). Stored as blocks
    (SmolLM2's tied embedding, Q8_0, 30 MB), the fused kernel reads them at any row count. In
    fp32, measured on a 2-core CPU (cache-cold, best of 8; docs/performance.md): `F.linear` (MKL)
    takes ~22 ms for one row and ~110 ms for 16; `h @ W^T` on a contiguous transposed copy ~7 ms for
    one row (it streams the matrix) but ~110 ms for 16; oneDNN on a prepacked copy ~18 ms / ~45 ms.
    So: one row -> the transposed copy, several -> oneDNN, each costing the head's bytes again (2 x
    113 MB here; made from the blocks only while the `dequantised` format is read). Elsewhere (GPU,
    non-fp32, no oneDNN, a bias) the plain module is used."""

    def __init__(self, head, formats=None):
        self.head, self.formats = head, formats
        self.blocks = formats.quant.get("lm_head.weight") if formats else None
        self.fast = _onednn_ok(head)
        self.fp32 = None             # (transposed copy, prepacked copy)
        if self.blocks is not None:
            formats.layers.append(self)
        elif self.fast:
            self.fp32 = self._copies(head.weight.detach())

    @staticmethod
    def _copies(w):
        return w.t().contiguous(), PackedLinear(w)

    def make_fp32(self):
        self.fp32 = self._copies(self.blocks.dequantise())

    def __call__(self, h):
        if self.blocks is not None and self.formats.stored:
            return kernels.quant_linear(h, self.blocks)
        if self.fp32 is None:
            return self.head(h)
        wt, packed = self.fp32
        return h @ wt if h.shape[0] == 1 else packed(h)
