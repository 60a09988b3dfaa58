"""Decode cost, measured on the running engine: the page's "Measure" action.

Two sweeps on the engine's own runner, KV store and free blocks, between steps (serving
pauses meanwhile; the page announces it):

* decode step time over batch sizes 1..slots and context lengths, each point the median
  of a few forwards of `batch` synthetic requests that each hold `context` cached positions,
  next to the memory-bandwidth floor (an estimate: weights plus the batch's keys/values
  read once at the bandwidth measured at start);
* one new token at growing sequence lengths, with the KV cache (one position computed
  against cached keys) and without (the whole sequence recomputed, as `kv_cache` off does).

The synthetic requests take blocks from the free list like any request and give them back;
points that need more free blocks than there are are skipped and said so. Attention reads
every block whatever it holds, so the timing is that of real requests of that length.
"""
import statistics
import time

import torch

from .runner import Segment
from .sequence import SamplingParams, Sequence

BATCHES = (1, 2, 4, 8, 16)
CONTEXTS = (128, 512, 1024)
KV_LENGTHS = (32, 64, 128, 256, 512)
REPEATS = 3


def plan(max_slots, max_context):
    """(batches, contexts, kv lengths) this engine can sweep."""
    batches = [b for b in BATCHES if b < max_slots] + [max_slots]
    contexts = [c for c in CONTEXTS if c < max_context]
    lengths = [n for n in KV_LENGTHS if n < max_context]
    return batches, contexts, lengths


def _timed(fn, repeats, warm=True):
    if warm:
        fn()   # warm-up: first use of a shape allocates
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _Synthetic:
    """Synthetic sequences holding blocks from the engine's free list, released on exit."""

    def __init__(self, blocks, vocab):
        self.blocks, self.vocab, self.held = blocks, vocab, []

    def seq(self, tokens):
        table = self.blocks.allocate(self.blocks.blocks_for(tokens))
        if table is None:
            return None
        self.held.append(table)
        ids = torch.randint(100, self.vocab, (tokens,), generator=torch.Generator().manual_seed(tokens)).tolist()
        seq = Sequence(id="measure", source="load", prompt="", prompt_ids=ids, params=SamplingParams())
        seq.block_table = table
        return seq

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for table in self.held:
            self.blocks.release(table)
        self.held = []


def decode_sweep(runner, blocks, vocab, batches, contexts, floor, repeats=REPEATS, progress=None):
    """([{batch, context, step_s, floor_s}], [skipped point descriptions]). `progress()` is called
    after each point (timed or skipped), so pages can draw them as they come."""
    points, skipped = [], []
    for context in contexts:
        for batch in batches:
            with _Synthetic(blocks, vocab) as syn:
                seqs = [syn.seq(context + 1) for _ in range(batch)]
                if None in seqs:
                    skipped.append(f"batch {batch} × {context} tokens: needs "
                                   f"{batch * blocks.blocks_for(context + 1)} free KV blocks")
                    progress and progress(points, skipped)
                    continue
                segments = [Segment(s, context, 1, cached=True, logits=True) for s in seqs]
                step = _timed(lambda: runner.forward(segments), repeats)
            points.append({"batch": batch, "context": context, "step_s": step, "floor_s": floor(batch, context)})
            progress and progress(points, skipped)
    return points, skipped


def kv_sweep(runner, blocks, vocab, lengths, repeats=REPEATS, progress=None):
    """[{tokens, cached_s, recompute_s}]: one new token at each sequence length; `progress(rows)`
    after each."""
    rows = []
    for i, n in enumerate(lengths):
        with _Synthetic(blocks, vocab) as syn:
            seq = syn.seq(n + 1)
            if seq is None:
                continue
            cached = _timed(lambda: runner.forward([Segment(seq, n, 1, cached=True, logits=True)]), repeats)
            # Once each (a 512-token recompute takes seconds on a CPU); warmed up at the first length.
            recompute = _timed(lambda: runner.forward([Segment(seq, 0, n + 1, cached=False, logits=True)]), 1,
                               warm=i == 0)
        rows.append({"tokens": n + 1, "cached_s": cached, "recompute_s": recompute})
        progress and progress(rows)
    return rows
