"""Decode cost, measured on the running engine: the page's "Measure" action.

Two sweeps on the engine's own runner, KV store and free blocks, between steps (serving
pauses meanwhile; the page announces it):

* decode step time over batch sizes 1..the engine's most slots (`max_slots`, whatever the live
  `slots` setting is: a lesson that serves on two slots still gets the whole curve) and context
  lengths, each point the median
  of a few forwards of `batch` synthetic requests that each hold `context` cached positions,
  next to the memory-bandwidth floor (an estimate: weights plus the batch's keys/values
  read once at the bandwidth measured at start);
* one new token at growing sequence lengths, with the KV cache (one position computed
  against cached keys) and without (the whole sequence recomputed, as `kv_cache` off does);
* a whole prompt's prefill at growing lengths (64..1024 tokens in one forward).

Every decode and prefill point carries the roofline's predicted time too (engine/timing/roofline.py:
the slower of its bytes at the measured bandwidth and its flops at the measured matmul rate,
an estimate), so the page draws step time against tokens per forward under both roofs.

`announce` and `run` act on the engine through its public attributes (runner, blocks, clock,
settings); the driver calls them on its thread. The synthetic requests take blocks from the
free list like any request and give them back, past the live KV-cache budget (a setting a lesson
lowers, not the store's size: the sweep measures the machine); points that need more free blocks
than there are (the others held by requests in flight) are skipped and said so, with the blocks
needed and free. Attention reads every block whatever it holds, so the timing is that of real
requests of that length.
"""
import contextlib
import statistics
import time

import torch

from ..events import Measure
from ..model.runner import Segment
from ..core.sequence import SamplingParams, Sequence

BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXTS = (128, 512, 1024)
KV_LENGTHS = (32, 64, 128, 256, 512)
PREFILL_LENGTHS = (64, 128, 256, 512, 1024)
REPEATS = 3


def plan(engine):
    """(batches, contexts, kv lengths, prefill lengths) this engine can sweep: batches up to the
    most slots it was started with (not the live `slots` setting), lengths within its context."""
    slots, max_context = engine.scheduler.max_slots, engine.max_context
    batches = [b for b in BATCHES if b < slots] + [slots]
    contexts = [c for c in CONTEXTS if c < max_context]
    lengths = [n for n in KV_LENGTHS if n < max_context]
    prompts = [n for n in PREFILL_LENGTHS if n <= max_context]
    return batches, contexts, lengths, prompts


def _total(batches, contexts, lengths, prompts):
    return len(batches) * len(contexts) + len(lengths) + len(prompts)


def announce(engine):
    """The `measure` event that announces the pause (`run` follows on the same thread)."""
    batches, contexts, lengths, prompts = plan(engine)
    return [Measure(t=engine.clock.now(), status="running", batches=batches, contexts=contexts,
                    points_total=_total(batches, contexts, lengths, prompts))]


def run(engine, publish=None):
    """Both sweeps on `engine`'s runner and free blocks; the requests in flight wait meanwhile.
    Returns the final `measure` event ("done", or "error" if a sweep raised: serving carries
    on). `publish` gets a "running" `measure` event after each point (what is timed so far and
    an estimate of the time left), so a page draws the sweep as it goes."""
    batches, contexts, lengths, prompts = plan(engine)
    clock, t0 = engine.clock, engine.clock.now()
    total = _total(batches, contexts, lengths, prompts)
    got = {"decode": [], "skipped": [], "kv": [], "prefill": []}

    def progress(**part):
        got.update({k: list(v) for k, v in part.items()})
        if publish is None:
            return
        done, now = sum(len(v) for v in got.values()), clock.now()
        # the rest at the pace so far: a rough guide (long recomputes come last), said as "about"
        eta = (now - t0) / done * (total - done) if done else None
        publish([Measure(t=now, status="running", batches=batches, contexts=contexts, decode=got["decode"],
                         kv=got["kv"], prefill=got["prefill"], skipped=got["skipped"], points_done=done,
                         points_total=total, eta_s=eta)])

    vocab, roof, pool = engine.bundle.model.config.vocab_size, engine.roofline, engine.blocks.pool
    skipped = []

    def skip(point):
        skipped.append(point)
        progress(skipped=skipped)

    try:
        with _whole_store(pool):
            decode = decode_sweep(engine.runner, pool, vocab, batches, contexts, _floor(engine), roof,
                                  progress=lambda d: progress(decode=d), skip=skip)
            kv = kv_sweep(engine.runner, pool, vocab, lengths, progress=lambda k: progress(kv=k), skip=skip)
            prefill = prefill_sweep(engine.runner, pool, vocab, prompts, roof,
                                    progress=lambda p: progress(prefill=p), skip=skip)
    except Exception as e:  # noqa: BLE001 -- a failed sweep is reported; serving carries on
        return [Measure(t=clock.now(), status="error", batches=batches, contexts=contexts,
                        message=f"{type(e).__name__}: {e}")]
    return [Measure(t=clock.now(), status="done", batches=batches, contexts=contexts, decode=decode, kv=kv,
                    prefill=prefill, skipped=skipped, seconds=clock.now() - t0,
                    weights=engine.settings.now.scheduling.weights)]


