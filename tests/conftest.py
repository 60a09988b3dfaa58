"""Shared fixtures: a tiny random model (fast unit tests) and the real bundled model."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import model as model_mod  # noqa: E402
from engine.loadgen import CORPUS  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer():
    """A byte-level BPE (vocab 400) trained in well under a second on the shipped corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<|user|>", "<|assistant|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([CORPUS.read_text()], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_bundle(seed=0, layers=2):
    """A randomly initialised Llama from a config; init scaled up so logits are well separated."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.2, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                      bos_token_id=None, tie_word_embeddings=True)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.eos_token_id
    return model_mod.ModelBundle(m, tok, "tiny-random-llama", "cpu", torch.float32, 0.0, False)


@pytest.fixture(scope="session")
def tiny():
    return tiny_bundle()


@pytest.fixture(scope="session")
def real():
    """The bundled SmolLM2-135M-Instruct (dequantised once, then loaded from the disk cache)."""
    return model_mod.load()
