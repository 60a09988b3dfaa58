"""Architectures through the engine's own forward (engine/model/archs.py, llama.py), loaded from a
GGUF file's own metadata and blocks (engine/model/loading.py): a tiny random model of each, written
with the `gguf` package's writer (tests/engine/tiny_gguf.py), served by the engine as the server
loads it (blocks kept, no fp32 copy, the fused forward) and loaded by transformers from the same
file, the reference: greedy output equal to `generate`, teacher-forced logits close."""
import pytest
import torch

from engine import Engine, EngineConfig
from engine import events as ev
from engine.model import loading
from engine.timing.measure import _Synthetic
from stepping import Run
import tiny_gguf

PROMPT = "We hold these truths to be self-evident, that all men are created equal"
NEW = 24
CASES = [("llama", "Q8_0"), ("qwen2", "F32"), ("qwen2", "Q8_0"), ("qwen3", "Q8_0"), ("qwen3", "mixed"),
         ("gemma3", "F32"), ("gemma3", "Q8_0")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {case: tiny_gguf.write(root / f"{case[0]}-{case[1]}.gguf", case[0], kind=case[1]) for case in CASES}


@pytest.fixture
def served(files, tmp_path, monkeypatch):
    """(the engine's bundle as the server loads it, transformers' model and tokenizer) of a case."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    monkeypatch.setenv("FIRST_TOKEN_CACHE", str(tmp_path))

    def load(case):
        path = files[case]
        bundle = loading.load(path, device="cpu", dtype="float32", dense=False)
        ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        return bundle, ref, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return load


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_greedy_and_logits_equal_transformers_on_the_same_file(served, case):
    bundle, ref, tok = served(case)
    assert bundle.model.config.model_type == ref.config.model_type
    assert not bundle.dense or case[1] == "F32"           # blocks: the model's linear weights never made
    assert {w.name for w in bundle.quant.values()} == ({"Q8_0"} if case[1] == "mixed" else {case[1]} - {"F32"})
    eng = Engine(bundle, EngineConfig(slots=2, kv_tokens=1024, block_size=16, max_context=256))
    assert eng.runner.fused is not None                    # the engine's own forward, not transformers'
    run = Run(eng)
    rid = run.add(PROMPT, max_new_tokens=NEW, temperature=0, ignore_eos=True)
    run.until_idle()
    ids = tok(PROMPT, return_tensors="pt").input_ids       # with the tokenizer's own BOS where it adds one
    assert run.of(ev.Tokenized, rid)[0].n == ids.shape[1]
    want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                        min_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    assert run.tokens(rid) == want and len(set(want)) > 3
    # teacher-forced: the prompt and the output in two chunks (the second reads the first's keys from
    # the blocks; Gemma's local layers mask past their window in both)
    seq_ids = ids[0].tolist() + want
    with torch.no_grad():
        expected = ref(torch.tensor([seq_ids])).logits[0]
    with _Synthetic(eng.blocks.pool, ref.config.vocab_size) as syn:
        seq = syn.seq(len(seq_ids))
        seq.prompt_ids[:] = seq_ids
        half = len(seq_ids) // 2
        got = torch.cat([eng.runner.logits_everywhere(seq, 0, half),
                         eng.runner.logits_everywhere(seq, half, len(seq_ids) - half)])
    assert (got - expected).abs().max() < 1e-3 * expected.abs().max()


def test_gemmas_local_layers_see_only_their_window(files, tmp_path, monkeypatch):
    """The same Gemma with every layer global reads differently once a prompt is past the window:
    the window is what the engine applies, not an accident of short prompts."""
    monkeypatch.setenv("FIRST_TOKEN_CACHE", str(tmp_path))
    bundle = loading.load(files[("gemma3", "F32")], device="cpu", dtype="float32", dense=False)
    eng = Engine(bundle, EngineConfig(slots=2, kv_tokens=1024, block_size=16, max_context=256))
    fused = eng.runner.fused
    assert [w is not None for w in fused.arch.windows] == [True] * 5 + [False]
    assert set(fused.arch.windows) - {None} == {tiny_gguf.WINDOW}
    ids = bundle.tokenizer(PROMPT).input_ids
    assert len(ids) > tiny_gguf.WINDOW

    def logits():
        with _Synthetic(eng.blocks.pool, bundle.model.config.vocab_size) as syn:
            seq = syn.seq(len(ids))
            seq.prompt_ids[:] = ids
            return eng.runner.logits_everywhere(seq, 0, len(ids))
    hello = eng.hello().to_dict()
    assert (hello["architecture"], hello["heads"], hello["kv_heads"]) == ("gemma3", 2, 1)
    assert hello["windows"] == [tiny_gguf.WINDOW] * 5 + [None]
    windowed = logits()
    fused.arch = type(fused.arch)(**{**fused.arch.__dict__, "windows": (None,) * 6})
    unwindowed = logits()
    w = tiny_gguf.WINDOW
    assert torch.allclose(windowed[:w], unwindowed[:w], atol=1e-5)     # within the window: the same
    assert not torch.allclose(windowed[w:], unwindowed[w:], atol=1e-3)


def test_llama3s_rope_scaling_from_the_files_rope_freqs(tmp_path, monkeypatch):
    """Llama 3's scaled rotary frequencies, stored by llama.cpp as `rope_freqs` (each frequency's
    divisor): the engine equals transformers' Llama with the same weights and `rope_type: llama3`
    (transformers' GGUF loader leaves the scaling out: loaded from the file, it reads differently)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    monkeypatch.setenv("FIRST_TOKEN_CACHE", str(tmp_path / "cache"))
    scaling = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    d = tiny_gguf.SHAPES["llama"][2]
    plain = 1.0 / 10_000.0 ** (torch.arange(0, d, 2).float() / d)
    path = tmp_path / "llama3.gguf"

    def with_scaling(model):
        cfg = type(model.config).from_dict({**model.config.to_dict(), "rope_parameters": scaling})
        m = LlamaForCausalLM(cfg).eval()
        m.load_state_dict(model.state_dict(), strict=False)
        m.tie_weights()
        return m
    # the factors as llama.cpp's converter computes them: plain / scaled
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(hidden_size=64, num_attention_heads=64 // d, head_dim=d,
                                                          rope_parameters=scaling))
    tiny_gguf.write(path, "llama", kind="Q8_0", rope_freqs=(plain / scaled).tolist())
    unscaled = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ref, tok = with_scaling(unscaled), AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    bundle = loading.load(path, device="cpu", dtype="float32", dense=False)
    eng = Engine(bundle, EngineConfig(slots=2, kv_tokens=1024, block_size=16, max_context=256))
    assert eng.runner.fused is not None
    run = Run(eng)
    rid = run.add(PROMPT, max_new_tokens=NEW, temperature=0, ignore_eos=True)
    run.until_idle()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                        min_new_tokens=NEW)[0, ids.shape[1]:].tolist()
    assert run.tokens(rid) == want
    seq_ids = torch.tensor([ids[0].tolist() + want])
    with torch.no_grad():
        expected, other = ref(seq_ids).logits[0], unscaled(seq_ids).logits[0]
    with _Synthetic(eng.blocks.pool, ref.config.vocab_size) as syn:
        seq = syn.seq(seq_ids.shape[1])
        seq.prompt_ids[:] = seq_ids[0].tolist()
        got = eng.runner.logits_everywhere(seq, 0, seq_ids.shape[1])
    assert (got - expected).abs().max() < 1e-3 * expected.abs().max()
    assert (got - other).abs().max() > 1e-2 * expected.abs().max()    # the scaling is read, and matters
