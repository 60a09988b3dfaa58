"""What sets one decoder architecture apart from Llama, as the engine's fused forward reads it
(engine/model/llama.py): one small description per architecture, made from the model's config
(which engine/model/loading.py takes from the GGUF's metadata, `general.architecture` and its keys).

    llama    the base: RMSNorm, SiLU-gated MLP, rotary (Llama 3's scaled frequencies included)
    qwen2    + a bias on q, k and v
    qwen3    + an RMSNorm over each head's query and key, before the rotary
    gemma3   + the embedding scaled by sqrt(hidden), a GELU(tanh)-gated MLP, q/k norms, a norm after
             attention and after the MLP (beside the ones before), RMSNorm scaling by (1 + w),
             attention scaled by query_pre_attn_scalar^-0.5, and local layers that attend to a
             sliding window of keys with a rotary base of their own (five local to one global)

Anything else (an unknown architecture, softcapping, a bias elsewhere) is None: transformers'
own decoder runs it (engine/model/runner.py).
"""
from dataclasses import dataclass
import math

import torch

GLOBAL = "full_attention"            # transformers' layer type names
LOCAL = "sliding_attention"


@dataclass(frozen=True)
class Arch:
    name: str
    scale: float                     # attention's query scale
    windows: tuple                   # per layer: the keys a query sees (None: all before it)
    rope_types: tuple                # per layer: which rotary table (transformers' layer type)
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich: bool = False           # norms after attention and after the MLP too (Gemma)
    norm_offset: float = 0.0         # RMSNorm multiplies by (offset + w): Gemma keeps w - 1 (transformers' convention)
    embed_scale: float = 1.0
    act: str = "silu"                # the MLP's gate: "silu" or "gelu_tanh"


def describe(cfg):
    """The Arch of a transformers config, or None where the fused forward does not run it."""
    layers = cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    plain = dict(scale=head_dim ** -0.5, windows=(None,) * layers, rope_types=(GLOBAL,) * layers)
    kind = cfg.model_type
    if kind in ("llama", "qwen2", "qwen3"):
        rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "mlp_bias", False) \
                or getattr(cfg, "use_sliding_window", False) or rope not in ("default", "llama3"):
            return None
        if kind == "qwen2":
            return Arch(kind, qkv_bias=True, **plain)
        if getattr(cfg, "attention_bias", False):
            return None
        return Arch(kind, qk_norm=kind == "qwen3", **plain)
    if kind == "gemma3_text":
        if cfg.final_logit_softcapping or cfg.attn_logit_softcapping or cfg.attention_bias \
                or cfg.hidden_activation != "gelu_pytorch_tanh" or getattr(cfg, "use_bidirectional_attention", False):
            return None
        types = tuple(cfg.layer_types)
        return Arch("gemma3", scale=cfg.query_pre_attn_scalar ** -0.5, rope_types=types,
                    windows=tuple(cfg.sliding_window if t == LOCAL else None for t in types),
                    qk_norm=True, sandwich=True, norm_offset=1.0, embed_scale=math.sqrt(cfg.hidden_size),
                    act="gelu_tanh")
    return None


def rope_tables(decoder, arch, head_dim, positions):
    """{layer type: (cos, sin) [positions, head_dim / 2]} from the model's own rotary module (its
    scaling, Llama 3's included, and Gemma's local base as transformers computes them)."""
    pos = torch.arange(positions)[None]
    x = torch.zeros(1, 1, 1)                    # read for its dtype
    half = head_dim // 2
    out = {}
    with torch.no_grad():
        for t in sorted(set(arch.rope_types)):
            cos, sin = decoder.rotary_emb(x, pos, t) if arch.name == "gemma3" else decoder.rotary_emb(x, pos)
            out[t] = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()
    return out


def model_facts(cfg):
    """`hello`'s architecture, heads and per-layer windows (engine/events.py Hello)."""
    arch = describe(cfg)
    windows = list(arch.windows) if arch else [getattr(cfg, "sliding_window", None) if t == LOCAL else None
                                               for t in getattr(cfg, "layer_types", None) or [GLOBAL] * cfg.num_hidden_layers]
    return {"architecture": arch.name if arch else cfg.model_type, "heads": cfg.num_attention_heads, "windows": windows}
