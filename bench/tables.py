"""Forward timings on the engine's own runner: prefill vs prompt length, decode step vs batch.

Timed at the `Runner` level (one forward, logits included), best of N, because these are
the figures the page charts: what one prefill or one decode step costs on this machine.
"""
import time

import torch

from engine.kv_cache import SlotKVStore
from engine.runner import Runner


def _best(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _ids(vocab, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n,), generator=g).tolist()


def prefill_table(bundle, lengths, repeats):
    """[{tokens, s, ms_per_token}] for one prompt of each length, from position 0."""
    cfg = bundle.model.config
    store = SlotKVStore(cfg, 1, max(lengths), bundle.dtype, bundle.device)
    runner = Runner(bundle.model, store)
    rows = []
    for n in lengths:
        ids = _ids(cfg.vocab_size, n)
        runner.prefill(0, ids[:8], 0)                                  # warm-up
        s = _best(lambda: runner.prefill(0, ids, 0), repeats if n <= 512 else max(1, repeats - 1))
        rows.append({"tokens": n, "s": s, "ms_per_token": 1e3 * s / n})
    return rows


def decode_table(bundle, batches, context, repeats):
    """[{batch, step_s, tokens_per_s}]: one decode step with every row holding `context` positions.

    One row is prefilled and copied into the others (the KV store's compaction copy), so
    building a batch of 32 costs one prefill, not 32."""
    cfg = bundle.model.config
    rows_needed = max(batches)
    store = SlotKVStore(cfg, rows_needed, context + 1, bundle.dtype, bundle.device)
    runner = Runner(bundle.model, store)
    runner.prefill(0, _ids(cfg.vocab_size, context), 0)
    for r in range(1, rows_needed):
        store.move_row(0, r, context)
    out = []
    for b in batches:
        rows, last, pos = list(range(b)), [200] * b, [context] * b
        runner.decode(rows, last, pos)                                  # warm-up
        s = _best(lambda: runner.decode(rows, last, pos), repeats)
        out.append({"batch": b, "step_s": s, "tokens_per_s": b / s})
    return out
