"""A model's weights as its GGUF file stores them: ggml's blocks, read without dequantising.

A GGUF file stores a matrix row by row in blocks of a type (`SPECS`): 32 weights sharing an fp16
scale d (Q4_0: w = d*(q - 8), Q5_0: d*(q - 16), Q8_0: d*q) and, in Q4_1/Q5_1, a minimum m
(w = d*q + m); or the K-quants' super-blocks of 256 (Q4_K, Q5_K: 8 sub-blocks of 32, each with a
6-bit scale and minimum under the super-block's fp16 d and dmin, w = d*sc*q - dmin*mn; Q6_K: 16 of
16 with int8 scales, w = d*sc*(q - 32)); or plain F16/BF16 values. SmolLM2-135M-Instruct's file
holds its linear layers as Q4_1 and its embedding, which is also the output head, as Q8_0.

`QuantWeight` keeps a layer's blocks regrouped 16 output rows at a time (the same numbers, laid
out so that one vector load holds one weight position of 16 rows; engine/model/kernels/csrc/
quant_linear.cpp describes the layout), and `dequantise()` gives the fp32 matrix those numbers
mean, exactly as the `gguf` package's dequantisers compute it (tests/engine/test_kernels.py holds
them to it). The fused kernel (engine/model/kernels) multiplies by the blocks directly.
"""
from dataclasses import dataclass

import struct

import numpy as np
import torch

# ggml's type ids, as GGUF files name them
F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
BLOCK = 32                        # weights per (sub-)block: the kernel's unit along a row


@dataclass(frozen=True)
class Spec:
    """One block type: its name, the weights and bytes of one of its blocks in the file (`qk`: 32,
    or a K-quant's 256; F16/BF16 are read 32 values at a time), and the bits of each quant."""
    name: str
    qk: int
    file_bytes: int
    bits: int


SPECS = {Q4_0: Spec("Q4_0", 32, 18, 4), Q4_1: Spec("Q4_1", 32, 20, 4), Q5_0: Spec("Q5_0", 32, 22, 5),
         Q5_1: Spec("Q5_1", 32, 24, 5), Q8_0: Spec("Q8_0", 32, 34, 8), Q4_K: Spec("Q4_K", 256, 144, 4),
         Q5_K: Spec("Q5_K", 256, 176, 5), Q6_K: Spec("Q6_K", 256, 210, 6), F16: Spec("F16", 32, 64, 16),
         BF16: Spec("BF16", 32, 64, 16)}
BLOCK_BYTES = {kind: s.file_bytes for kind, s in SPECS.items()}
KIND_NAMES = {kind: s.name for kind, s in SPECS.items()}
_OFFSET = {Q4_0: 8, Q5_0: 16, Q6_K: 32}              # w = d*(q - offset) in these types
_HAS_MIN = (Q4_1, Q5_1, Q4_K, Q5_K)                  # a minimum (Q4_1/Q5_1: m; K: dmin and 6-bit mins)

GROUP = 16                        # output rows regrouped together for the kernel


# ---- the file's blocks <-> their fields (per row and block: d, m, sc, mn as stored, q unpacked) ----
def _nibbles(b):
    """Bytes [..., n] -> their low nibbles, then their high ones [..., 2n] (ggml's 4-bit order)."""
    return torch.cat([b & 0x0F, b >> 4], dim=-1)


def _bytes_of(q):
    """`_nibbles` inverted: [..., 2n] values < 16 -> [..., n] bytes."""
    n = q.shape[-1] // 2
    return q[..., :n] | (q[..., n:] << 4)


def _bits(b, width):
    """Bytes [..., n] -> [..., n * 8 / width] fields of `width` bits, lowest first."""
    per = 8 // width
    shifts = torch.arange(0, 8, width, dtype=torch.uint8)
    return ((b[..., None] >> shifts) & ((1 << width) - 1)).reshape(*b.shape[:-1], b.shape[-1] * per)


def _join_bits(v, width):
    """`_bits` inverted: each field times its place, summed in uint8 (the fields do not overlap, so
    the sum is their bitwise or; 3x faster than the sum of an int32 copy, which was a third of a
    start's repacking of Gemma's blocks, and 8x faster than or-ing strided slices)."""
    per = 8 // width
    place = torch.tensor([1 << (i * width) for i in range(per)], dtype=torch.uint8)
    return (v.reshape(*v.shape[:-1], -1, per) * place).sum(-1, dtype=torch.uint8)


