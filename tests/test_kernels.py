"""The fused 4-bit linear (engine/kernels) against fp32 matmul on the dequantised blocks, on every
instruction-set path this CPU runs, and the blocks' own layout (engine/weights.py)."""
import os
import subprocess
import sys

import pytest
import torch

from engine import kernels, weights
from engine.weights import Q4_1, Q8_0, QuantWeight

from helpers import ROOT

KINDS = (Q4_1, Q8_0)
# odd shapes: one block, an odd number of blocks (the AVX-512 path's tail), rows not a multiple of any tile
SHAPES = ((1, 32), (37, 96), (130, 160), (576, 576))


def random_blocks(kind, rows, cols, seed):
    """Random file-layout blocks with sane scales (fp16 d > 0; Q4_1's m < 0, as real minimums are)."""
    g = torch.Generator().manual_seed(seed)
    nb = cols // 32
    b = torch.randint(0, 256, (rows, nb, weights.BLOCK_BYTES[kind]), dtype=torch.uint8, generator=g)
    b[..., 0:2] = (torch.rand(rows, nb, 1, generator=g) * 0.02 + 1e-3).half().view(torch.uint8)
    if kind == Q4_1:
        b[..., 2:4] = (-torch.rand(rows, nb, 1, generator=g) * 0.1).half().view(torch.uint8)
    return b.reshape(rows, -1)


def relative_error(y, ref):
    return ((y - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def isas():
    assert kernels.available(), kernels.describe()   # make test builds them; a compiler is on every machine here
    return kernels.status()["isas"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_quant_linear_equals_fp32_matmul_on_the_dequantised_blocks(isas, kind, rows, cols):
    w = QuantWeight.from_blocks(kind, random_blocks(kind, rows, cols, seed=rows))
    dense = w.dequantise()
    for m in range(1, 65):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
        ref = x @ dense.T
        for isa in isas:
            y = kernels.quant_linear(x, w, isa)
            assert y.shape == (m, rows)
            assert relative_error(y, ref) < 1e-5, (isa, m)


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


@pytest.mark.parametrize("kind", KINDS)
def test_quantise_rounds_to_the_nearest_level(kind):
    """Within half a step of the block's grid (Q4_1: 15 steps from min to max; Q8_0: 127 from 0 to
    the largest magnitude), plus the fp16 rounding of the scales."""
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    w = weights.quantise(x, kind)
    assert w.nbytes == 8 * 2 * weights.BLOCK_BYTES[kind]
    blocks = x.reshape(8, 2, 32)
    step = (blocks.amax(2) - blocks.amin(2)) / 15 if kind == Q4_1 else blocks.abs().amax(2) / 127
    err = (w.dequantise() - x).reshape(8, 2, 32).abs().amax(2)
    assert (err <= step * 0.5 + 2e-3).all()


def test_bad_shapes_are_refused_clearly(isas):
    w = QuantWeight.from_blocks(Q4_1, random_blocks(Q4_1, 4, 64, seed=0))
    with pytest.raises(RuntimeError, match="x has 32 columns"):
        kernels.quant_linear(torch.randn(2, 32), w)
    with pytest.raises(RuntimeError, match="fp32"):
        kernels.quant_linear(torch.randn(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="blocks of 32"):
        weights.quantise(torch.randn(2, 40), Q4_1)


def test_without_kernels_the_engine_reads_fp32_and_says_so():
    """FIRST_TOKEN_KERNELS=off (as on a machine with no compiler): one line says so, and the
    tiny model with blocks offers only the dequantised copy."""
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from engine import kernels; from engine.engine import Engine; from helpers import tiny_quant_bundle\n"
            "print(kernels.describe())\n"
            "e = Engine(tiny_quant_bundle())\n"
            "print(e.settings['weights'], e.specs['weights'].choices, list(e.hello().weights['formats']))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FIRST_TOKEN_KERNELS": "off"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == ("kernels: not available (turned off (FIRST_TOKEN_KERNELS=off)); "
                        "linear layers read dequantised fp32 weights")
    assert lines[-1] == "dequantised ('dequantised',) ['dequantised']"
