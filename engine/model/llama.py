"""The decoder forward the engine runs for a Llama-family model on a CPU: one Python loop over
the layers, each a handful of fused ops (engine/model/kernels) instead of transformers' module tree.

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

from . import kernels
from .linears import PackedLinear, QuantLinear, _onednn_ok, on_cpu
from .weights import stack_rows

OPS = None   # torch.ops.first_token once the kernels are loaded


def supported(model):
    """Whether this model runs here through the fused ops (else transformers' decoder)."""
    cfg = model.config
    w = model.get_input_embeddings().weight
    return (kernels.available() and cfg.model_type == "llama" and on_cpu(w)
            and w.dtype == torch.float32 and not cfg.attention_bias and not getattr(cfg, "mlp_bias", False)
            and cfg.hidden_act == "silu" and (cfg.rope_parameters or {}).get("rope_type", "default") == "default"
            and all(_onednn_ok(m) for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)))


def _linear(modules, names, formats):
    """One linear layer for several of the model's, stacked by rows: their blocks where the file
    stored them, else the model's fp32 weights prepacked."""
    blocks = [formats.quant.get(n) for n in names]
    stacked = stack_rows(blocks) if None not in blocks else None
    return QuantLinear(stacked, formats) if stacked is not None else PackedLinear(torch.cat([m.weight for m in modules]))


class Layer:
    def __init__(self, layer, prefix, formats):
        a, m = layer.self_attn, layer.mlp
        self.qkv = _linear([a.q_proj, a.k_proj, a.v_proj], [f"{prefix}.self_attn.{p}_proj.weight" for p in "qkv"], formats)
        self.o = _linear([a.o_proj], [f"{prefix}.self_attn.o_proj.weight"], formats)
        self.gate_up = _linear([m.gate_proj, m.up_proj], [f"{prefix}.mlp.{p}_proj.weight" for p in ("gate", "up")], formats)
        self.down = _linear([m.down_proj], [f"{prefix}.mlp.down_proj.weight"], formats)
        self.norm1, self.norm2 = layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()


class LlamaDecoder:
    def __init__(self, model, formats, store):
        global OPS
        OPS = torch.ops.first_token
        cfg, decoder = model.config, model.get_decoder()
        self.store = store
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.eps = cfg.rms_norm_eps
        # the embedding's blocks (SmolLM2's: Q8_0, the tied head's) where there are any
        self.embed_blocks = formats.quant.get("model.embed_tokens.weight")
        self.embed = None if self.embed_blocks is not None else decoder.embed_tokens.weight.detach()
        self.layers = [Layer(layer, f"model.layers.{i}", formats) for i, layer in enumerate(decoder.layers)]
        self.final_norm = decoder.norm.weight.detach()
        # cos/sin of every position from the model's own rotary module (its scaling included)
        positions = torch.arange(cfg.max_position_embeddings)[None]
        with torch.no_grad():
            cos, sin = decoder.rotary_emb(torch.zeros(1, 1, 1), positions)   # (x is read for its dtype)
        half = self.head_dim // 2
        self.cos, self.sin = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()

    @torch.inference_mode()
    def __call__(self, ids, pos, plan):
        """Final-normed hidden states [T, hidden] of the packed tokens `ids` at positions `pos`."""
        nh, nkv, d = self.heads, self.kv_heads, self.head_dim
        h = kernels.quant_rows(self.embed_blocks, ids) if self.embed is None else self.embed[ids]
        x = OPS.rms_norm(h, self.layers[0].norm1, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = layer.qkv(x)
            OPS.rotary_(qkv, pos, self.cos, self.sin, nh + nkv, d)
            k_store, v_store = self.store.k[i], self.store.v[i]
            if plan.write is not None:
                OPS.kv_write_(k_store, v_store, qkv, *plan.write, nh, nkv, d)
            parts = []
            if plan.tables is not None:
                parts.append(OPS.paged_decode(qkv, k_store, v_store, plan.tables, plan.lengths, nh, nkv, d, self.scale))
            if plan.chunks:
                t = qkv.shape[0]
                q, k, v = (qkv[:, a * d:b * d].view(t, b - a, d).transpose(0, 1)[None]
                           for a, b in ((0, nh), (nh, nh + nkv), (nh + nkv, nh + 2 * nkv)))
                parts += [o.transpose(0, 1).reshape(o.shape[1], nh * d) for o in plan.attend_chunks(i, q, k, v, self.scale)]
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            x = OPS.add_rms_norm(h, layer.o(attn), layer.norm2, self.eps)
            after = self.layers[i + 1].norm1 if i + 1 < len(self.layers) else self.final_norm
            x = OPS.add_rms_norm(h, layer.down(OPS.silu_mul(layer.gate_up(x))), after, self.eps)
        return x
