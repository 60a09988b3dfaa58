"""Forward timings on the engine's own runner: prefill vs prompt length, decode step vs batch,
and what reading keys/values from paged blocks costs against contiguous rows.

Timed at the `Runner` level (one forward, logits included), best of N, because these are
the figures the page charts: what one prefill or one decode step costs on this machine. The
runner reads what the engine reads by default: the file's blocks where the model has them.
Each row says the bytes of weights its forward read (`weight_bytes`, for the roofline).
"""
import time

import torch
import torch.nn.functional as F

from engine.core.kv_cache import BlockPool, PagedKVStore, head_dim, kv_heads
from engine.model.runner import Runner, Segment, _gather, synchronize
from engine.core.sequence import SamplingParams, Sequence


def _best(fn, repeats, device="cpu"):
    """Best of `repeats` calls; on CUDA each timed from an idle GPU to the GPU finished."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _ids(vocab, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n,), generator=g).tolist()


def _setup(bundle, tokens, block_size=16):
    blocks = BlockPool(block_size, -(-tokens // block_size) + 1)
    store = PagedKVStore(bundle.model.config, blocks.capacity, block_size, bundle.dtype, bundle.device)
    return blocks, store, Runner(bundle.model, store, bundle.quant)


def _seq(ids, blocks, tokens):
    seq = Sequence(id="bench", source="load", prompt="", prompt_ids=ids, params=SamplingParams())
    seq.block_table = blocks.allocate(blocks.blocks_for(tokens))
    return seq


def prefill_table(bundle, lengths, repeats):
    """[{tokens, s, ms_per_token}] for one prompt of each length, from position 0."""
    vocab = bundle.model.config.vocab_size
    blocks, _, runner = _setup(bundle, max(lengths))
    rows = []
    for n in lengths:
        seq = _seq(_ids(vocab, n), blocks, n)
        runner.forward([Segment(seq, 0, min(8, n), cached=True, logits=True)])  # warm-up
        s = _best(lambda: runner.forward([Segment(seq, 0, n, cached=True, logits=True)]),
                  repeats if n <= 512 else max(1, repeats - 1))
        blocks.release(seq.block_table)
        rows.append({"tokens": n, "s": s, "ms_per_token": 1e3 * s / n, "weight_bytes": runner.path.weight_bytes})
    return rows


def decode_table(bundle, batches, context, repeats):
    """[{batch, step_s, tokens_per_s}]: one decode step with every row holding `context` positions.

    One prompt is prefilled; the other rows share its blocks (as a prefix cache hit would),
    so building a batch of 32 costs one prefill, not 32. Each row reads `context` keys."""
    vocab = bundle.model.config.vocab_size
    blocks, _, runner = _setup(bundle, context + 1)
    seq = _seq(_ids(vocab, context) + [200], blocks, context + 1)
    runner.forward([Segment(seq, 0, context, cached=True, logits=False)])
    out = []
    for b in batches:
        rows = [Segment(seq, context, 1, cached=True, logits=True) for _ in range(b)]
        runner.forward(rows)                                            # warm-up
        s = _best(lambda: runner.forward(rows), repeats)
        out.append({"batch": b, "step_s": s, "tokens_per_s": b / s, "weight_bytes": runner.path.weight_bytes})
    return out


def kv_read_table(bundle, batch, contexts, repeats, block_size=16):
    """[{context, batch, paged_s, contiguous_s}]: the decode attention of one step over all
    layers, reading keys/values gathered from scattered blocks (what the engine does) vs
    straight from contiguous per-request rows (the slot-major store it replaced). Every layer
    has its own K and V memory in both, as in the engine, so the bytes come from DRAM, not cache."""
    cfg, dt, dev = bundle.model.config, bundle.dtype, bundle.device
    h, d, layers, heads = kv_heads(cfg), head_dim(cfg), cfg.num_hidden_layers, cfg.num_attention_heads
    q = torch.randn(batch, heads, 1, d, dtype=dt, device=dev)
    out = []
    for ctx in contexts:
        nb = -(-ctx // block_size)
        order = torch.randperm(batch * nb, generator=torch.Generator().manual_seed(0))   # scattered blocks
        mask = (torch.arange(nb * block_size, device=dev) < ctx)[None, None, None, :]
        pools = [torch.randn(batch * nb, block_size, h, d, dtype=dt, device=dev) for _ in range(2 * layers)]

        def paged():                    # as engine/model/runner.py's Plan.attend does for decode rows
            for i in range(layers):
                k, v = (_gather(p, order).view(batch, -1, h, d).transpose(1, 2) for p in pools[2 * i:2 * i + 2])
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        paged()
        paged_s = _best(paged, repeats, dev)
        del pools
        rows = [torch.randn(batch, h, ctx, d, dtype=dt, device=dev) for _ in range(2 * layers)]

        def contiguous():
            for i in range(layers):
                F.scaled_dot_product_attention(q, rows[2 * i], rows[2 * i + 1], enable_gqa=True)
        contiguous()
        out.append({"context": ctx, "batch": batch, "paged_s": paged_s, "contiguous_s": _best(contiguous, repeats, dev)})
        del rows
    return out
