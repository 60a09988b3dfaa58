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
from dataclasses import dataclass, field
import time

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import llama
from .linears import Formats, OutputHead, _onednn_ok, engine_decoder, on_cpu
from ..timing.memory import return_freed_memory

ATTENTION = "first_token_paged"


def _attention(module, query, key, value, attention_mask, ft_plan=None, **kwargs):
    if ft_plan is None:           # the model used on its own (generate): plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # a local layer's window (Gemma's) as transformers' layer passes it
    return ft_plan.attend(module.layer_idx, query, key, value, kwargs.get("scaling"), window=kwargs.get("sliding_window")), None


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
    # Speculative decoding: the proposer's guesses of the tokens after its last one. They are
    # the segment's last len(draft) positions (not yet the request's tokens), and logits are
    # wanted at each of its last len(draft) + 1 positions, to verify them.
    draft: tuple = ()
    # A decode step of its request (`Sequence.decoding`, the one definition): the step's
    # accounting, decode or prefill tokens, a `prefill` event or not. Fixed when the segment is made: the request's
    # `num_computed` moves on once the forward is done.
    decode: bool = field(init=False)
    # Its positions whose logits give its prompt's log-probabilities (each predicts the prompt token
    # after it): a request that asks for them (`prompt_logprobs`), in its prefill; and those
    # logits [len(prompt_rows), vocab], once the forward has run (None before, or without rows).
    prompt_rows: range = field(init=False)
    prompt_logits: object = field(init=False, default=None)

    def __post_init__(self):
        self.decode = self.logits and self.seq.decoding
        asked = self.seq.params.prompt_logprobs is not None and not self.decode
        self.prompt_rows = range(self.start, min(self.start + self.n, len(self.seq.prompt_ids) - 1) if asked
                                 else self.start)

    @property
    def is_single_query(self):
        """One new token attending to cached keys: batched with the other such rows. This is the
        attention's layout, not the step's accounting (`decode`): it also holds a prompt whose
        prefix-cache hit left one token to compute (and the measure sweep's synthetic rows), and
        not a decode with the KV cache off (the whole sequence recomputed, attending causally)."""
        return self.cached and self.n == 1 and self.start > 0