def _parse(kind, b):
    """File blocks uint8 [rows, blocks, bytes] -> {field: uint8 tensor}: "d" and "m" (fp16 bytes
    [.., 2]; K: d and dmin), "sc"/"mn" (the K-quants' sub-block scales and minimums, one byte
    each, 6-bit ones unpacked), "q" (every weight's quant, [.., qk]; F16/BF16: their bytes)."""
    f = {}
    if kind in (F16, BF16):
        return {"q": b}
    if kind == Q6_K:
        ql, qh = b[..., :128].reshape(*b.shape[:2], 2, 64), b[..., 128:192].reshape(*b.shape[:2], 2, 32)
        hi = _bits(qh, 2).reshape(*b.shape[:2], 2, 32, 4).transpose(-1, -2)     # weight 32s + l: bits 2s of byte l
        f["q"] = (_nibbles(ql) | (hi.reshape(*b.shape[:2], 2, 128) << 4)).reshape(*b.shape[:2], 256)
        f["sc"], f["d"] = b[..., 192:208], b[..., 208:210]
        return f
    f["d"] = b[..., 0:2]
    at = 2
    if kind in _HAS_MIN:
        f["m"], at = b[..., 2:4], 4
    if kind in (Q4_K, Q5_K):
        s = b[..., 4:16].reshape(*b.shape[:2], 3, 4)
        dd, mm, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
        f["sc"] = torch.cat([dd & 0x3F, (md & 0x0F) | ((dd >> 2) & 0x30)], dim=-1)
        f["mn"] = torch.cat([mm & 0x3F, (md >> 4) | ((mm >> 2) & 0x30)], dim=-1)
        at = 16
    if kind == Q8_0:
        f["q"] = b[..., 2:]
        return f
    high = None
    if kind in (Q5_0, Q5_1):
        high, at = _bits(b[..., at:at + 4], 1), at + 4                          # bit j: weight j
    elif kind == Q5_K:
        high = _bits(b[..., 16:48], 1).reshape(*b.shape[:2], 32, 8).transpose(-1, -2).reshape(*b.shape[:2], 256)
        at = 48
    qs = b[..., at:]
    if kind in (Q4_K, Q5_K):                  # 32 bytes a pair of sub-blocks: low nibbles, then high
        q = _nibbles(qs.reshape(*b.shape[:2], 4, 32)).reshape(*b.shape[:2], 256)
    else:
        q = _nibbles(qs)
    f["q"] = q if high is None else q | (high << 4)
    return f


def _unparse(kind, f):
    """`_parse` inverted: the file's block bytes [rows, blocks, bytes]."""
    q = f["q"]
    lead = q.shape[:2]
    if kind in (F16, BF16):
        return q
    if kind == Q6_K:
        q2 = q.reshape(*lead, 2, 128)
        ql = _bytes_of(q2 & 0x0F)
        hi = (q2 >> 4).reshape(*lead, 2, 4, 32).transpose(-1, -2).reshape(*lead, 2, 128)
        return torch.cat([ql.reshape(*lead, 128), _join_bits(hi, 2).reshape(*lead, 64), f["sc"], f["d"]], dim=-1)
    parts = [f["d"]] + ([f["m"]] if kind in _HAS_MIN else [])
    if kind in (Q4_K, Q5_K):
        sc, mn = f["sc"], f["mn"]
        parts += [sc[..., :4] | ((sc[..., 4:] & 0x30) << 2), mn[..., :4] | ((mn[..., 4:] & 0x30) << 2),
                  (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)]
    if kind == Q8_0:
        return torch.cat(parts + [q], dim=-1)
    if kind in (Q5_0, Q5_1):
        parts.append(_join_bits(q >> 4, 1))
    elif kind == Q5_K:
        parts.append(_join_bits((q >> 4).reshape(*lead, 8, 32).transpose(-1, -2).reshape(*lead, 256), 1))
    lo = q & 0x0F
    if kind in (Q4_K, Q5_K):
        parts.append(_bytes_of(lo.reshape(*lead, 4, 64)).reshape(*lead, 128))
    else:
        parts.append(_bytes_of(lo))
    return torch.cat(parts, dim=-1)


