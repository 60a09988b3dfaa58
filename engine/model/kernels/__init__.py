"""The engine's CPU kernels: torch custom ops built from csrc/ (engine/model/kernels/build.py), each
with the plain-torch computation it must equal beside it.

`quant_linear(x, w)`: x [rows, cols] fp32 times a `QuantWeight`'s blocks (engine/model/weights.py),
transposed, = x @ w.dequantise().T up to summation order (fp32 throughout; the activations are
never rounded to int8), at any number of rows. `quant_rows(w, ids)`: rows of w.dequantise(). The instruction-set path is picked once per process from what the CPU
has (AVX-512, else AVX2+FMA+F16C, else portable C++); FIRST_TOKEN_ISA=avx2|portable picks a
lower one, FIRST_TOKEN_KERNELS=off none (the engine then reads dequantised fp32 weights).
"""
import functools
import os

import torch

from .build import build

ISAS = {0: "portable", 1: "avx2", 2: "avx512"}


@functools.lru_cache(maxsize=None)
def status():
    """{"isa": the path used, "isas": every path this CPU runs} or {"isa": None, "why": reason}."""
    if os.environ.get("FIRST_TOKEN_KERNELS") == "off":
        return {"isa": None, "isas": [], "why": "turned off (FIRST_TOKEN_KERNELS=off)"}
    try:
        torch.ops.load_library(str(build(quiet=True)))
    except (RuntimeError, OSError) as e:
        return {"isa": None, "isas": [], "why": str(e).splitlines()[0]}
    isas = [ISAS[i] for i in torch.ops.first_token.isas()]
    wanted = os.environ.get("FIRST_TOKEN_ISA")
    if wanted and wanted not in isas:
        return {"isa": None, "isas": isas, "why": f"FIRST_TOKEN_ISA={wanted} is not one of {isas}"}
    return {"isa": wanted or isas[-1], "isas": isas, "why": None}


def available():
    return status()["isa"] is not None


def describe():
    """One line for the start-up log."""
    s = status()
    if s["isa"]:
        return f"kernels: linear on ggml blocks on {s['isa']} (this CPU runs {', '.join(s['isas'])})"
    return f"kernels: not available ({s['why']}); linear layers read dequantised fp32 weights"


def quant_linear(x, w, isa=None):
    """x [rows, w.cols] fp32 -> [rows, w.rows]: x times the blocks of `w`, transposed."""
    code = {v: k for k, v in ISAS.items()}[isa or status()["isa"]]
    return torch.ops.first_token.quant_linear(x, w.data, w.kind, w.rows, code)


def quant_linear_int8(x, w, isa=None):
    """The same product with x rounded to int8 first, as llama.cpp rounds it (per row and block of
    32: d = max|x| / 127 as fp16, q = round(x * 127 / max|x|), s = d * sum(q) as fp16) and integer dot products
    against the 4-bit quants (Q4_1 only): the `activations` setting's `int8`, another arithmetic."""
    code = {v: k for k, v in ISAS.items()}[isa or status()["isa"]]
    return torch.ops.first_token.quant_linear_int8(x, w.data, w.kind, w.rows, code)


def int8_path(isa=None):
    """What the int8 activations run on here: "vnni", "avx2" or "portable"."""
    code = {v: k for k, v in ISAS.items()}[isa or status()["isa"]]
    return torch.ops.first_token.int8_path(code)


def int8_peak(seconds=0.2, isa=None):
    """The int8 path's multiply-add rate on every thread, ops/s (2 per product): a register-resident
    loop of its instructions (VPDPBUSD, or VPMADDUBSW + VPMADDWD), an estimate of its compute roof."""
    code = {v: k for k, v in ISAS.items()}[isa or status()["isa"]]
    return torch.ops.first_token.int8_peak(code, seconds)


def int8_rows_reference(x):
    """(q, d, s) of x rounded as llama.cpp's Q8_1: per row and block of 32, fp32 [rows, blocks(, 32)]."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv[..., None])                        # halves to even, as llama.cpp's x86 paths
    d = amax / 127
    return q, d.half().float(), (q.sum(-1) * d).half().float()


def quant_linear_int8_reference(x, w):
    """What `quant_linear_int8` computes, in plain torch: per block d_w * d_x * (q_w . q_x) + m_w * s_x."""
    q, dx, sx = int8_rows_reference(x)
    dw, mw, qw = w._parts()
    dots = torch.einsum("mbk,nbk->mnb", q, qw)                  # integers, exact in fp32 here
    return (dots * dw[None] * dx[:, None] + mw[None] * sx[:, None]).sum(-1)


def quant_rows(w, ids):
    """Rows `ids` (a long tensor) of the matrix `w`'s blocks mean, fp32: an embedding lookup."""
    return torch.ops.first_token.quant_rows(w.data, w.kind, w.rows, ids)


def quant_linear_reference(x, w):
    """What `quant_linear` computes, in plain torch: fp32 matmul on the dequantised matrix."""
    return x @ w.dequantise().T


# The fused ops around the linear layers (csrc/fused.cpp), called as torch.ops.first_token.NAME
# by engine/model/llama.py; each reference below is what its op computes, in plain torch.
def rms_norm_reference(h, w, eps):
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))


def add_rms_norm_reference(residual, x, w, eps):
    residual += x
    return rms_norm_reference(residual, w, eps)


def rotary_reference(qkv, pos, cos, sin, heads, head_dim):
    x = qkv[:, :heads * head_dim].view(-1, heads, 2, head_dim // 2)
    c, s = cos[pos][:, None], sin[pos][:, None]
    x1, x2 = x[:, :, 0].clone(), x[:, :, 1].clone()
    x[:, :, 0], x[:, :, 1] = x1 * c - x2 * s, x2 * c + x1 * s


def silu_mul_reference(gu):
    g, u = gu.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


def kv_write_reference(k_store, v_store, qkv, rows, slots, q_heads, kv_heads, head_dim):
    width = kv_heads * head_dim
    kv = qkv[rows, q_heads * head_dim:]
    k_store.view(-1, width)[slots] = kv[:, :width]
    v_store.view(-1, width)[slots] = kv[:, width:]


def paged_decode_reference(qkv, k_store, v_store, tables, lengths, q_heads, kv_heads, head_dim, scale):
    out = []
    for b, (table, n) in enumerate(zip(tables.tolist(), lengths.tolist())):
        k, v = (s[table].reshape(-1, kv_heads, head_dim)[:n].transpose(0, 1) for s in (k_store, v_store))
        q = qkv[b, :q_heads * head_dim].view(q_heads, 1, head_dim)
        o = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], scale=scale, enable_gqa=True)
        out.append(o.reshape(-1))
    return torch.stack(out)
