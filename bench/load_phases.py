"""Where a model's start goes: wall and CPU seconds of each phase of engine/model/loading.py `load`
(its own progress messages), a first start into an empty cache, then a later one from it, each in a
fresh process (imports counted). CPU seconds are the figure to compare on a shared machine: wall
time there mostly measures the other processes.

    python -m bench.load_phases --model FILE [--cache DIR]   # DIR: emptied first (default: a temp dir)
"""
import argparse
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile

ONE_START = """
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
import torch
from engine.model import loading
last = [t0, c0]
def phase(name):
    now, cpu = time.perf_counter(), time.process_time()
    print(f"  {now - last[0]:7.2f} s wall {cpu - last[1]:7.2f} s cpu  until: {name}", flush=True)
    last[:] = [now, cpu]
phase("imports done")
b = loading.load(sys.argv[1], device="cpu", dtype="float32", dense=False, progress=lambda msg, frac: phase(msg))
print(f"  total {time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s cpu "
      f"({'config and tokenizer from the cache' if b.from_cache else 'first start'}, {torch.get_num_threads()} threads)")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--cache", help="the cache directory to use (emptied first)")
    args = ap.parse_args()
    cache = Path(args.cache or tempfile.mkdtemp(prefix="first-token-cache-"))
    shutil.rmtree(cache, ignore_errors=True)
    root = Path(__file__).resolve().parent.parent
    for start in ("first start (empty cache)", "later start"):
        print(f"{start}; load average {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run([sys.executable, "-c", ONE_START, args.model], cwd=root, check=True,
                       env={**os.environ, "FIRST_TOKEN_CACHE": str(cache)})


if __name__ == "__main__":
    main()