# ---- fields <-> the kernel's layout: per group of 16 rows and file block, each field's values
# value-major and the 16 rows' side by side ([value][row][bytes]): first the block's own fields
# (d, m, sc, mn), then per sub-block of 32 weights its quants (see quant_linear.cpp).
def _header(kind):
    """(field, values, bytes each) of a block's own fields, in the kernel's order."""
    out = [] if kind in (F16, BF16) else [("d", 1, 2)]
    if kind in _HAS_MIN:
        out.append(("m", 1, 2))
    if kind in (Q4_K, Q5_K):
        out += [("sc", 8, 1), ("mn", 8, 1)]
    elif kind == Q6_K:
        out.append(("sc", 16, 1))
    return out


def _sub_fields(kind):
    """(name, values, bytes each) of a sub-block of 32 weights in the kernel's layout: "lo" the low
    nibbles (chunk c's dword: weights 8c..8c+7, weight 8c+t at bits 4t), "qh" the fifth bits and
    "hi" the top two bits, each placed where the byte of their low nibbles is (`_HIGH_ORDER`),
    "q8" Q8_0's int8 and "h" F16/BF16's values, position by position."""
    bits = SPECS[kind].bits
    if bits == 8:
        return [("q8", 32, 1)]
    if bits == 16:
        return [("h", 32, 2)]
    return [("lo", 4, 4)] + ([("qh", 1, 4)] if bits == 5 else [("hi", 2, 4)] if bits == 6 else [])


def _high_order(width):
    """The weight (0..31) whose high bits sit in each `width`-bit field of a sub-block's "qh"
    (width 1: one dword) or "hi" (2: two dwords), lowest field first. Byte j of chunk c's low
    nibbles holds weights 8c + 2j (low nibble) and 8c + 2j + 1 (high); their high bits sit in
    byte j too, chunk after chunk (qh: bits 2c and 2c + 1; hi: dword c / 2, fields 2 (c % 2) and
    2 (c % 2) + 1), so that the kernel adds them to a whole chunk's bytes with a shift and a mask."""
    per_byte, chunks = 8 // width, 8 // width // 2        # fields a byte; chunks a dword
    order = []
    for dword in range(width):
        for j in range(4):
            for f in range(per_byte):
                c, e = dword * chunks + f // 2, f % 2
                order.append(8 * c + 2 * j + e)
    return torch.tensor(order)


_HIGH_ORDER = {1: _high_order(1), 2: _high_order(2)}


def _sub_values(name, q):
    """A sub-block's quants [.., 32] -> the bytes of its field `name` [.., values * bytes each]."""
    if name == "lo":
        return _join_bits(q & 0x0F, 4)
    if name == "qh":
        return _join_bits(((q >> 4) & 1)[..., _HIGH_ORDER[1]], 1)
    if name == "hi":
        return _join_bits((q >> 4)[..., _HIGH_ORDER[2]], 2)
    return q                                   # q8: the int8 bytes; h: the values' bytes [.., 64]


def _sub_quants(fields):
    """`_sub_values` inverted: {field: bytes} of a sub-block -> its quants [.., 32]."""
    if "lo" not in fields:
        return fields.get("q8", fields.get("h"))
    q = _bits(fields["lo"], 4)
    for name, width in (("qh", 1), ("hi", 2)):
        if name in fields:
            high = torch.empty_like(q)
            high[..., _HIGH_ORDER[width]] = _bits(fields[name], width)
            q = q | (high << 4)
    return q


def _sizes(kind):
    header = sum(v * n for _, v, n in _header(kind)) * GROUP
    sub = sum(v * n for _, v, n in _sub_fields(kind)) * GROUP
    return header, sub, SPECS[kind].qk // BLOCK


def group_bytes(kind):
    """Bytes of one group's file block in the kernel's layout (16 rows' blocks and their fields)."""
    header, sub, nsub = _sizes(kind)
    return header + nsub * sub


