"""A model's weights as its GGUF file stores them: ggml's blocks, read without dequantising.

SmolLM2-135M-Instruct's file holds its 210 linear layers as Q4_1 (32 weights share an fp16
scale d and minimum m: w = d*q + m, q a 4-bit integer; 20 bytes a block) and its embedding,
which is also the output head, as Q8_0 (w = d*q, q an int8; 34 bytes a block). `QuantWeight`
keeps a layer's blocks, regrouped 16 output rows at a time (the same bytes and numbers, laid
out so that one vector load holds one weight position of 16 rows), and `dequantise()` gives the
fp32 matrix those numbers mean, which is what the model's fp32 copy holds. The fused kernel (engine/model/kernels) multiplies by the blocks directly.
"""
from dataclasses import dataclass

import struct

import numpy as np
import torch

Q4_1, Q8_0 = 3, 8                 # ggml's type ids, as GGUF files name them
BLOCK = 32                        # weights per block
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}
KIND_NAMES = {Q4_1: "Q4_1", Q8_0: "Q8_0"}


GROUP = 16                        # output rows regrouped together for the kernel
GROUP_BYTES = {Q4_1: GROUP * 20, Q8_0: GROUP * 34}


@dataclass
class QuantWeight:
    """One weight matrix [rows, cols] (rows = output features) as ggml blocks, regrouped 16 output
    rows at a time for the kernel (engine/model/kernels/csrc/quant_linear.cpp describes the layout: per
    group and block the 16 rows' scales, then their quants position by position). The last group
    is padded with zero blocks when `rows` is not a multiple of 16."""
    kind: int
    rows: int
    cols: int
    data: torch.Tensor            # uint8 [ceil(rows / 16), cols / 32 * 16 * block bytes]

    @classmethod
    def from_blocks(cls, kind, blocks):
        """From the file's layout: uint8 [rows, blocks * bytes], each block {d, (m,) quants}."""
        rows = blocks.shape[0]
        nb = blocks.shape[1] // BLOCK_BYTES[kind]
        pad = -rows % GROUP
        b = torch.cat([blocks, blocks.new_zeros(pad, blocks.shape[1])]) if pad else blocks
        groups = b.shape[0] // GROUP
        b = b.reshape(groups, GROUP, nb, BLOCK_BYTES[kind])
        scales = [b[..., 0:2]] + ([b[..., 2:4]] if kind == Q4_1 else [])
        parts = [s.permute(0, 2, 1, 3).reshape(groups, nb, 2 * GROUP) for s in scales]
        if kind == Q4_1:
            qs = b[..., 4:]
            q = torch.cat([qs & 0x0F, qs >> 4], dim=3)                   # weight j, then j + 16
            pairs = q.reshape(groups, GROUP, nb, 4, 4, 2)                  # 4 dwords of 8 nibbles
            packed = pairs[..., 0] | (pairs[..., 1] << 4)                  # weight 8c+t at bits 4t
            parts.append(packed.permute(0, 2, 3, 1, 4).reshape(groups, nb, 4 * GROUP * 4))
        else:
            parts.append(b[..., 2:].permute(0, 2, 3, 1).reshape(groups, nb, BLOCK * GROUP))
        data = torch.cat(parts, dim=2).reshape(groups, -1).contiguous()
        return cls(kind, rows, nb * BLOCK, data)

    @property
    def nbytes(self):
        return self.data.numel()

    @property
    def name(self):
        return KIND_NAMES[self.kind]

    def _lanes(self, g):
        """(d, m or None, q) as fp32 [n, 16, blocks(, 32)] of the groups `g` (uint8 [n, blocks, bytes])."""
        n, nb = g.shape[:2]
        half = lambda t: t.contiguous().view(torch.float16).float().transpose(1, 2)   # noqa: E731
        d = half(g[..., 0:2 * GROUP])
        if self.kind == Q4_1:
            b = g[..., 4 * GROUP:].reshape(n, nb, 4, GROUP, 4)                 # [.., chunk, lane, byte]
            nib = torch.stack([b & 0x0F, b >> 4], dim=-1)                       # weight 8c + 2 byte + half
            q = nib.permute(0, 3, 1, 2, 4, 5).reshape(n, GROUP, nb, BLOCK)
            return d, half(g[..., 2 * GROUP:4 * GROUP]), q.float()
        q = g[..., 2 * GROUP:].contiguous().view(torch.int8).reshape(n, nb, BLOCK, GROUP)
        return d, None, q.permute(0, 3, 1, 2).float()

    def _parts(self, rows=None):
        """(d, m or None, q) as fp32 [n, blocks(, 32)] for every row, or for the rows `rows`."""
        g = self.data.view(self.data.shape[0], self.cols // BLOCK, GROUP_BYTES[self.kind])
        if rows is None:
            parts = self._lanes(g)
            return tuple(None if t is None else t.reshape(-1, *t.shape[2:])[:self.rows] for t in parts)
        rows = torch.as_tensor(rows, dtype=torch.long)
        parts = self._lanes(g[rows // GROUP])
        pick = (torch.arange(len(rows)), rows % GROUP)
        return tuple(None if t is None else t[pick] for t in parts)

    def dequantise(self, rows=None):
        """The fp32 matrix these blocks mean (d*q + m per weight), or its rows `rows` (an
        embedding lookup reads only the rows of its tokens)."""
        d, m, q = self._parts(rows)
        w = d[..., None] * q
        if m is not None:
            w = w + m[..., None]
        return w.reshape(w.shape[0], self.cols)

    def file_blocks(self):
        """The file's layout again: uint8 [rows, blocks * bytes] (`from_blocks` inverted)."""
        d, m, q = self._parts()
        parts = [d.half().view(torch.uint8).reshape(self.rows, -1, 2)]
        if self.kind == Q4_1:
            parts.append(m.half().view(torch.uint8).reshape(self.rows, -1, 2))
            qi = q.to(torch.uint8)
            parts.append(qi[..., :16] | (qi[..., 16:] << 4))
        else:
            parts.append(q.to(torch.int8).view(torch.uint8))
        return torch.cat(parts, dim=2).reshape(self.rows, -1)

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


def quantise(w, kind):
    """fp32 [rows, cols] -> QuantWeight, as ggml's reference quantisers round (tests, tiny models)."""
    rows, cols = w.shape
    if cols % BLOCK:
        raise ValueError(f"a {KIND_NAMES[kind]} weight needs columns in blocks of {BLOCK}, not {cols}")
    x = w.detach().float().reshape(rows, cols // BLOCK, BLOCK)
    if kind == Q4_1:
        lo, hi = x.min(dim=2).values, x.max(dim=2).values
        d = ((hi - lo) / 15).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(lo))
        q = ((x - lo.half().float()[..., None]) * inv[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)
        parts = [d, lo.half()]
    elif kind == Q8_0:
        d = (x.abs().max(dim=2).values / 127).half()
        inv = torch.where(d.float() > 0, 1 / d.float(), torch.zeros_like(d.float()))
        packed = (x * inv[..., None]).round().clamp(-127, 127).to(torch.int8).view(torch.uint8)
        parts = [d]
    else:
        raise ValueError(f"no quantiser for block type {kind}")
    blocks = torch.cat([p.contiguous().view(torch.uint8).reshape(rows, cols // BLOCK, -1)
                        for p in parts + [packed]], dim=2)
    return QuantWeight.from_blocks(kind, blocks.reshape(rows, -1))


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
    """{transformers name: QuantWeight (Q4_1, Q8_0 kept as blocks) or fp32 tensor} of a GGUF of an
    architecture engine/model/archs.py describes, as transformers' GGUF loader names and converts
    them: llama's q/k rows back in transformers' rotary order, Gemma's norms as w - 1 (llama.cpp
    stores 1 + w). Block types without a kernel here are dequantised by the gguf package (fp32)."""
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
        if kind in BLOCK_BYTES:
            w = QuantWeight.from_blocks(kind, raw.reshape(shape[0], -1))
        elif kind == 0:                                                    # F32
            w = raw.view(torch.float32).reshape(shape).clone()
        else:
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
