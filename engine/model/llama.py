"""The decoder forward the engine runs on a CPU for Llama and the architectures that differ from it
in a few flags (Qwen2, Qwen3, Gemma 3: engine/model/archs.py, one description each): one Python loop
over the layers, each a handful of fused ops (engine/model/kernels) instead of transformers' module tree.
What an architecture adds (a qkv bias, q/k norms, Gemma's extra norms and GELU gate, a local layer's
window, masked in runner.Plan) is a few torch ops around the same fused ones; the KV store and the
paged attention are shared.

Per layer, over every token row of the forward (decode rows first, then prompt chunks):

    qkv = [q|k|v](x)                  one linear: the three matrices stacked by rows
    rotary_(qkv)                      in place, on the queries and keys
    kv_write_(store, qkv)             keys and values into the request's blocks
    paged_decode(qkv, store)          decode rows attend straight from the blocks (no gathered copy)
    attend_chunks (SDPA)              prompt chunks, as in runner.Plan
    x = add_rms_norm(h, o(attn))      h += attention out; x = RMSNorm(h)
    x = add_rms_norm(h, down(silu_mul([gate|up](x))))   with the next layer's norm

Each linear reads the file's blocks through the fused 4-bit kernel, or the fp32 copy made from
them while the `weights` setting asks for it (engine/model/linears.py QuantLinear); the embedding is
looked up in the blocks too (only its tokens' rows are dequantised), so the model's own fp32
linear weights and embedding are never read and may be left unmade (engine/model/loading.py). Its
rotary tables and norms are read as they are, so greedy output equals `generate`
(tests/test_engine*.py); each fused op has a plain-torch reference (engine/model/kernels). Other
models, other devices and a machine without the kernels run transformers' decoder instead
(engine/model/runner.py).
"""
import torch
import torch.nn.functional as F

from . import archs, kernels
from .kernels import rms_norm_reference
from .linears import PackedLinear, QuantLinear, on_cpu
from .weights import stack_rows

OPS = None   # torch.ops.first_token once the kernels are loaded


def supported(model):
    """Whether this model runs here through the fused ops (else transformers' decoder)."""
    w = model.get_input_embeddings().weight
    return (kernels.available() and archs.describe(model.config) is not None and on_cpu(w)
            and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and all(on_cpu(m.weight) and m.weight.dtype == torch.float32
                    for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)))


def _linear(modules, names, formats):
    """One linear layer for several of the model's, stacked by rows: their blocks where the file
    stored them all in one type, else fp32 prepacked: the model's weights, or where a part has blocks
    (its own weight left unmade) those blocks dequantised (a file mixing a type the kernels read with
    one they do not yet, Gemma 3 270M's Q8_0 k beside a Q5_0 q)."""
    blocks = [formats.quant.get(n) for n in names]
    stacked = stack_rows(blocks) if None not in blocks else None
    if stacked is not None:
        return QuantLinear(stacked, formats)
    return PackedLinear(torch.cat([m.weight if b is None else b.dequantise() for m, b in zip(modules, blocks)]))


def _weight(norm, arch):
    """A norm's weight as the fused RMSNorm multiplies by it (Gemma's 1 + w)."""
    w = norm.weight.detach()
    return w + arch.norm_offset if arch.norm_offset else w


class Layer:
    def __init__(self, layer, prefix, formats, arch):
        a, m = layer.self_attn, layer.mlp
        self.qkv = _linear([a.q_proj, a.k_proj, a.v_proj], [f"{prefix}.self_attn.{p}_proj.weight" for p in "qkv"], formats)
        self.qkv_bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach() if arch.qkv_bias else None
        self.o = _linear([a.o_proj], [f"{prefix}.self_attn.o_proj.weight"], formats)
        self.gate_up = _linear([m.gate_proj, m.up_proj], [f"{prefix}.mlp.{p}_proj.weight" for p in ("gate", "up")], formats)
        self.down = _linear([m.down_proj], [f"{prefix}.mlp.down_proj.weight"], formats)
        self.norm1 = _weight(layer.input_layernorm, arch)
        self.q_norm, self.k_norm = (_weight(a.q_norm, arch), _weight(a.k_norm, arch)) if arch.qk_norm else (None, None)
        if arch.sandwich:     # Gemma: a norm after attention, one before the MLP and one after it
            self.post_attn = _weight(layer.post_attention_layernorm, arch)
            self.norm2 = _weight(layer.pre_feedforward_layernorm, arch)
            self.post_mlp = _weight(layer.post_feedforward_layernorm, arch)
        else:
            self.norm2 = _weight(layer.post_attention_layernorm, arch)