def _floor(engine):
    """floor(batch, context, weight_bytes): the bandwidth floor of a decode step, the weights it
    read plus the batch's keys/values, read once at the bandwidth measured at start."""
    bps = engine.bandwidth["weight_bytes"] / engine.bandwidth["floor_s"]
    return lambda batch, context, weight_bytes: (weight_bytes + batch * context * engine.bytes_per_token) / bps


@contextlib.contextmanager
def _whole_store(pool):
    """The sweep's blocks may come from the whole store: the live budget (`cache_tokens`, which a
    lesson lowers to teach preemption) is lifted while it runs and put back after."""
    budget, pool.block_budget = pool.block_budget, pool.capacity
    try:
        yield
    finally:
        pool.block_budget = budget


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

    def fits(self, batch, tokens):
        """Whether `batch` sequences of `tokens` can be had from the free blocks."""
        return self.blocks.can_allocate(batch * self.blocks.blocks_for(tokens))

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


def _skipped(sweep, blocks, batch, tokens, held):
    """The SkippedPoint for `batch` sequences of `held` positions each (`tokens`: the point's length
    as the page names it) that the free blocks could not hold."""
    return {"sweep": sweep, "batch": batch, "tokens": tokens, "blocks_needed": batch * blocks.blocks_for(held),
            "blocks_free": max(0, min(len(blocks.free), blocks.block_budget - blocks.used))}


def decode_sweep(runner, blocks, vocab, batches, contexts, floor, roofline, repeats=REPEATS, progress=None,
                 skip=None):
    """[{batch, context, step_s, floor_s, predicted_s, bound}]. `progress(points)` is called after each
    timed point and `skip(SkippedPoint)` for each the free blocks cannot hold, so pages draw them as
    they come."""
    points = []
    for context in contexts:
        for batch in batches:
            with _Synthetic(blocks, vocab) as syn:
                if not syn.fits(batch, context + 1):
                    skip and skip(_skipped("decode", blocks, batch, context, context + 1))
                    continue
                seqs = [syn.seq(context + 1) for _ in range(batch)]
                segments = [Segment(s, context, 1, cached=True, logits=True) for s in seqs]
                step = _timed(lambda: runner.forward(segments), repeats)
            read = runner.path.weight_bytes      # the weights path this forward took (engine/model/linears.py)
            predicted_s, bound = roofline.predict_segments(segments, read)
            points.append({"batch": batch, "context": context, "step_s": step,
                           "floor_s": floor(batch, context, read), "predicted_s": predicted_s, "bound": bound})
            progress and progress(points)
    return points


def prefill_sweep(runner, blocks, vocab, lengths, roofline, repeats=2, progress=None, skip=None):
    """[{tokens, step_s, predicted_s, bound}]: one whole prompt of each length in one forward
    (its blocks from the free list; a length they cannot hold goes to `skip`); `progress(rows)` after each."""
    rows = []
    for n in lengths:
        with _Synthetic(blocks, vocab) as syn:
            seq = syn.seq(n)
            if seq is None:
                skip and skip(_skipped("prefill", blocks, 1, n, n))
                continue
            segments = [Segment(seq, 0, n, cached=True, logits=True)]
            step = _timed(lambda: runner.forward(segments), repeats)
        predicted_s, bound = roofline.predict_segments(segments, runner.path.weight_bytes)
        rows.append({"tokens": n, "step_s": step, "predicted_s": predicted_s, "bound": bound})
        progress and progress(rows)
    return rows


def kv_sweep(runner, blocks, vocab, lengths, repeats=REPEATS, progress=None, skip=None):
    """[{tokens, cached_s, recompute_s}]: one new token at each sequence length; `progress(rows)`
    after each, `skip(SkippedPoint)` for a length the free blocks cannot hold."""
    rows = []
    for i, n in enumerate(lengths):
        with _Synthetic(blocks, vocab) as syn:
            seq = syn.seq(n + 1)
            if seq is None:
                skip and skip(_skipped("kv", blocks, 1, n + 1, n + 1))
                continue
            cached = _timed(lambda: runner.forward([Segment(seq, n, 1, cached=True, logits=True)]), repeats)
            # Once each (a 512-token recompute takes seconds on a CPU); warmed up at the first length.
            recompute = _timed(lambda: runner.forward([Segment(seq, 0, n + 1, cached=False, logits=True)]), 1,
                               warm=i == 0)
        rows.append({"tokens": n + 1, "cached_s": cached, "recompute_s": recompute})
        progress and progress(rows)
    return rows
