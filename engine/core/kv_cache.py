"""The paged KV cache: blocks of memory, the pool that counts who holds each block, and prefix caching.

Memory: per layer, one K tensor and one V tensor of `[num_blocks + 1, block_size, kv_heads,
head_dim]`, allocated (zeroed, so resident) at start. Token position p of a request lives at
row `p % block_size` of block `block_table[p // block_size]`. Attention gathers whole blocks;
the extra block at the end is never handed out and stays zero: padded reads point there.
Everything ever written is a finite key or value, so a masked-out position read from a
reused block is a finite number too (a mask cannot hide NaN).

Blocks are handed out as tokens are written (never reserved up front for max_new_tokens),
returned when a request finishes or is preempted, and counted against a live budget
(`cache_tokens` setting). Bytes per token: 2 (K and V) x layers x kv_heads x head_dim x dtype size.

Prefix caching: a full block of prompt tokens is named by a hash of its tokens chained to the
previous block's hash, so equal hashes mean equal prefixes. A later request whose prompt
starts with cached blocks takes them (reference counts) and computes only the rest. A block
whose last user left keeps its contents and hash in the free list, least recently freed
first, until it is handed out again (evicted).

This module knows blocks by number only; which blocks a request holds, and when it takes or
gives them back, is engine/core/block_manager.py's.
"""
from collections import OrderedDict
import hashlib
import math

import torch


def kv_bytes_per_token(config, dtype):
    return 2 * config.num_hidden_layers * kv_heads(config) * head_dim(config) * \
        torch.tensor([], dtype=dtype).element_size()


def kv_heads(config):
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def head_dim(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def block_hashes(token_ids, block_size):
    """Chained hashes of every full block of `token_ids` (a prefix's identity, block by block)."""
    out, prev = [], b""
    for i in range(len(token_ids) // block_size):
        chunk = token_ids[i * block_size:(i + 1) * block_size]
        prev = hashlib.blake2b(prev + b"".join(t.to_bytes(4, "little") for t in chunk), digest_size=16).digest()
        out.append(prev)
    return out


class BlockPool:
    """Which block holds what: reference counts, the free list (LRU) and the prefix-hash index.

    Pure bookkeeping on integers (vLLM V1's BlockPool); the block manager takes blocks from it
    for requests, and the measure sweeps for their synthetic ones."""

    def __init__(self, block_size, num_blocks):
        self.block_size = block_size
        self.capacity = num_blocks      # physical blocks, fixed at start
        self.block_budget = num_blocks  # live setting (<= capacity): most blocks in use at once
        self.ref = [0] * num_blocks
        self.hash = [None] * num_blocks
        self.by_hash = {}               # hash -> block holding that prefix block
        self.free = OrderedDict((b, None) for b in range(num_blocks))   # oldest freed first
        self.used = 0                   # blocks with ref > 0

    def blocks_for(self, tokens):
        return -(-tokens // self.block_size)

    def can_allocate(self, n):
        return self.used + n <= self.block_budget and len(self.free) >= n

    def allocate(self, n):
        """`n` fresh blocks (evicting the oldest cached contents), or None if they do not fit."""
        if not self.can_allocate(n):
            return None
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            if self.hash[block] is not None:
                del self.by_hash[self.hash[block]]
                self.hash[block] = None
            self.ref[block] = 1
            out.append(block)
        self.used += n
        return out

    def release(self, blocks):
        for block in blocks:
            self.ref[block] -= 1
            assert self.ref[block] >= 0, "block reference count went negative"
            if self.ref[block] == 0:
                self.used -= 1
                self.free[block] = None

    def peek(self, hashes):
        """How many of `hashes`, from the start, are cached (nothing is taken)."""
        n = 0
        while n < len(hashes) and hashes[n] in self.by_hash:
            n += 1
        return n

    def match(self, hashes):
        """The cached blocks for the longest run of `hashes` from the start, taken (ref + 1);
        None if taking them would exceed the budget."""
        found = []
        for h in hashes:
            block = self.by_hash.get(h)
            if block is None:
                break
            found.append(block)
        revived = sum(1 for b in found if self.ref[b] == 0)
        if self.used + revived > self.block_budget:
            return None
        for block in found:
            if self.ref[block] == 0:
                del self.free[block]
                self.used += 1
            self.ref[block] += 1
        return found

    def register(self, block, h):
        """`block` now holds the full prompt block named `h`; later prompts may share it."""
        if self.hash[block] is None and h not in self.by_hash:
            self.hash[block] = h
            self.by_hash[h] = block

    @property
    def shared(self):
        return sum(1 for r in self.ref if r > 1)

    @property
    def cached_free(self):
        """Free blocks that still hold a reusable prefix."""
        return sum(1 for b in self.free if self.hash[b] is not None)

    def forget_hashes(self):
        """Drop every cached prefix (prefix caching turned off)."""
        self.by_hash.clear()
        self.hash = [None] * self.capacity


class PagedKVStore:
    """The K/V memory: per layer `[num_blocks + 1, block_size, kv_heads, head_dim]`.

    `memory`: a flat tensor of `nbytes_for(...)` bytes to lay the layers' K and V out in, in that
    order (disaggregated: a shared-memory segment another engine process maps too,
    engine/disagg/shm.py); None: zeroed memory of its own."""

    def __init__(self, config, num_blocks, block_size, dtype, device, memory=None):
        shape = self.shape(config, num_blocks, block_size)
        layers = config.num_hidden_layers
        if memory is None:
            self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
            self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        else:
            per = math.prod(shape)
            views = memory.view(dtype)[:2 * layers * per].view(2 * layers, *shape)
            self.k, self.v = list(views[:layers]), list(views[layers:])
        self.block_size = block_size
        self.zero_block = num_blocks      # never handed out, always zero: where padded reads point
        self.nbytes = 2 * layers * self.k[0].numel() * self.k[0].element_size()

    @staticmethod
    def shape(config, num_blocks, block_size):
        return (num_blocks + 1, block_size, kv_heads(config), head_dim(config))

    @classmethod
    def nbytes_for(cls, config, num_blocks, block_size, dtype):
        """The bytes of a store of these dimensions (what `memory` must hold)."""
        return 2 * config.num_hidden_layers * math.prod(cls.shape(config, num_blocks, block_size)) * \
            torch.tensor([], dtype=dtype).element_size()
