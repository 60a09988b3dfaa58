"""A GGUF's config and tokenizer as transformers makes them, without its whole-file reader.

`AutoConfig.from_pretrained(gguf_file=...)` (and `AutoTokenizer`, which asks for the config first)
reads a file of an architecture outside transformers' newer config table through `gguf.GGUFReader`,
which builds numpy views for every metadata value: for Gemma 3's 262,144-token vocabulary (tokens,
scores, types: ~790k values) that is ~40 s per call on this machine's cores, and a first start made
two such calls. Here the metadata is read by transformers' own fast reader (arrays of strings left as
counts) and the config built from it with transformers' key table, as `load_gguf_checkpoint` does
for the architectures the engine reads from blocks; the tokenizer is transformers' GGUF conversion
itself (`get_gguf_tokenizer` + `convert_gguf_tokenizer`, also on the fast reader), so its ids are
transformers' by construction. tests/engine/test_gguf_meta.py holds both to the Auto classes.
"""


def config(path):
    """transformers' config of the GGUF at `path` (llama, qwen2, qwen3 or gemma3), as
    `AutoConfig.from_pretrained(path.parent, gguf_file=path.name)` makes it."""
    from transformers import AutoConfig
    from transformers.integrations.gguf import read_gguf_metadata
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_TO_TRANSFORMERS_MAPPING
    meta, tensor_names = read_gguf_metadata(str(path))
    arch = meta["general.architecture"]
    if arch == "llama" and meta.get("general.name") == "mistral":
        raise ValueError(f"{path}: a Mistral file named as llama; transformers renames its keys (not done here)")
    values = {"tie_word_embeddings": "output.weight" not in tensor_names, **GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {})}
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for key, value in meta.items():
        prefix, _, rest = key.partition(".")
        name = renames.get(prefix, {}).get(rest)
        if name is None or name == -1:            # a key transformers reads elsewhere, or skips
            continue
        values[name] = value[0] if isinstance(value, list) and len(value) == 1 else value   # as transformers unwraps
    if values["model_type"] == "gemma3":          # its GGUF holds the text model only
        values["model_type"] = "gemma3_text"
    if "vocab_size" not in values:                # the vocabulary's length (the reader leaves a string array as its count)
        values["vocab_size"] = meta["tokenizer.ggml.tokens"]
    return AutoConfig.for_model(**values)


def tokenizer(path, config):
    """transformers' fast tokenizer converted from the GGUF at `path` (whose `config` this module made),
    with the file's special tokens, BOS/EOS flags and chat template: the class `AutoTokenizer` picks for
    a GGUF (the config's registered tokenizer, else the generic one) running the same conversion,
    without AutoTokenizer's own read of the whole file for the config."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    cls = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if cls is None or cls.__name__ == "MistralCommonBackend":    # that one wants Mistral's own files, not a GGUF
        cls = TokenizersBackend
    return cls.from_pretrained(path.parent, gguf_file=path.name)
