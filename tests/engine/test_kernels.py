"""The fused linear on ggml's blocks (engine/model/kernels) against fp32 matmul on the dequantised
blocks, on every instruction-set path this CPU runs, for every block type it reads; the blocks'
own layout (engine/model/weights.py), and their dequantisation against the `gguf` package's."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from engine.model import kernels, weights
from engine.model.weights import BF16, F16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QuantWeight, random_blocks

from helpers import ROOT

KINDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16)
IDS = [weights.KIND_NAMES[k] for k in KINDS]
# odd shapes: one block, an odd number of blocks (the AVX-512 path's tail), rows not a multiple of any tile
SHAPES = ((1, 32), (37, 96), (130, 160), (576, 576))
# the K-quants' rows hold super-blocks of 256: one, an odd number, and ffn_down's 1536 of a small model
K_SHAPES = ((1, 256), (37, 768), (130, 512), (200, 1536))


def shapes(kind):
    return K_SHAPES if weights.SPECS[kind].qk == 256 else SHAPES


def gguf_dequantised(kind, blocks, cols):
    """What the gguf package's reference dequantiser makes of file blocks: fp32 [rows, cols]."""
    return torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType(kind)).astype(np.float32)).reshape(-1, cols)


def relative_error(y, ref):
    return ((y - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def isas():
    assert kernels.available(), kernels.describe()   # make test builds them; a compiler is on every machine here
    return kernels.status()["isas"]


# The portable path's tiles loop over their rows one by one whatever their number (and the tiles'
# split is the vector paths' too): a few row counts test it, every count from 1 to 64 the others.
PORTABLE_ROWS = (1, 2, 3, 5, 13, 24, 25, 64)


def every_shape():
    return [(k, r, c) for k in KINDS for r, c in shapes(k)]


@pytest.mark.parametrize("kind,rows,cols", every_shape(),
                         ids=[f"{weights.KIND_NAMES[k]}-{r}x{c}" for k, r, c in every_shape()])
def test_quant_linear_equals_fp32_matmul_on_the_dequantised_blocks(isas, kind, rows, cols):
    """Rows 1-64: a decode batch's tiles, each unpacking a block once for all its rows."""
    w = QuantWeight.from_blocks(kind, random_blocks(kind, rows, cols, seed=rows))
    dense = w.dequantise()
    for m in range(1, 65):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
        ref = x @ dense.T
        for isa in isas:
            if isa == "portable" and m not in PORTABLE_ROWS:
                continue
            y = kernels.quant_linear(x, w, isa)
            assert y.shape == (m, rows)
            assert relative_error(y, ref) < 1e-5, (isa, m)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_a_prompt_chunk_of_hundreds_of_rows_equals_fp32_matmul(isas, kind):
    """Past one tile of rows each group is unpacked into an fp32 panel a slice of K at a time and
    the rows come in chunks of 96: 97 and 300 rows cross those chunks, 576 columns three slices
    (the last a partial one), a K-quant's 768 three super-blocks."""
    cols = 768 if weights.SPECS[kind].qk == 256 else 576
    w = QuantWeight.from_blocks(kind, random_blocks(kind, 45, cols, seed=3))
    dense = w.dequantise()
    for m in (97, 300):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
        for isa in isas:
            if isa != "portable" or m == 97:
                assert relative_error(kernels.quant_linear(x, w, isa), x @ dense.T) < 1e-5, (isa, m)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_blocks_mean_what_the_gguf_packages_dequantiser_says(kind):
    """The fp32 matrix of `dequantise` (every row, or some rows) and of the kernel's row lookup is
    gguf.quants.dequantize's, bit for bit, on random blocks of every type (K-quants: random scale
    bytes, so every 6-bit scale and minimum pattern occurs)."""
    for rows, cols in shapes(kind)[:3]:
        raw = random_blocks(kind, rows, cols, seed=rows + 7)
        want = gguf_dequantised(kind, raw, cols)
        w = QuantWeight.from_blocks(kind, raw)
        assert torch.equal(w.dequantise(), want)
        ids = torch.tensor([rows - 1, 0, rows // 2])
        assert torch.equal(w.dequantise(ids), want[ids])
        assert torch.equal(kernels.quant_rows(w, ids), want[ids])


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_the_groups_of_16_hold_the_files_blocks_unchanged(kind):
    """Regrouping 16 rows at a time moves bytes only: the file's blocks come back byte for byte,
    rows taken or stacked are the same rows, and a row lookup (the embedding's) equals the
    dequantised matrix's row exactly."""
    cols = 256 if weights.SPECS[kind].qk == 256 else 96
    raw = random_blocks(kind, 37, cols, seed=5)
    w = QuantWeight.from_blocks(kind, raw)
    assert torch.equal(w.file_blocks(), raw)
    order = torch.randperm(37, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w.take_rows(order).dequantise(), w.dequantise()[order])
    both = weights.stack_rows([w, QuantWeight.from_blocks(kind, random_blocks(kind, 32, cols, seed=6))])
    assert both.rows == 69 and torch.equal(both.dequantise()[:37], w.dequantise())
    ids = torch.tensor([0, 36, 17, 17, 5])
    assert torch.equal(kernels.quant_rows(w, ids), w.dequantise()[ids])
    assert torch.equal(w.dequantise(ids), w.dequantise()[ids])
    with pytest.raises(RuntimeError, match="outside 0..36"):
        kernels.quant_rows(w, torch.tensor([37]))


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_int8_activations_equal_their_reference_with_the_same_bits_on_every_path(isas, rows, cols):
    """The `activations: int8` product (Q4_1 only): x rounded per row and block as llama.cpp rounds
    it, integer dot products, two FMAs a block; every path (VNNI, AVX2, portable) gives the same
    bits, and the plain-torch reference agrees to float rounding."""
    w = QuantWeight.from_blocks(Q4_1, random_blocks(Q4_1, rows, cols, seed=rows + 1))
    for m in (1, 2, 3, 4, 5, 12, 13, 30, 64):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 3
        outs = [kernels.quant_linear_int8(x, w, isa) for isa in isas]
        assert relative_error(outs[0], kernels.quant_linear_int8_reference(x, w)) < 1e-5, m
        assert all(torch.equal(o, outs[0]) for o in outs), m
        assert relative_error(outs[0], x @ w.dequantise().T) > 1e-5     # another arithmetic: not fp32's
    with pytest.raises(RuntimeError, match="is not Q4_1"):
        kernels.quant_linear_int8(torch.randn(1, 64), QuantWeight.from_blocks(Q8_0, random_blocks(Q8_0, 4, 64, 0)))


def test_int8_rows_round_as_llamacpp():
    """Per block of 32: d = max|x| / 127 (stored as fp16), q = round(x * 127 / max|x|) with halves to
    even (llama.cpp's x86 paths), s = d * sum(q) (fp16); an all-zero block is all zeros."""
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([254.0, -127.0, 1.0, 5.0])     # 127 / 254 = 0.5 exactly: -63.5 -> -64, 0.5 -> 0, 2.5 -> 2
    q, d, s = kernels.int8_rows_reference(x)
    assert q[0, 0, :4].tolist() == [127, -64, 0, 2] and q[0, 1].abs().sum() == 0
    assert d[0].tolist() == [2.0, 0.0] and s[0, 0].item() == 65 * 2.0
    w = QuantWeight.from_blocks(Q4_1, random_blocks(Q4_1, 16, 64, seed=9))
    dw, mw, qw = w._parts()
    want = (dw[:, 0] * 2.0 * (qw[:, 0, :4] * torch.tensor([127.0, -64, 0, 2])).sum(-1) + mw[:, 0] * 130.0)
    assert torch.allclose(kernels.quant_linear_int8(x, w)[0], want, rtol=1e-6)   # the zero block adds m * 0
    peak = kernels.int8_peak(0.05)        # the int8 path's rate, measured (how high is this machine's business)
    assert 0 < peak < float("inf")


def test_every_path_this_cpu_should_have_is_built(isas):
    """The portable path always; AVX2 and AVX-512 whenever the CPU has them (read from /proc)."""
    flags = set(open("/proc/cpuinfo").read().split())
    assert "portable" in isas
    assert ("avx2" in isas) == ({"avx2", "fma", "f16c"} <= flags)
    assert ("avx512" in isas) == ({"avx512f", "avx512bw", "avx512vl"} <= flags and "avx2" in isas)
    assert kernels.status()["isa"] == isas[-1]     # the widest one is used


def test_a_block_means_what_ggml_says():
    """One Q4_1 block built by hand: weight j = d * q_j + m, q_j the low nibble of byte j for
    j < 16 and the high nibble of byte j - 16 after; one Q8_0 block: d * int8."""
    d, m = torch.tensor([0.5]).half(), torch.tensor([-1.0]).half()
    qs = torch.arange(16, dtype=torch.uint8) | ((15 - torch.arange(16, dtype=torch.uint8)) << 4)
    block = torch.cat([d.view(torch.uint8), m.view(torch.uint8), qs])[None]
    w = QuantWeight.from_blocks(Q4_1, block).dequantise()[0]
    expect = [0.5 * j - 1 for j in range(16)] + [0.5 * (15 - j) - 1 for j in range(16)]
    assert w.tolist() == expect
    q8 = torch.arange(-16, 16, dtype=torch.int8)
    w8 = QuantWeight.from_blocks(Q8_0, torch.cat([d.view(torch.uint8), q8.view(torch.uint8)])[None]).dequantise()[0]
    assert w8.tolist() == [0.5 * q for q in range(-16, 16)]


# the grid of each type gguf quantises: (levels from min to max, or from 0 to the largest magnitude)
GRIDS = {Q4_1: ("range", 15), Q5_1: ("range", 31), Q8_0: ("max", 127), Q4_0: ("max", 8), Q5_0: ("max", 16)}


@pytest.mark.parametrize("kind", list(GRIDS), ids=[weights.KIND_NAMES[k] for k in GRIDS])
def test_quantise_rounds_to_the_nearest_level(kind):
    """Within half a step of the block's grid, plus the fp16 rounding of the scales (gguf rounds
    against the unrounded ones; the minimum's alone is up to 1e-3 at |m| ~ 2.5); Q4_0/Q5_0's grid
    runs from -8 or -16 steps to 7 or 15: the largest magnitude's opposite lies a step past the
    last level."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    w = weights.quantise(x, kind)
    assert w.nbytes == 16 * 2 * weights.BLOCK_BYTES[kind]      # 8 rows padded to a group of 16 with zero blocks
    blocks = x.reshape(8, 2, 32)
    span, levels = GRIDS[kind]
    step = ((blocks.amax(2) - blocks.amin(2)) if span == "range" else blocks.abs().amax(2)) / levels
    err = (w.dequantise() - x).reshape(8, 2, 32).abs().amax(2)
    assert (err <= step * (1.0 if kind in (Q4_0, Q5_0) else 0.5) + 4e-3).all()
    assert torch.equal(w.dequantise(), gguf_dequantised(kind, w.file_blocks(), 64))


def test_a_gguf_tensor_is_kept_as_stored_where_a_kernel_reads_it():
    """`stored`: the loader's question. A matrix of a type with a kernel becomes its blocks; a norm
    (one dimension), an F16 matrix whose rows are not whole runs of 32, and a type without a
    kernel (Q2_K) stay for the caller to dequantise; the K-quants have no quantiser here."""
    raw = random_blocks(Q6_K, 3, 512, seed=1)
    w = weights.stored(Q6_K, raw.reshape(-1), (3, 512))
    assert (w.kind, w.rows, w.cols, w.name) == (Q6_K, 3, 512, "Q6_K")
    assert weights.stored(F16, torch.zeros(2 * 48, dtype=torch.uint8), (48,)) is None
    assert weights.stored(F16, torch.zeros(2 * 2 * 48, dtype=torch.uint8), (2, 48)) is None
    assert weights.stored(10, torch.zeros(84, dtype=torch.uint8), (1, 256)) is None
    with pytest.raises(ValueError, match="no quantiser for block type Q4_K"):
        weights.quantise(torch.randn(2, 256), Q4_K)


def test_bad_shapes_are_refused_clearly(isas):
    w = QuantWeight.from_blocks(Q4_1, random_blocks(Q4_1, 4, 64, seed=0))
    with pytest.raises(RuntimeError, match="x has 32 columns"):
        kernels.quant_linear(torch.randn(2, 32), w)
    with pytest.raises(RuntimeError, match="fp32"):
        kernels.quant_linear(torch.randn(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="blocks of 32"):
        weights.quantise(torch.randn(2, 40), Q4_1)
    with pytest.raises(RuntimeError, match="has no kernel here"):
        torch.ops.first_token.quant_linear(torch.randn(2, 64), w.data, 10, 4, 0)


def test_without_kernels_the_engine_reads_fp32_and_says_so():
    """FIRST_TOKEN_KERNELS=off (as on a machine with no compiler): one line says so, the tiny
    model with blocks offers only the dequantised copy, and transformers' decoder runs it (the
    path a GPU takes too), greedy still equal to `generate`."""
    code = ("import sys; sys.path[:0] = ['tests', 'tests/engine']\n"
            "from engine.model import kernels; from engine.core.engine import Engine; from helpers import tiny_quant_bundle\n"
            "from stepping import Run; from test_engine import PROMPTS\n"
            "print(kernels.describe())\n"
            "b = tiny_quant_bundle(); e = Engine(b); run = Run(e)\n"
            "ids = [run.add(p, max_new_tokens=8, temperature=0.0, ignore_eos=True) for p in PROMPTS[:3]]\n"
            "run.until_idle()\n"
            "from helpers import reference\n"
            "print('fused', e.runner.fused is not None, 'equal', all(run.tokens(i) == reference(b, p, 8) for i, p in zip(ids, PROMPTS)))\n"
            "print(e.settings.now.scheduling.weights, e.specs['weights'].choices, list(e.hello().weights['formats']))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FIRST_TOKEN_KERNELS": "off"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == ("kernels: not available (turned off (FIRST_TOKEN_KERNELS=off)); "
                        "linear layers read dequantised fp32 weights")
    assert lines[-2] == "fused False equal True"
    assert lines[-1] == "dequantised ('dequantised',) ['dequantised']"


# ---- the fused ops around the linear layers (csrc/fused.cpp) against their torch references ----
OPS = torch.ops.first_token


def close(a, b, tol=1e-5):
    return relative_error(a, b) < tol


def test_norms_rotary_and_silu_equal_their_references(isas):
    g = torch.Generator().manual_seed(0)
    h, x, w = (torch.randn(7, 96, generator=g) for _ in range(3))
    w = w[0].contiguous()
    assert close(OPS.rms_norm(h, w, 1e-5), kernels.rms_norm_reference(h, w, 1e-5))
    r1, r2 = h.clone(), h.clone()
    assert close(OPS.add_rms_norm(r1, x, w, 1e-5), kernels.add_rms_norm_reference(r2, x, w, 1e-5))
    assert torch.equal(r1, r2)                       # the residual is updated in place, the same way
    heads, d = 3, 32                                 # 2 query heads and 1 key head rotated; v left alone
    qkv = torch.randn(5, (heads + 1) * d, generator=g)
    pos = torch.tensor([0, 3, 4, 100, 7])
    cos, sin = torch.rand(128, d // 2, generator=g), torch.rand(128, d // 2, generator=g)
    a, b = qkv.clone(), qkv.clone()
    OPS.rotary_(a, pos, cos, sin, heads, d)
    kernels.rotary_reference(b, pos, cos, sin, heads, d)
    assert close(a, b) and torch.equal(a[:, heads * d:], qkv[:, heads * d:])
    gu = torch.randn(4, 2 * 53, generator=g) * 6              # 53: a tail past the vectors; large |g| too
    assert close(OPS.silu_mul(gu), kernels.silu_mul_reference(gu))
    with pytest.raises(RuntimeError, match="beyond the table"):
        OPS.rotary_(a, torch.tensor([0, 0, 0, 0, 128]), cos, sin, heads, d)


@pytest.mark.parametrize("path", ["avx2", "portable"])
def test_the_fused_ops_lower_paths_equal_their_references_too(isas, path):
    """The fused ops pick their path when the library loads (FIRST_TOKEN_ISA caps it): the tests
    above run again in a process on each lower path this CPU has."""
    if path not in isas:
        pytest.skip(f"this CPU has no {path} path")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "norms_rotary or paged_decode_reads"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "FIRST_TOKEN_ISA": path})
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.parametrize("d", [24, 32, 64])   # 24: no vector path (the plain loops); 64: SmolLM2's heads
@pytest.mark.parametrize("lengths", [[1], [5, 17, 33], [64, 2, 40, 16]])
def test_paged_decode_reads_the_blocks_in_place_like_sdpa_on_a_gathered_copy(isas, lengths, d):
    """Grouped-query attention (6 query heads, 2 key heads) over scattered blocks of 16 slots."""
    g = torch.Generator().manual_seed(len(lengths))
    q_heads, kv_heads, bs, blocks = 6, 2, 16, 20
    k_store, v_store = (torch.randn(blocks + 1, bs, kv_heads, d, generator=g) for _ in range(2))
    nb = max(-(-n // bs) for n in lengths)
    tables = torch.stack([torch.randperm(blocks, generator=g)[:nb] for _ in lengths])
    lengths_t = torch.tensor(lengths)
    qkv = torch.randn(len(lengths) + 2, (q_heads + 2 * kv_heads) * d, generator=g)   # 2 more rows: a chunk
    args = (qkv, k_store, v_store, tables, lengths_t, q_heads, kv_heads, d, d ** -0.5)
    assert close(OPS.paged_decode(*args), kernels.paged_decode_reference(*args))
    rows, slots = torch.arange(len(lengths)), tables[:, 0] * bs + 3
    ks, vs, kr, vr = k_store.clone(), v_store.clone(), k_store.clone(), v_store.clone()
    OPS.kv_write_(ks, vs, qkv, rows, slots, q_heads, kv_heads, d)
    kernels.kv_write_reference(kr, vr, qkv, rows, slots, q_heads, kv_heads, d)
    assert torch.equal(ks, kr) and torch.equal(vs, vr) and not torch.equal(ks, k_store)
    with pytest.raises(RuntimeError, match="beyond its table"):
        OPS.paged_decode(qkv, k_store, v_store, tables, lengths_t + nb * bs, q_heads, kv_heads, d, 1.0)
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.kv_write_(ks, vs, qkv, rows, slots + 10_000, q_heads, kv_heads, d)
