"""A reference server built here: llama.cpp's `llama-server`, from the sources vendored in the
`llama-cpp-python` sdist, cached under First Token's cache dir.

Why from the sdist: it is the one source of llama.cpp that a package client (pip) can fetch, so
the build needs no git clone and no network beyond the package index. The binary is used by
observe mode's real-server run (issue 23) and by benchmarks that compare against llama.cpp.

    python -m bench.reference --build          # build once (~20-25 min on 2 cores), then cached
    python -m bench.reference --path           # print the binary's path (exit 1 if not built)
    python -m bench.reference --serve [--port]  # start it on 127.0.0.1 on the bundled GGUF

`build()` skips when the binary is present; the log of a build is `<dir>/build.log`.
"""
import argparse
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tarfile
import tempfile

from engine.model.loading import cache_root, default_model_path

SDIST = "llama-cpp-python"


def ref_dir():
    return cache_root() / "reference" / "llama.cpp"


def binary_path():
    return ref_dir() / "llama-server"


def _run(cmd, log, **kw):
    log.write(f"$ {' '.join(map(str, cmd))}\n")
    log.flush()
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, **kw)


def build(jobs=2, nice=19, force=False):
    """Download the sdist, build `llama-server` (CPU, no curl) and copy it into `ref_dir()`.

    Returns the binary's path. Runs the compiler under `nice` because the machine is shared."""
    out = binary_path()
    if out.is_file() and not force:
        return out
    ref_dir().mkdir(parents=True, exist_ok=True)
    with open(ref_dir() / "build.log", "a") as log, tempfile.TemporaryDirectory(dir=ref_dir()) as tmp:
        tmp = Path(tmp)
        # Only this package as source: `:all:` would build its build backends from source too.
        _run([sys.executable, "-m", "pip", "download", "--no-binary", SDIST, "--no-deps", SDIST, "-d", tmp], log)
        archive = next(tmp.glob(f"{SDIST.replace('-', '_')}-*.tar.gz"), None) or next(tmp.glob("*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        src = next(p for p in tmp.iterdir() if p.is_dir()) / "vendor" / "llama.cpp"
        (ref_dir() / "VERSION").write_text(archive.name + "\n")
        nice_cmd = ["nice", "-n", str(nice)]
        _run(nice_cmd + ["cmake", "-S", src, "-B", tmp / "build", "-DCMAKE_BUILD_TYPE=Release",
                         "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
                         "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"], log)
        _run(nice_cmd + ["cmake", "--build", tmp / "build", "--target", "llama-server", "-j", str(jobs)], log)
        built = next((tmp / "build").rglob("llama-server"))
        shutil.copy2(built, out.with_suffix(".part"))
        os.replace(out.with_suffix(".part"), out)
    return out


def serve_cmd(port=8091, slots=4, threads=1, model=None):
    """The exact command line used to observe it (docs/ecosystem.md quotes this)."""
    return [str(binary_path()), "-m", str(model or default_model_path()), "--host", "127.0.0.1",
            "--port", str(port), "--metrics", "--slots", "-np", str(slots), "-t", str(threads),
            "-c", str(2048 * slots)]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.reference", description=__doc__.split("\n")[0])
    p.add_argument("--build", action="store_true", help="build llama-server if not cached")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--path", action="store_true", help="print the binary path (exit 1 if absent)")
    p.add_argument("--serve", action="store_true", help="run it on 127.0.0.1 on the bundled GGUF")
    p.add_argument("--port", type=int, default=8091)
    a = p.parse_args(argv)
    if a.build:
        print(build(jobs=a.jobs, force=a.force))
    if a.path:
        print(binary_path())
        return 0 if binary_path().is_file() else 1
    if a.serve:
        if not binary_path().is_file():
            p.error("not built: run `python -m bench.reference --build` first")
        os.execv(str(binary_path()), serve_cmd(a.port))
    if not (a.build or a.path or a.serve):
        p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