class Plan:
    """Index tensors for one forward, read by the attention function in every layer.

    Reads gather whole blocks (one index per block, each a contiguous `block_size x kv_heads x
    head_dim` copy), which measured ~2.5x faster here than gathering token by token."""

    def __init__(self, store, segments, device):
        self.store = store
        bs = store.block_size
        self.write = None               # (packed rows, store slots) of the keys/values to keep
        self.decode = None              # (rows, block ids [B * nb], mask [B, 1, 1, nb * bs])
        self.tables = self.lengths = None   # the same decode rows' block tables [B, nb] and lengths [B]
        self.chunks = []                # (first packed row, n, block ids or None, keys, mask or None)
        self.longest = 0                # the most keys any row attends to (a sliding window's layers mask past it)
        # Indices are built here as Python lists and moved to the device in one copy each: on a GPU
        # a tensor made per segment is a launch or a host-to-device copy each (a batch of 64 decode
        # rows made ~200 of them per forward).
        rows, slots, dec_blocks, dec_len = [], [], [], []
        q0 = 0
        for seg in segments:
            if seg.cached:
                length = seg.start + seg.n
                blocks = seg.seq.block_table[:-(-length // bs)]
                rows.extend(range(q0, q0 + seg.n))
                slots.extend(blocks[p // bs] * bs + p % bs for p in range(seg.start, length))
                if seg.is_single_query:
                    dec_blocks.append(blocks)
                    dec_len.append(length)
                elif seg.start > 0:     # a later chunk: attends to earlier chunks' keys too
                    q = torch.arange(seg.start, length, device=device)
                    mask = torch.arange(length, device=device)[None, :] <= q[:, None]
                    self.chunks.append((q0, seg.n, _index(blocks, device), length, mask[None, None]))
                else:
                    self.chunks.append((q0, seg.n, None, seg.n, None))
            else:
                self.chunks.append((q0, seg.n, None, seg.n, None))
            q0 += seg.n
            self.longest = max(self.longest, seg.start + seg.n)
        if rows:
            self.write = (_index(rows, device), _index(slots, device))
        if dec_blocks:
            nb = max(len(b) for b in dec_blocks)
            padded = [x for b in dec_blocks for x in b + [store.zero_block] * (nb - len(b))]
            lengths = _index(dec_len, device)
            mask = (torch.arange(nb * bs, device=device)[None, :] < lengths[:, None])[:, None, None, :]
            self.decode = (len(dec_blocks), _index(padded, device), mask)
            self.tables, self.lengths = self.decode[1].view(len(dec_blocks), nb), lengths   # engine/model/llama.py

    def attend(self, layer, q, k, v, scale, window=None, write=True):
        """q [1, H, T, d]; k, v [1, h, T, d] for the packed tokens -> attention output [1, T, H, d].
        `window`: a query sees only the keys of its last `window` positions (Gemma's local layers);
        `write`: the keys and values are to be written into the store (not yet written)."""
        store_k, store_v = self.store.k[layer], self.store.v[layer]
        if write and self.write is not None:
            rows, slots = self.write
            store_k.view(-1, *store_k.shape[2:])[slots] = k[0].transpose(0, 1)[rows]
            store_v.view(-1, *store_v.shape[2:])[slots] = v[0].transpose(0, 1)[rows]
        outs = []
        if self.decode is not None:
            b, blocks, mask = self.decode
            qd = q[0, :, :b].transpose(0, 1).unsqueeze(2)                              # [B, H, 1, d]
            kd, vd = (_gather(t, blocks).view(b, -1, *t.shape[2:]).transpose(1, 2)
                      for t in (store_k, store_v))                                      # [B, h, nb*bs, d]
            if window is not None:
                keys = torch.arange(mask.shape[-1], device=mask.device)
                mask = mask & (keys[None, :] >= self.lengths[:, None] - window)[:, None, None, :]
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale, enable_gqa=True)
            outs.append(o[:, :, 0].transpose(0, 1))                                    # [H, B, d]
        outs += self.attend_chunks(layer, q, k, v, scale, window)
        return torch.cat(outs, dim=1).transpose(0, 1).unsqueeze(0)

    def attend_chunks(self, layer, q, k, v, scale, window=None):
        """[H, n, d] for each prompt chunk (and recomputed sequence), in order: causal over its own
        fresh keys, or over its earlier chunks' keys in the store too (written already); within
        `window` positions back only, where one is given."""
        store_k, store_v = self.store.k[layer], self.store.v[layer]
        outs = []
        for q0, n, blocks, length, mask in self.chunks:
            qc = q[:, :, q0:q0 + n]
            if window is not None and length > window:
                mask = _windowed(length - n, length, window, q.device) if mask is None else \
                    mask & _windowed(length - n, length, window, q.device)
            if blocks is None and mask is None:   # keys are exactly this chunk's fresh ones: plain causal
                kc, vc = k[:, :, q0:q0 + n], v[:, :, q0:q0 + n]
                o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, scale=scale, enable_gqa=True)
            elif blocks is None:        # the same keys, within the window
                kc, vc = k[:, :, q0:q0 + n], v[:, :, q0:q0 + n]
                o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, scale=scale, enable_gqa=True)
            else:
                kc, vc = (_gather(t, blocks).view(-1, *t.shape[2:])[:length].transpose(0, 1).unsqueeze(0)
                          for t in (store_k, store_v))
                o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, scale=scale, enable_gqa=True)
            outs.append(o[0])                                                          # [H, n, d]
        return outs


def _windowed(start, length, window, device):
    """[1, 1, queries, keys]: query positions start..length-1 each see its own and the causal keys
    less than `window` positions back (transformers' sliding window: kv > q - window)."""
    q = torch.arange(start, length, device=device)[:, None]
    kv = torch.arange(length, device=device)[None, :]
    return ((kv <= q) & (kv > q - window))[None, None]


def _gather(store, blocks):
    """Copy of these blocks, in order, as [len(blocks), block_size * kv_heads * head_dim]: the 2-D
    view makes index_select copy each block in one piece (11x faster here than on the 4-D tensor)."""
    return store.view(store.shape[0], -1).index_select(0, blocks)


def _index(values, device):
    """A long tensor of `values` on `device`: built on the CPU, then one copy."""
    return torch.tensor(values, dtype=torch.long).to(device)


