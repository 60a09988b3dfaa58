"""KV-cache accounting (blocks) and the slot-major KV store handed to the model.

Accounting: the cache budget is counted in blocks of `block_size` tokens, like
vLLM. A request reserves blocks for its prompt plus `max_new_tokens` when admitted
(so it can never run out mid-flight and no preemption is needed); the blocks return
the moment it finishes. Bytes per token come from the model config:
2 (K and V) x layers x kv-heads x head-dim x dtype size.

Storage: one tensor per layer for K and for V, shaped [rows, kv_heads, max_context,
head_dim]. Running requests occupy rows 0..B-1 (compacted when one leaves), so a
decode step hands the attention a *view* `k[:B, :, :L]` -- nothing is copied into a
fresh padded batch each step. It subclasses transformers' `Cache` and is passed to
the model's forward as its cache; `bind()` says which rows/positions a forward writes.
"""
import math

import torch
from transformers.cache_utils import Cache


def kv_bytes_per_token(config, dtype):
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * layers * heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class BlockAccount:
    """Free-block bookkeeping for admission. Pure integers; no tensors."""

    def __init__(self, block_size, num_blocks):
        self.block_size = block_size
        self.capacity = num_blocks   # physical budget fixed at start
        self.budget = num_blocks     # live setting (<= capacity)
        self.used = 0

    def blocks_for(self, tokens):
        return math.ceil(tokens / self.block_size)

    def can_reserve(self, n):
        return self.used + n <= self.budget

    def reserve(self, n):
        assert self.can_reserve(n)
        self.used += n

    def release(self, n):
        self.used -= n
        assert self.used >= 0, "block accounting went negative"


class SlotKVStore(Cache):
    """Per-layer K/V tensors, rows x kv_heads x max_context x head_dim."""

    def __init__(self, config, rows, max_context, dtype, device):
        super().__init__(layers=[])
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (rows, heads, max_context, head_dim)
        n = config.num_hidden_layers
        # torch.empty: pages are only committed once a row is written.
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(n)]
        self.max_context = max_context
        self._mode = None
        # Positions < clean_upto hold finite values in every row. Attention reads a whole
        # [rows, :kv_len] window and masks the unused part, but a mask cannot hide NaN/inf
        # that uninitialised memory may hold, so the window is zeroed the first time it grows.
        self.clean_upto = 0

    def _ensure_clean(self, kv_len):
        if kv_len > self.clean_upto:
            for t in (*self.k, *self.v):
                t[:, :, self.clean_upto:kv_len].zero_()
            self.clean_upto = kv_len

    def __len__(self):
        return len(self.k)

    def bind_prefill(self, row, start, length):
        """The next forward writes positions start..start+length-1 of `row` and reads 0..start+length-1."""
        self._ensure_clean(start + length)
        self._mode = ("prefill", row, start, length)

    def bind_fill(self, rows, width):
        """The next forward computes positions 0..width-1 of `rows` from scratch (batched prefill):
        store them, and let attention use the fresh keys directly. Padding positions past a
        row's prompt get finite values that its mask hides and later steps overwrite."""
        self._ensure_clean(width)
        self._mode = ("fill", rows, width)

    def bind_decode(self, rows, positions):
        """The next forward writes `positions[i]` of `rows[i]` (LongTensors) and reads 0..max(positions).

        Running requests sit in rows 0..B-1, so attention reads a view. Only while a chunked
        prefill holds a row in between do the rows have gaps; then they are gathered (a copy)."""
        kv_len = int(positions.max()) + 1
        self._ensure_clean(kv_len)
        contiguous = bool(rows[0] == 0 and rows[-1] == len(rows) - 1)
        self._mode = ("decode", rows, positions, kv_len, contiguous)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self._mode[0] == "fill":
            _, rows, width = self._mode
            k[rows, :, :width] = key_states
            v[rows, :, :width] = value_states
            return key_states, value_states
        if self._mode[0] == "prefill":
            _, row, start, length = self._mode
            end = start + length
            k[row, :, start:end] = key_states[0]
            v[row, :, start:end] = value_states[0]
            return k[row:row + 1, :, :end], v[row:row + 1, :, :end]
        _, rows, positions, kv_len, contiguous = self._mode
        k[rows, :, positions] = key_states[:, :, 0]
        v[rows, :, positions] = value_states[:, :, 0]
        if contiguous:
            b = len(rows)
            return k[:b, :, :kv_len], v[:b, :, :kv_len]
        return k[rows, :, :kv_len], v[rows, :, :kv_len]

    def move_row(self, src, dst, length):
        """Compaction: copy the first `length` positions of row src into row dst."""
        for k, v in zip(self.k, self.v):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]

    def get_seq_length(self, layer_idx=0):
        return 0
