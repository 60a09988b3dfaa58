"""Tiny random models written as GGUF files with the `gguf` package's writer, as llama.cpp's
converter lays them out (tensor names, metadata keys, Gemma's norms stored as 1 + w), each with
the tiny byte-level tokenizer (tests/helpers.py) in the file: read by the engine's loader and by
transformers' GGUF loader, the reference."""
import json

import numpy as np

from helpers import tiny_tokenizer

HIDDEN, FFN, CONTEXT = 64, 128, 1024
# Gemma: six layers, as its pattern has them (five local, then a global one; transformers' default,
# which its GGUF does not carry, as llama.cpp's does not)
LAYERS = {"llama": 3, "qwen2": 3, "qwen3": 3, "gemma3": 6}
# (heads, kv heads, head size) per architecture: Gemma's head size is transformers' default
# query_pre_attn_scalar (256), which its GGUF config does not carry (as Gemma 3 270M's).
# Qwen3's likewise its default head_dim (128), which transformers does not read from the file.
SHAPES = {"llama": (4, 2, 16), "qwen2": (4, 2, 16), "qwen3": (2, 1, 128), "gemma3": (2, 1, 256)}
WINDOW = 8     # Gemma's sliding window here: short, so prompts run past it


def write(path, arch, seed=0, kind="F32", rope_freqs=None):
    """A tiny random `arch` model as a GGUF file at `path`; `kind` the linear layers' type (F32,
    F16, Q8_0 or "mixed"; the embedding, tied to the head, is F32); `rope_freqs` (llama): the factors each
    rotary frequency is divided by, as llama.cpp writes Llama 3's scaling."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    from gguf.quants import quantize
    rng = np.random.default_rng(seed)
    tok = tiny_tokenizer(bos=arch == "gemma3", chat_template=None)
    heads, kv_heads, head_dim = SHAPES[arch]
    layers = LAYERS[arch]
    w = GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(tok))
    if arch in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(WINDOW)
        w.add_rope_freq_base(1_000_000.0)
    else:
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10_000.0)

    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"]: t["id"] for t in spec["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t, _ in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.eos_token_id)
    if tok.bos_token_id is not None:
        w.add_bos_token_id(tok.bos_token_id)
    w.add_add_bos_token(tok.bos_token_id is not None)

    def tensor(name, shape, scale=0.2, norm=False):
        x = ((1 if norm else 0) + rng.standard_normal(shape) * scale).astype(np.float32)   # norms near 1
        # "mixed": q F32 beside Q8_0 k and v, as a real file mixes a type the kernels read with one they do not
        k = ("F32" if "attn_q." in name else "Q8_0") if kind == "mixed" else kind
        if len(shape) == 2 and not name.startswith("token_embd") and k != "F32":
            qt = GGMLQuantizationType[k]
            w.add_tensor(name, quantize(x, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, x.astype(np.float32))

    tensor("token_embd.weight", (len(tok), HIDDEN), 0.2 / 8 if arch == "gemma3" else 0.2)   # Gemma scales it by sqrt(64)
    for i in range(layers):
        b = f"blk.{i}."
        tensor(b + "attn_norm.weight", (HIDDEN,), 0.2, norm=True)
        tensor(b + "attn_q.weight", (heads * head_dim, HIDDEN))
        tensor(b + "attn_k.weight", (kv_heads * head_dim, HIDDEN))
        tensor(b + "attn_v.weight", (kv_heads * head_dim, HIDDEN))
        tensor(b + "attn_output.weight", (HIDDEN, heads * head_dim), 0.2 if head_dim < 256 else 0.05)
        tensor(b + "ffn_gate.weight", (FFN, HIDDEN))
        tensor(b + "ffn_up.weight", (FFN, HIDDEN))
        tensor(b + "ffn_down.weight", (HIDDEN, FFN))
        tensor(b + "ffn_norm.weight", (HIDDEN,), 0.2, norm=True)
        if arch == "qwen2":
            for p, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                tensor(b + f"attn_{p}.bias", (n * head_dim,))
        if arch in ("qwen3", "gemma3"):
            tensor(b + "attn_q_norm.weight", (head_dim,), 0.2, norm=True)
            tensor(b + "attn_k_norm.weight", (head_dim,), 0.2, norm=True)
        if arch == "gemma3":
            tensor(b + "post_attention_norm.weight", (HIDDEN,), 0.2, norm=True)
            tensor(b + "post_ffw_norm.weight", (HIDDEN,), 0.2, norm=True)
    tensor("output_norm.weight", (HIDDEN,), 0.2, norm=True)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
