"""The model forwards: prefill (one request, whole prompt or a chunk) and batched decode.

The engine drives the transformers model's own forward (never `generate`), passing
an explicit 4-D additive attention mask and per-row position ids. With the KV cache
on, keys/values live in the SlotKVStore and each decode step computes the new token
only. With it off, every step really recomputes every sequence from its first token.
"""
import torch


class OutputHead:
    """hidden -> vocab logits with the model's own head weights, on faster CPU kernels.

    The head is the largest single matrix (49152 x 576 for SmolLM2-135M, 16 % of a batch-1
    decode step in the profile, 21 % at batch 16). Measured on this 2-core CPU
    (fp32, cache-cold, best of 8; docs/performance.md): `F.linear` (MKL) takes ~22 ms for one
    row and ~110 ms for 16; `h @ W^T` on a contiguous transposed copy ~7 ms for one row (it
    streams the matrix) but ~110 ms for 16; oneDNN on a prepacked copy ~18 ms / ~45 ms. So:
    one row -> the transposed copy, several -> oneDNN. Each copy costs the head's bytes again
    (2 x 113 MB here). Elsewhere (GPU, non-fp32, no oneDNN, a bias) the plain module is used."""

    def __init__(self, head):
        self.head = head
        w = head.weight.detach()
        self.fast = (w.device.type == "cpu" and w.dtype == torch.float32 and head.bias is None
                     and torch.backends.mkldnn.is_available())
        if self.fast:
            self.wt = w.t().contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)

    def __call__(self, h):
        if not self.fast:
            return self.head(h)
        if h.shape[0] == 1:
            return h @ self.wt
        return torch.ops.mkldnn._linear_pointwise(h.contiguous(), self.packed, None, "none", [], "")


class Runner:
    def __init__(self, model, store):
        self.model = model
        self.decoder = model.get_decoder()
        self.head = OutputHead(model.get_output_embeddings())
        self.store = store
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._neg = torch.finfo(self.dtype).min

    def _additive(self, allowed):
        """Bool 'may attend' mask -> additive float mask (works for sdpa and eager attention)."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, self._neg)

    def _ids(self, rows):
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def prefill(self, row, ids, start):
        """Compute positions start..start+len(ids)-1 of `row` into the cache; logits of the last one."""
        n = len(ids)
        pos = torch.arange(start, start + n, device=self.device)
        keys = torch.arange(start + n, device=self.device)
        mask = self._additive((keys[None, :] <= pos[:, None])[None, None])
        self.store.bind_prefill(row, start, n)
        out = self.decoder(input_ids=self._ids([ids]), attention_mask=mask, position_ids=pos[None],
                           cache=self.store, use_cache=True)
        return self.head(out.last_hidden_state[:, -1]).float()

    @torch.inference_mode()
    def decode(self, rows, last_ids, positions):
        """One token for each row: `last_ids[i]` sits at `positions[i]` of row `rows[i]`."""
        pos = self._ids(positions)
        self.store.bind_decode(self._ids(rows), pos)
        keys = torch.arange(int(pos.max()) + 1, device=self.device)
        mask = self._additive((keys[None, :] <= pos[:, None])[:, None, None, :])
        out = self.decoder(input_ids=self._ids(last_ids)[:, None], attention_mask=mask,
                           position_ids=pos[:, None], cache=self.store, use_cache=True)
        return self.head(out.last_hidden_state[:, -1]).float()

    @torch.inference_mode()
    def forward_full(self, sequences, rows=None):
        """Run whole sequences from position 0 in one right-padded batch; logits at each one's
        last token. With `rows`, their keys/values are stored in those cache rows (batched
        prefill); without, nothing is kept (the KV-cache-off mode recomputes this way)."""
        lengths = self._ids([len(s) for s in sequences])
        width = int(lengths.max())
        ids = torch.zeros(len(sequences), width, dtype=torch.long, device=self.device)
        for i, s in enumerate(sequences):
            ids[i, :len(s)] = self._ids(s)
        keys = torch.arange(width, device=self.device)
        causal = keys[None, :] <= keys[:, None]                      # [q, k]
        valid = keys[None, :] < lengths[:, None]                     # [b, k]
        mask = self._additive(causal[None, None] & valid[:, None, None, :])
        if rows is not None:
            self.store.bind_fill(self._ids(rows), width)
        out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=keys[None].expand(len(sequences), -1),
                           cache=self.store if rows is not None else None, use_cache=rows is not None)
        last = out.last_hidden_state[torch.arange(len(sequences), device=self.device), lengths - 1]
        return self.head(last).float()