@dataclass
class QuantWeight:
    """One weight matrix [rows, cols] (rows = output features) as ggml blocks, regrouped 16 output
    rows at a time for the kernel (engine/model/kernels/csrc/quant_linear.cpp describes the layout:
    per group and file block, its fields' values with the 16 rows' side by side). The last group is
    padded with zero blocks when `rows` is not a multiple of 16."""
    kind: int
    rows: int
    cols: int
    data: torch.Tensor            # uint8 [ceil(rows / 16), cols / qk * group_bytes(kind)]

    @classmethod
    def from_blocks(cls, kind, blocks):
        """From the file's layout: uint8 [rows, blocks * bytes]."""
        spec = SPECS[kind]
        rows, nb = blocks.shape[0], blocks.shape[1] // spec.file_bytes
        pad = -rows % GROUP
        b = torch.cat([blocks, blocks.new_zeros(pad, blocks.shape[1])]) if pad else blocks
        groups = b.shape[0] // GROUP
        f = _parse(kind, b.reshape(b.shape[0], nb, spec.file_bytes))
        parts = [f[name].reshape(groups, GROUP, nb, v, n).permute(0, 2, 3, 1, 4).reshape(groups, nb, -1)
                 for name, v, n in _header(kind)]
        nsub = spec.qk // BLOCK
        q = f["q"].reshape(b.shape[0], nb, nsub, -1)
        subs = [_sub_values(name, q).reshape(groups, GROUP, nb, nsub, v, n).permute(0, 2, 3, 4, 1, 5)
                .reshape(groups, nb, nsub, -1) for name, v, n in _sub_fields(kind)]
        parts.append(torch.cat(subs, dim=3).reshape(groups, nb, -1))
        data = torch.cat(parts, dim=2).reshape(groups, -1).contiguous()
        return cls(kind, rows, nb * spec.qk, data)

    @property
    def nbytes(self):
        return self.data.numel()

    @property
    def name(self):
        return KIND_NAMES[self.kind]

    def _fields(self, g):
        """`_parse`'s fields of the groups `g` (uint8 [n, bytes]), per row: [n * 16, blocks, ..]."""
        n, nb = g.shape[0], self.cols // SPECS[self.kind].qk
        header, sub, nsub = _sizes(self.kind)
        x = g.reshape(n, nb, header + nsub * sub)
        f, at = {}, 0
        for name, v, size in _header(self.kind):
            f[name] = x[..., at:at + v * GROUP * size].reshape(n, nb, v, GROUP, size).permute(0, 3, 1, 2, 4) \
                .reshape(n * GROUP, nb, v * size)
            at += v * GROUP * size
        subs, x, at = {}, x[..., header:].reshape(n, nb, nsub, sub), 0
        for name, v, size in _sub_fields(self.kind):
            subs[name] = x[..., at:at + v * GROUP * size].reshape(n, nb, nsub, v, GROUP, size) \
                .permute(0, 4, 1, 2, 3, 5).reshape(n * GROUP, nb, nsub, v * size)
            at += v * GROUP * size
        f["q"] = _sub_quants(subs).reshape(n * GROUP, nb, -1)
        return f

    def _groups_of(self, rows):
        """(fields of every row) or (fields of the rows `rows`)."""
        if rows is None:
            return {k: v[:self.rows] for k, v in self._fields(self.data).items()}
        rows = torch.as_tensor(rows, dtype=torch.long)
        f = self._fields(self.data[rows // GROUP])
        pick = torch.arange(len(rows)) * GROUP + rows % GROUP
        return {k: v[pick] for k, v in f.items()}

    def dequantise(self, rows=None):
        """The fp32 matrix these blocks mean, or its rows `rows` (an embedding lookup reads only
        the rows of its tokens): the numbers gguf.quants.dequantize gives, computed as it does
        (exact products, then one rounding where a minimum is added)."""
        f = self._groups_of(rows)
        q, kind = f["q"], self.kind
        if kind in (F16, BF16):
            w = q.contiguous().view(torch.float16 if kind == F16 else torch.bfloat16).float()
            return w.reshape(w.shape[0], self.cols)
        half = lambda t: t.contiguous().view(torch.float16).float()      # noqa: E731  [.., 1]
        d = half(f["d"])
        if kind == Q8_0:
            w = d * q.view(torch.int8).float()
        elif kind in (Q4_K, Q5_K):
            scale, low = d * f["sc"].float(), half(f["m"]) * f["mn"].float()
            w = scale[..., None] * q.reshape(*q.shape[:2], 8, 32).float() - low[..., None]
        elif kind == Q6_K:
            scale = d * f["sc"].view(torch.int8).float()
            w = scale[..., None] * (q.reshape(*q.shape[:2], 16, 16).float() - _OFFSET[kind])
        elif kind in _HAS_MIN:
            w = d * q.float() + half(f["m"])
        else:
            w = d * (q.float() - _OFFSET[kind])
        return w.reshape(w.shape[0], self.cols)

    def _parts(self):
        """(d, m, q) as fp32 [rows, blocks(, 32)] of a Q4_1 weight (the int8 path's reference)."""
        f = self._groups_of(None)
        half = lambda t: t.contiguous().view(torch.float16).float()[..., 0]   # noqa: E731
        return half(f["d"]), half(f["m"]), f["q"].float()

    def file_blocks(self):
        """The file's layout again: uint8 [rows, blocks * bytes] (`from_blocks` inverted)."""
        return _unparse(self.kind, self._groups_of(None)).reshape(self.rows, -1)

    def take_rows(self, order):
        """The same weights with output rows in `order` (a permutation): bytes moved, not changed."""
        return QuantWeight.from_blocks(self.kind, self.file_blocks()[order])


def stack_rows(parts):
    """Several matrices of one block type and width as one, rows after rows (q|k|v, gate|up: one
    kernel call instead of three), or None where their types or widths differ."""
    if len({(p.kind, p.cols) for p in parts}) != 1:
        return None
    rows = sum(p.rows for p in parts)
    if all(p.rows % GROUP == 0 for p in parts):          # whole groups: their bytes one after another
        return QuantWeight(parts[0].kind, rows, parts[0].cols, torch.cat([p.data for p in parts]))
    return QuantWeight.from_blocks(parts[0].kind, torch.cat([p.file_blocks() for p in parts]))


def stored(kind, raw, shape):
    """A GGUF tensor (its bytes `raw`, uint8; `shape` rows first) as the kernel reads it: a
    QuantWeight where the kernel knows its type and it is a matrix whose rows hold whole blocks of
    32, else None (the caller keeps it as fp32: a norm, or a type without a kernel here)."""
    spec = SPECS.get(kind)
    if spec is None or len(shape) != 2 or shape[1] % spec.qk or shape[1] % BLOCK:
        return None
    return QuantWeight.from_blocks(kind, raw.reshape(shape[0], -1))


def quantise(w, kind):
    """fp32 [rows, cols] -> QuantWeight, as the gguf package's quantisers round (tests, tiny models;
    it has none for the K-quants: tests/engine/test_kernels.py builds their blocks by hand)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize
    rows, cols = w.shape
    qk = SPECS[kind].qk
    if cols % qk:
        raise ValueError(f"a {KIND_NAMES[kind]} weight needs columns in blocks of {qk}, not {cols}")
    try:
        blocks = quantize(w.detach().float().numpy(), GGMLQuantizationType(kind))
    except NotImplementedError:
        raise ValueError(f"no quantiser for block type {KIND_NAMES[kind]}") from None
    return QuantWeight.from_blocks(kind, torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8)).reshape(rows, -1))


def random_blocks(kind, rows, cols, seed):
    """Valid random file blocks of a type, uint8 [rows, blocks * bytes] (tests, benchmarks, tiny
    models in types gguf cannot quantise): random bytes but an fp16 d > 0 (and dmin > 0 in a
    K-quant; Q4_1/Q5_1's m < 0, as real minimums are), so every quant and 6-bit scale pattern
    occurs; F16/BF16 from random values (random bytes would hold infinities) by gguf's conversion."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize
    g = torch.Generator().manual_seed(seed)
    spec = SPECS[kind]
    if spec.bits == 16:
        x = torch.randn(rows, cols, generator=g).numpy()
        return torch.from_numpy(quantize(x, GGMLQuantizationType(kind)).view(np.uint8)).reshape(rows, -1)
    nb = cols // spec.qk
    b = torch.randint(0, 256, (rows, nb, spec.file_bytes), dtype=torch.uint8, generator=g)
    d = (torch.rand(rows, nb, 1, generator=g) * 0.02 + 1e-3).half().view(torch.uint8)
    if kind == Q6_K:
        b[..., 208:210] = d                                    # Q6_K's d comes last
    else:
        b[..., 0:2] = d
    if kind in (Q4_1, Q5_1):
        b[..., 2:4] = (-torch.rand(rows, nb, 1, generator=g) * 0.1).half().view(torch.uint8)
    if kind in (Q4_K, Q5_K):
        b[..., 2:4] = (torch.rand(rows, nb, 1, generator=g) * 0.01).half().view(torch.uint8)
    return b.reshape(rows, -1)


# GGUF tensor names (llama.cpp's) -> the transformers module that holds them (Llama's, Qwen's, Gemma's).
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
          "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
# Gemma's norm before the MLP is llama.cpp's ffn_norm (its post_attention_norm follows attention)
_LAYER_GEMMA = {**_LAYER, "ffn_norm": "pre_feedforward_layernorm"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name, arch="llama"):
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight' (None: not a tensor of a
    decoder this loader knows)."""
    parts = gguf_name.split(".")
    layer = _LAYER_GEMMA if arch.startswith("gemma") else _LAYER
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP:
        return f"{_TOP[parts[0]]}.{parts[1]}"
    return None


def _rope_rows(rows, heads):
    """The row order that undoes llama.cpp's interleaving of q/k rows for its rotary layout (the
    permutation transformers' GGUF loader applies to the dequantised matrix)."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


# GGUF metadata value types: struct formats of the fixed-size ones (8: string, 9: array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Cursor:
    """Reads a GGUF header in place (gguf's own GGUFReader builds an object for every one of the
    vocabulary's ~49k strings and ~2.5 s go to that; this skips what it does not keep)."""

    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def read(self, fmt):
        v = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.read("Q")
        self.at += n
        return bytes(self.buf[self.at - n:self.at]).decode("utf-8", "replace")

    def value(self, kind):
        """A scalar or string (an array is skipped: None)."""
        if kind == 8:
            return self.string()
        if kind == 9:
            item, n = self.read("I"), self.read("Q")
            if item in _SCALARS:
                self.at += n * struct.calcsize(_SCALARS[item])
            elif item == 8:                  # strings (a vocabulary): stepped over by length, not decoded
                for _ in range(n):
                    self.at += 8 + struct.unpack_from("<Q", self.buf, self.at)[0]
            else:
                for _ in range(n):
                    self.value(item)
            return None
        return self.read(_SCALARS[kind])


def gguf_index(path):
    """(metadata {key: scalar or string}, [(name, ggml type, shape rows-first, byte offset, bytes)])."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    buf = np.memmap(path, dtype=np.uint8, mode="c")     # copy-on-write: torch wants a writable array
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    c.at = 4
    version, n_tensors, n_kv = c.read("I"), c.read("Q"), c.read("Q")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.read("I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.read("Q") for _ in range(c.read("I"))]
        kind, offset = c.read("I"), c.read("Q")
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        infos.append((name, kind, tuple(reversed(dims)), offset, int(np.prod(dims)) // block * size))
    align = meta.get("general.alignment", 32)
    start = -(-c.at // align) * align
    return meta, [(n, k, shape, start + off, size) for n, k, shape, off, size in infos], buf


def architecture(path):
    """The `general.architecture` a GGUF file declares ("llama", ...)."""
    return gguf_index(path)[0].get("general.architecture")


def read_gguf(path, config):
    """{transformers name: QuantWeight (the matrices of the types in `SPECS`, kept as blocks) or fp32
    tensor} of a GGUF of an architecture engine/model/archs.py describes, as transformers' GGUF
    loader names and converts them: llama's q/k rows back in transformers' rotary order, Gemma's
    norms as w - 1 (llama.cpp stores 1 + w). Block types without a kernel here are dequantised by
    the gguf package (fp32, said by their type)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    meta, tensors, buf = gguf_index(path)
    arch = meta.get("general.architecture", "llama")
    out = {}
    for gname, kind, shape, offset, size in tensors:
        name = "rope_freqs" if gname == "rope_freqs.weight" else hf_name(gname, arch)   # Llama 3's (loading.py)
        if name is None:
            raise ValueError(f"{path.name}: tensor {gname} is not a {arch} tensor this loader knows")
        raw = torch.from_numpy(buf[offset:offset + size])     # a view of the mapped file: each branch copies
        w = stored(kind, raw, shape)
        if w is None and kind == 0:                                        # F32
            w = raw.view(torch.float32).reshape(shape).clone()
        elif w is None:
            rows = raw.numpy().reshape(shape[0], -1)
            w = torch.from_numpy(dequantize(rows, GGMLQuantizationType(kind)).astype(np.float32)).reshape(shape)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w - 1
        for proj, heads in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads)):
            if arch == "llama" and name.endswith(f"self_attn.{proj}.weight"):
                order = _rope_rows(shape[0], heads)
                w = w.take_rows(order) if isinstance(w, QuantWeight) else w[order].contiguous()
        out[name] = w
    return out