def synchronize(device):
    """Wait for the device to finish what was launched (CUDA runs asynchronously): every
    timestamp the page shows is taken after this, so a step's end is when the GPU finished."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# Every forward shape run in this process: (a runner's `geometry`, the weights' kernel, token rows,
# logit rows). The
# token rows are the M of every linear layer, the logit rows the output head's; on a CPU in fp32
# oneDNN creates a kernel for each new M the first time (SmolLM2: one per distinct weight shape,
# 4 in the decoder and 1 for the head, ~2 ms together) and keeps it in a cache global to the
# process, so the first forward of a shape costs more and the next ones do not, and a reload (a
# new Runner in the same process) creates none again: measured, docs/engine.md "Cold starts".
# The attention's paths (decode rows, prompt chunks) create none; the 4-bit kernel (weights as
# stored) has one code path for every row count, but its forward is a shape of its own.
SHAPES = set()


class Runner:
    def __init__(self, model, store, quant=None):
        """`quant`: the file's blocks by parameter name (engine/model/weights.py), or None. The model's
        linear weights and embedding may be left unmade (meta) where it has blocks (engine/model/loading.py
        `load(dense=False)`): the fused forward reads only its blocks and norms."""
        model.set_attn_implementation(ATTENTION)
        self.model = model
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        linear = sum(m.weight.numel() * m.weight.element_size() for m in decoder.modules()
                     if isinstance(m, torch.nn.Linear))
        norms = sum(p.numel() * p.element_size() for n, p in decoder.named_parameters()
                    if "norm" in n)
        w = head.weight
        # the 4-bit kernels are CPU ops on fp32 activations: elsewhere only the model's own copy
        blocks = quant if on_cpu(w) and w.dtype == torch.float32 else None
        dense = "oneDNN fp32" if _onednn_ok(head) else f"torch {str(w.dtype).removeprefix('torch.')} on {store.k[0].device.type}"
        self.formats = Formats(blocks or {}, linear, w.numel() * w.element_size(), norms, dense)
        self.store = store
        # Llama on a CPU with the kernels built: the fused forward (engine/model/llama.py); else the
        # model's own decoder, its linear layers on oneDNN where that runs.
        self.fused = llama.LlamaDecoder(model, self.formats, store) if llama.supported(model) else None
        self.decoder = None if self.fused else engine_decoder(decoder, self.formats)
        self.head = OutputHead(head, self.formats)
        self.device = store.k[0].device          # the model's (its weights may be unmade: meta)
        # Summed over every forward: wall seconds, and CPU seconds of the calling (engine) thread.
        self.wall_s = self.cpu_s = 0.0
        # What picks this model's kernels besides a forward's shape: its weights' shapes, dtype, device.
        linears = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
        self.geometry = (self.device.type, str(next(model.parameters()).dtype), tuple(sorted(linears)))
        self.first_shape = False   # the last forward was the first of its shape in this process (SHAPES)
        self.path = None           # the last forward's weights path (engine/model/linears.py Path)

    def release_model_weights(self):
        """Free the model's own linear-layer weights where the fused forward runs: it reads its
        stacked copies, and only `generate` reads these (EngineConfig.release_model_weights)."""
        if self.fused:
            for m in self.model.get_decoder().modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
            return_freed_memory()

    @torch.inference_mode()
    def forward(self, segments):
        """One forward over every segment's tokens, packed; logits [k, vocab] at the last position
        of each segment that wants them (and at each guess of a speculating one), in order.
        Decode rows must come first. A segment with `prompt_rows` gets its `prompt_logits` too: the
        same output head over those rows, in the same call."""
        ids, pos, last, prompt = [], [], [], []
        for seg in segments:
            q0 = len(ids)
            ids += seg.seq.token_ids(seg.start, seg.n - len(seg.draft)) + list(seg.draft)
            pos += range(seg.start, seg.start + seg.n)
            if seg.logits:
                last += range(len(ids) - 1 - len(seg.draft), len(ids))
            prompt += (q0 + p - seg.start for p in seg.prompt_rows)
        self.path = self.formats.path(len(ids), len(last) + len(prompt))
        shape = (self.geometry, self.path.kernel, len(ids), len(last) + len(prompt))
        self.first_shape = shape not in SHAPES
        SHAPES.add(shape)
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self._forward(ids, pos, last, segments, prompt)
        finally:
            self.wall_s += time.perf_counter() - w0
            self.cpu_s += time.thread_time() - c0

    @torch.inference_mode()
    def logits_everywhere(self, seq, start, n):
        """Logits [n, vocab] at each of positions start..start+n-1 of `seq` (teacher forcing: the
        next token after each of them), its keys/values kept in its blocks; engine/model/agreement.py."""
        seg = Segment(seq, start, n, cached=True, logits=True)
        self.path = self.formats.path(n, n)
        return self._forward(seq.token_ids(start, n), list(range(start, start + n)), list(range(n)), [seg])

    def _forward(self, ids, pos, last, segments, prompt=()):
        plan = Plan(self.store, segments, self.device)
        if self.fused:
            hidden = self.fused(_index(ids, self.device), _index(pos, self.device), plan)
        else:
            hidden = self.decoder(input_ids=torch.tensor([ids], device=self.device),
                                  position_ids=torch.tensor([pos], device=self.device), use_cache=False,
                                  ft_plan=plan).last_hidden_state[0]
        if not last and not prompt:
            synchronize(self.device)
            return None
        hidden = hidden[_index(last + list(prompt), self.device)]
        logits = self.head(hidden).float()
        synchronize(self.device)      # the forward ends (engine.py's step `end`) when the GPU is done
        if prompt:
            at = len(last)
            for seg in segments:
                seg.prompt_logits, at = logits[at:at + len(seg.prompt_rows)], at + len(seg.prompt_rows)
        return logits[:len(last)] if last else None
