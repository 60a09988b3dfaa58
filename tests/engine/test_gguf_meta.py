"""A GGUF's config and tokenizer made without transformers' whole-file reader (engine/model/gguf_meta.py)
equal what transformers' Auto classes make from the same file: the config key for key, the
tokenizer id for id over a corpus of awkward texts, on the first start (the tokenizer just built)
and on a later one (read back from the cache directory). Tiny GGUF files of each architecture
(byte-level BPE, as tests/engine/tiny_gguf.py writes them); the bundled SmolLM2 (byte-level BPE,
49k tokens) and, when it is installed, Gemma 3 270M (SentencePiece BPE, 262k tokens) as real files."""
import pytest

from engine.model import fetch, gguf_meta, loading
import tiny_gguf

CORPUS = ["The capital of France is", "", " ", "  two  spaces ", "\n\nnew\nlines\t\ttabs\r\nCRLF",
          "digits 1234567890 and 3.14159, 1,000,000", "emoji 😀🎉👍🏽 and CJK 日本語の文章, Ελληνικά, русский",
          "café naïve façade Ünïcödé", "a" * 40 + " " + "ab" * 20, "   leading and trailing   ",
          "<bos>special<eos> <start_of_turn>user\nhi<end_of_turn>\n", "<|im_start|>user\nhi<|im_end|><|endoftext|>",
          "<unk><pad><mask> x<unused0>y", "def f(x):\n    return x ** 2  # code\n", "don't won't it's we'll"]
SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template")


def ids(tok):
    return [tok(text, add_special_tokens=special)["input_ids"] for text in CORPUS for special in (True, False)]


def same_tokenizers(ours, reference):
    assert ids(ours) == ids(reference)
    for skip in (True, False):
        assert [ours.decode(i, skip_special_tokens=skip) for i in ids(ours)] == \
               [reference.decode(i, skip_special_tokens=skip) for i in ids(ours)]
    assert {k: getattr(ours, k) for k in SPECIAL} == {k: getattr(reference, k) for k in SPECIAL}
    assert len(ours) == len(reference)


def first_and_later(path, tmp_path, monkeypatch):
    """The tokenizer of the engine's first start from `path` and of a later one (from the cache)."""
    monkeypatch.setenv("FIRST_TOKEN_CACHE", str(tmp_path))
    cold, warm = (loading.load(path, device="cpu", dtype="float32", dense=False) for _ in range(2))
    assert (cold.from_cache, warm.from_cache) == (False, True)
    return cold.tokenizer, warm.tokenizer


@pytest.mark.parametrize("arch", list(tiny_gguf.LAYERS))
def test_config_and_tokenizer_equal_transformers_auto_classes(arch, tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer
    path = tiny_gguf.write(tmp_path / f"{arch}.gguf", arch)
    reference = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    assert gguf_meta.config(path).to_dict() == {**reference, "_name_or_path": ""}
    cold, warm = first_and_later(path, tmp_path / "cache", monkeypatch)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    same_tokenizers(cold, reference)
    same_tokenizers(warm, reference)


def built_and_read_back(path, tmp_path):
    """A real file's tokenizer as a first start builds it, and as a later start reads it from the cache."""
    from transformers import PreTrainedTokenizerFast
    built = gguf_meta.tokenizer(path, gguf_meta.config(path))
    built.save_pretrained(tmp_path)
    return built, PreTrainedTokenizerFast.from_pretrained(tmp_path)


# On the real files the conversion is transformers' own call (the class AutoTokenizer picks, which the
# tiny files above hold to AutoTokenizer itself: AutoTokenizer on these files spends its time reading the
# whole file for the config, ~40 s on Gemma's); what is checked here is the cache's round trip at full size.
@pytest.mark.real_model
def test_the_bundled_smollm2s_byte_level_tokenizer_reads_back_from_the_cache_unchanged(tmp_path):
    built, read_back = built_and_read_back(loading.default_model_path(), tmp_path)
    same_tokenizers(read_back, built)
    assert built("The capital of France is")["input_ids"] == built("The capital of France is", add_special_tokens=False)["input_ids"]


GEMMA = loading.cache_root() / "models" / fetch.NAME


@pytest.mark.real_model
@pytest.mark.skipif(not GEMMA.is_file(), reason=f"Gemma 3 270M is not installed at {GEMMA} (`make gemma` "
                    "fetches it; FIRST_TOKEN_CACHE names another cache)")
def test_gemmas_sentencepiece_tokenizer_reads_back_from_the_cache_unchanged(tmp_path):
    built, read_back = built_and_read_back(GEMMA, tmp_path)
    same_tokenizers(read_back, built)
    prompt = built("The capital of France is")["input_ids"]
    assert prompt[0] == built.bos_token_id == 2 and len(prompt) == 6     # BOS first, as Gemma wants
