"""Builds the engine's C++ kernels (engine/model/kernels/csrc) into one shared library for torch.

`make run` and `make test` run `python -m engine.model.kernels.build` first; the engine also builds
on first use when the library is missing. The library's name carries a hash of the sources, the
compiler flags and torch's version, so an edited source or another torch gets a fresh build and
a stale one is never loaded. No -march flag: every instruction-set path is compiled for its own
target inside the library and picked at run time, so a library built on an AVX-512 Xeon runs on
an AVX2 EPYC (the machines here change processors between weeks) and anywhere else.
"""
import hashlib
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile

import torch
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "csrc").glob("*.cpp"))
BUILD = HERE / "build"          # git-ignored
FLAGS = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off", "-w",
         f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]


def compiler():
    """The C++ compiler to use ($CXX, else c++ or g++ on PATH), or None."""
    for name in filter(None, (os.environ.get("CXX"), "c++", "g++")):
        if shutil.which(name):
            return name
    return None


def library_path():
    h = hashlib.sha256(" ".join(FLAGS + [torch.__version__]).encode())
    for src in SOURCES:
        h.update(src.read_bytes())
    return BUILD / f"first_token_kernels-{h.hexdigest()[:16]}.so"


def build(quiet=False):
    """Compile the library if it is not built yet; return its path. Raises RuntimeError with the
    compiler's message when it cannot be built."""
    out = library_path()
    if out.exists():
        return out
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (install g++, or set CXX)")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    lib = Path(torch.__file__).parent / "lib"
    BUILD.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=BUILD)
    os.close(fd)
    cmd = [cxx, *FLAGS, *includes, *map(str, SOURCES), f"-L{lib}", "-lc10", "-ltorch_cpu",
           f"-Wl,-rpath,{lib}", "-o", tmp]
    if not quiet:
        print(f"building the engine's kernels ({', '.join(s.name for s in SOURCES)}), ~20 s", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{cxx} failed:\n{done.stderr[-2000:]}")
    os.replace(tmp, out)         # atomic: a concurrent build never leaves a half-written library
    for old in BUILD.glob("first_token_kernels-*.so"):
        if old != out:
            old.unlink(missing_ok=True)
    return out


if __name__ == "__main__":   # python -m engine.model.kernels is the usual way (it says what runs)
    try:
        print(build())
    except RuntimeError as e:
        print(f"the engine's kernels were not built: {e}\nthe engine will read dequantised fp32 weights",
              file=sys.stderr)
