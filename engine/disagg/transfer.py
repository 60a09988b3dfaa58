"""The KV transfer: a request's keys and values copied from the prefill instance's store into
blocks the decode instance allocated, by the decode instance (it pulls, as vLLM's
NixlConnector reads the remote blocks into its own: `start_load_kv`).

Both stores are engine/core/kv_cache.py PagedKVStores laid out alike (per layer K and V of
`[blocks + 1, block_size, kv_heads, head_dim]`), the prefill one mapped from shared memory.
Positions 0..tokens-1 are copied: whole blocks, then the used rows of a last partial one.
"""


def pull(src, dst, src_blocks, dst_blocks, tokens):
    """Copy positions 0..tokens-1 of a request from `src` (its blocks `src_blocks`) into `dst`
    (its blocks `dst_blocks`), every layer's K and V; the bytes copied."""
    bs = src.block_size
    assert dst.block_size == bs, "the instances' block sizes differ"
    full, rest = divmod(tokens, bs)
    nbytes = 0
    for s, d in zip(src.k + src.v, dst.k + dst.v):
        if full:
            d[dst_blocks[:full]] = s[src_blocks[:full]]
        if rest:
            d[dst_blocks[full], :rest] = s[src_blocks[full], :rest]
        nbytes += tokens * s[0, 0].numel() * s.element_size()
    return nbytes


def blocks_moved(blocks, tokens, block_size):
    """The blocks that positions 0..tokens-1 occupy."""
    return list(blocks[:-(-tokens // block_size)])
