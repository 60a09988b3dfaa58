"""`python -m bench.first_shape`: what the first forward of a new shape costs on this machine.

A forward's shape, for our runner (engine/model/runner.py), is what its kernels are chosen by: the
token rows packed into it (the M of every linear layer) and the rows that want logits (the
output head's). On a CPU in fp32 the linear layers run on oneDNN, which creates a kernel (a
"primitive") for each new M the first time it meets it and keeps it in a cache of its own,
global to the process. The step event's `first_shape` marks those forwards. Two measurements:

* wall time: each trial times a forward of a shape never run before in this process, then the
  same forward three times more; its extra cost is the first minus the median of those. Trials
  of each kind are interleaved round by round (a change in the machine's load touches them
  alike), with a control that runs a shape seen before (the noise floor). Then the model is
  loaded again with a new Runner, as engine/model/reload.py does, and the shapes seen are run again;
* oneDNN's own account: its verbose log (level 2) counts the primitives each forward created
  (cache misses) and the milliseconds that took, for new shapes and after the reload.

Prints the medians; docs/engine.md ("Cold starts") carries them.
"""
import argparse
from contextlib import contextmanager
import ctypes
import os
import random
import statistics
import sys
import tempfile
import time

import torch

from bench.tables import _ids, _seq, _setup
from bench.launch import load_bundle
from engine.model.runner import Runner, Segment

CONTEXT = 128


def _time(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def trial(fn, repeats=3):
    """(first forward's seconds, median of the repeats' seconds) of `fn`."""
    first = _time(fn)
    return first, statistics.median(_time(fn) for _ in range(repeats))


@contextmanager
def onednn_log():
    """oneDNN's verbose lines printed meanwhile (they go to the process's stdout: read from a file
    put in its place); yields the list they are added to on exit."""
    lines, libc = [], ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as f:
        os.dup2(f.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
                yield lines
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            lines += [ln for ln in f.read().splitlines() if ln.startswith("onednn_verbose")]


def created(fn):
    """(primitives oneDNN created, milliseconds it took creating them) during `fn()`."""
    with onednn_log() as lines:
        fn()
    misses = [float(ln.rsplit(",", 1)[1]) for ln in lines if "create:cache_miss" in ln]
    return len(misses), sum(misses)


def row(label, rows):
    extra = [1e3 * (f - r) for f, r in rows]
    first, rep = (statistics.median(1e3 * x[i] for x in rows) for i in (0, 1))
    q = statistics.quantiles(extra, n=4) if len(extra) > 1 else extra * 3
    return (f"{label:<40} {len(rows):>3} {statistics.median(extra):>8.1f} {q[0]:>7.1f} {q[2]:>7.1f}"
            f" {first:>9.1f} {rep:>8.1f}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.first_shape", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12, help="trials of each kind (default 12, at most 14)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rounds = min(args.rounds, 14)
    load = lambda: load_bundle(device="cpu", dtype="float32")   # noqa: E731
    bundle = load()
    blocks, store, runner = _setup(bundle, 2048)
    seq = _seq(_ids(bundle.model.config.vocab_size, 1024), blocks, 1024)
    rng = random.Random(args.seed)
    chunks = rng.sample(range(17, 96), rounds)            # prompt chunks of 17-95 tokens, one logit row
    longs = rng.sample(range(150, 600, 5), rounds)        # ... of 150-595
    batches = rng.sample(range(2, 16), rounds)            # decode steps of 2-15 rows (as many logit rows)

    def chunk(n):
        return lambda: runner.forward([Segment(seq, 0, n, cached=True, logits=True)])

    def decode(b):
        return lambda: runner.forward([Segment(seq, CONTEXT, 1, cached=True, logits=True) for _ in range(b)])

    very_first = trial(chunk(16))
    kinds = ("new: a prompt chunk of 17-95 tokens", "new: a prompt chunk of 150-595 tokens",
             "new: a decode step of 2-15 rows", "seen before (control)", "after a reload: seen before")
    got = {k: [] for k in kinds}
    for i in range(rounds):
        got[kinds[0]].append(trial(chunk(chunks[i])))
        got[kinds[2]].append(trial(decode(batches[i])))
        got[kinds[3]].append(trial(chunk(chunks[i - 1] if i else 16)))
        got[kinds[1]].append(trial(chunk(longs[i])))
    # oneDNN's account, on shapes none of the above ran: a chunk of 96-99 tokens, a decode of 16-19 rows
    new = [created(chunk(96 + i)) for i in range(4)] + [created(decode(16 + i)) for i in range(4)]
    t0 = time.perf_counter()
    again_bundle = load()
    runner = Runner(again_bundle.model, store, again_bundle.quant)   # engine/model/reload.py's swap
    reload_s = time.perf_counter() - t0
    again = [created(chunk(96)), created(decode(16))]
    for i in range(rounds):
        got[kinds[4]].append(trial(chunk(chunks[i])))
        got[kinds[4]].append(trial(decode(batches[i])))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; the process's first forward (16 tokens): "
          f"{1e3 * very_first[0]:.1f} ms, then {1e3 * very_first[1]:.1f} ms; reload {reload_s:.2f} s")
    print(f"{'forward':<40} {'n':>3} {'extra ms':>8} {'q1':>7} {'q3':>7} {'first ms':>9} {'next ms':>8}")
    for kind in kinds:
        print(row(kind, got[kind]))
    print("oneDNN primitives created (count, ms): new shapes", [(n, round(ms, 2)) for n, ms in new],
          "· after the reload, shapes seen before", [(n, round(ms, 2)) for n, ms in again])


if __name__ == "__main__":
    main()
