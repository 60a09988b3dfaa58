"""The model forward over packed tokens: one forward carries every scheduled segment (a decode
token of each running request, chunks of prompts) as one row of tokens, so the linear layers
run once over all of them; attention runs per sequence, over that sequence's own keys and
values in the paged store.

The engine drives the transformers model's own decoder (never `generate`): it registers an
attention function (`first_token_paged`) that the model's attention layers call with the
new tokens' queries, keys and values; the function writes the keys/values into the request's
blocks and attends over what each request may see. A model used outside the engine (e.g.
`generate` in the tests) gets transformers' own SDPA attention through the same function.
With the KV cache off nothing is written: each segment is a whole sequence recomputed from
its first token, attending only to itself.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "first_token_paged"


def _attention(module, query, key, value, attention_mask, ft_plan=None, **kwargs):
    if ft_plan is None:           # the model used on its own (generate): plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return ft_plan.attend(module.layer_idx, query, key, value, kwargs.get("scaling")), None


AttentionInterface.register(ATTENTION, _attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)   # masks for plain use; the engine passes none


@dataclass
class Segment:
    """Positions start..start+n-1 of one sequence's tokens, computed in this forward."""
    seq: object          # engine.sequence.Sequence
    start: int
    n: int
    cached: bool         # keys/values kept in its blocks (False: KV cache off, recompute)
    logits: bool         # logits wanted at its last position (it samples a token)

    @property
    def is_decode_row(self):
        """One new token attending to cached keys: batched with the other such rows."""
        return self.cached and self.n == 1 and self.start > 0


class Plan:
    """Index tensors for one forward, read by the attention function in every layer."""

    def __init__(self, store, segments, device):
        self.store = store
        bs = store.block_size
        self.write = None               # (packed rows, store slots) of the keys/values to keep
        self.decode = None              # (rows, gather index [B, L], mask [B, 1, 1, L])
        self.chunks = []                # (first packed row, n, gather index or None, mask or None)
        rows, slots, dec_idx, dec_len = [], [], [], []
        q0 = 0
        for seg in segments:
            if seg.cached:
                ctx = _slots(seg.seq.block_table, seg.start + seg.n, bs, device)
                rows.append(torch.arange(q0, q0 + seg.n, device=device))
                slots.append(ctx[seg.start:])
                if seg.is_decode_row:
                    dec_idx.append(ctx)
                    dec_len.append(seg.start + 1)
                elif seg.start > 0:     # a later chunk: attends to earlier chunks' keys too
                    q = torch.arange(seg.start, seg.start + seg.n, device=device)
                    keys = torch.arange(seg.start + seg.n, device=device)
                    self.chunks.append((q0, seg.n, ctx, (keys[None, :] <= q[:, None])[None, None]))
                else:
                    self.chunks.append((q0, seg.n, None, None))
            else:
                self.chunks.append((q0, seg.n, None, None))
            q0 += seg.n
        if rows:
            self.write = (torch.cat(rows), torch.cat(slots))
        if dec_idx:
            width = max(dec_len)
            idx = torch.full((len(dec_idx), width), store.zero_slot, dtype=torch.long, device=device)
            for i, ctx in enumerate(dec_idx):
                idx[i, :len(ctx)] = ctx
            lengths = torch.tensor(dec_len, device=device)
            mask = (torch.arange(width, device=device)[None, :] < lengths[:, None])[:, None, None, :]
            self.decode = (len(dec_idx), idx, mask)

    def attend(self, layer, q, k, v, scale):
        """q [1, H, T, d]; k, v [1, h, T, d] for the packed tokens -> attention output [1, T, H, d]."""
        store_k, store_v = self.store.k[layer], self.store.v[layer]
        if self.write is not None:
            rows, slots = self.write
            store_k[slots] = k[0].transpose(0, 1)[rows]
            store_v[slots] = v[0].transpose(0, 1)[rows]
        outs = []
        if self.decode is not None:
            b, idx, mask = self.decode
            qd = q[0, :, :b].transpose(0, 1).unsqueeze(2)                    # [B, H, 1, d]
            kd, vd = store_k[idx].transpose(1, 2), store_v[idx].transpose(1, 2)   # [B, h, L, d]
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale, enable_gqa=True)
            outs.append(o[:, :, 0].transpose(0, 1))                          # [H, B, d]
        for q0, n, idx, mask in self.chunks:
            qc = q[:, :, q0:q0 + n]
            if idx is None:             # keys are exactly this chunk's fresh ones: plain causal
                kc, vc = k[:, :, q0:q0 + n], v[:, :, q0:q0 + n]
                o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, scale=scale, enable_gqa=True)
            else:
                kc = store_k[idx].transpose(0, 1).unsqueeze(0)
                vc = store_v[idx].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, scale=scale, enable_gqa=True)
            outs.append(o[0])                                                # [H, n, d]
        return torch.cat(outs, dim=1).transpose(0, 1).unsqueeze(0)


def _slots(block_table, length, block_size, device):
    """Store slots of positions 0..length-1 of a sequence with this block table."""
    blocks = torch.tensor(block_table[:-(-length // block_size)], dtype=torch.long, device=device)
    return (blocks[:, None] * block_size + torch.arange(block_size, device=device)).flatten()[:length]


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
        model.set_attn_implementation(ATTENTION)
        self.model = model
        self.decoder = model.get_decoder()
        self.head = OutputHead(model.get_output_embeddings())
        self.store = store
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def forward(self, segments):
        """One forward over every segment's tokens, packed; logits [k, vocab] at the last position
        of each segment that wants them, in order. Decode rows must come first."""
        ids, pos, last = [], [], []
        for seg in segments:
            ids += seg.seq.token_ids(seg.start, seg.n)
            pos += range(seg.start, seg.start + seg.n)
            if seg.logits:
                last.append(len(ids) - 1)
        plan = Plan(self.store, segments, self.device)
        out = self.decoder(input_ids=torch.tensor([ids], device=self.device),
                           position_ids=torch.tensor([pos], device=self.device), use_cache=False, ft_plan=plan)
        if not last:
            return None
        hidden = out.last_hidden_state[0, torch.tensor(last, device=self.device)]
        return self.head(hidden).float()