class LlamaDecoder:
    """The fused forward of every architecture engine/model/archs.py describes (Llama's, and what
    its description adds)."""

    def __init__(self, model, formats, store):
        global OPS
        OPS = torch.ops.first_token
        cfg, decoder = model.config, model.get_decoder()
        self.arch = arch = archs.describe(cfg)
        self.store = store
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        # the embedding's blocks (SmolLM2's: Q8_0, the tied head's) where there are any
        self.embed_blocks = formats.quant.get("model.embed_tokens.weight")
        self.embed = None if self.embed_blocks is not None else decoder.embed_tokens.weight.detach()
        self.layers = [Layer(layer, f"model.layers.{i}", formats, arch) for i, layer in enumerate(decoder.layers)]
        self.final_norm = _weight(decoder.norm, arch)
        # cos/sin of every position from the model's own rotary module (its scaling included), per layer type
        self.rope = archs.rope_tables(decoder, arch, self.head_dim, cfg.max_position_embeddings)

    def _gate(self, gu):
        if self.arch.act == "silu":
            return OPS.silu_mul(gu)
        g, u = gu.chunk(2, dim=-1)
        return F.gelu(g, approximate="tanh") * u

    def _qk_norm(self, qkv, layer):
        """Each head's query and key RMS-normed in place (Qwen3, Gemma 3), before the rotary."""
        nh, nkv, d = self.heads, self.kv_heads, self.head_dim
        t = qkv.shape[0]
        for (a, b), w in (((0, nh), layer.q_norm), ((nh, nh + nkv), layer.k_norm)):
            part = qkv[:, a * d:b * d].view(t, b - a, d)
            part.copy_(rms_norm_reference(part, w, self.eps))

    @torch.inference_mode()
    def __call__(self, ids, pos, plan):
        """Final-normed hidden states [T, hidden] of the packed tokens `ids` at positions `pos`."""
        nh, nkv, d, arch = self.heads, self.kv_heads, self.head_dim, self.arch
        h = kernels.quant_rows(self.embed_blocks, ids) if self.embed is None else self.embed[ids]
        if arch.embed_scale != 1.0:
            h = h * torch.tensor(arch.embed_scale, dtype=h.dtype)   # as transformers rounds it
        x = OPS.rms_norm(h, self.layers[0].norm1, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(x)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if layer.q_norm is not None:
                self._qk_norm(qkv, layer)
            cos, sin = self.rope[arch.rope_types[i]]
            OPS.rotary_(qkv, pos, cos, sin, nh + nkv, d)
            k_store, v_store = self.store.k[i], self.store.v[i]
            if plan.write is not None:
                OPS.kv_write_(k_store, v_store, qkv, *plan.write, nh, nkv, d)
            window = arch.windows[i]
            if window is not None and plan.longest > window:     # keys beyond its window masked (runner.Plan)
                t = qkv.shape[0]
                q, k, v = (qkv[:, a * d:b * d].view(t, b - a, d).transpose(0, 1)[None]
                           for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
                attn = plan.attend(i, q, k, v, arch.scale, window=window, write=False)[0].reshape(t, nh * d)
            else:
                parts = []
                if plan.tables is not None:
                    parts.append(OPS.paged_decode(qkv, k_store, v_store, plan.tables, plan.lengths, nh, nkv, d, arch.scale))
                if plan.chunks:
                    t = qkv.shape[0]
                    q, k, v = (qkv[:, a * d:b * d].view(t, b - a, d).transpose(0, 1)[None]
                               for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
                    parts += [o.transpose(0, 1).reshape(o.shape[1], nh * d) for o in plan.attend_chunks(i, q, k, v, arch.scale)]
                attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            after = self.layers[i + 1].norm1 if i + 1 < len(self.layers) else self.final_norm
            if arch.sandwich:
                x = OPS.add_rms_norm(h, OPS.rms_norm(layer.o(attn), layer.post_attn, self.eps), layer.norm2, self.eps)
                x = OPS.add_rms_norm(h, OPS.rms_norm(layer.down(self._gate(layer.gate_up(x))), layer.post_mlp, self.eps),
                                     after, self.eps)
            else:
                x = OPS.add_rms_norm(h, layer.o(attn), layer.norm2, self.eps)
                x = OPS.add_rms_norm(h, layer.down(self._gate(layer.gate_up(x))), after, self.eps)
        return x
