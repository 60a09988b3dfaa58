"""Integration: the engine on the real bundled SmolLM2-135M-Instruct, driven step by step."""
import pytest

from engine import Engine, EngineConfig
from engine import events as ev
from engine.teach.loadgen import TASKS
from helpers import reference
from stepping import Run, assert_clean

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,",
           "Explain in one sentence why a KV cache speeds up decoding."]


def test_real_model_greedy_equals_generate_in_a_changing_batch(real):
    eng = Engine(real, EngineConfig(slots=3, kv_tokens=4096, max_context=1024))
    run = Run(eng)
    subs = [(p, {"max_new_tokens": 8 + 6 * i, "chat": i % 2 == 1}) for i, p in enumerate(PROMPTS)]
    for p, kw in subs:          # 4 requests through 3 slots, arriving 3 steps apart
        run.add(p, **kw)
        run.step(3)
    run.until_idle()
    tok = real.tokenizer
    for i, (p, kw) in enumerate(subs):
        text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                       add_generation_prompt=True) if kw["chat"] else p
        assert run.tokens(run.ids[i]) == reference(real, text, kw["max_new_tokens"]), f"prompt {i} diverged"
    # the answer to the chat question ends at <|im_end|> (EOS) or at its length limit
    assert run.finished(run.ids[1]).reason in ("stop", "length")
    assert_clean(eng)


def test_real_model_kv_bytes_and_capacity(real):
    hello = Engine(real, EngineConfig(slots=2, kv_tokens=512, max_context=1024)).hello()
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims: 2*30*3*64*4 bytes per token in fp32
    assert hello.kv_bytes_per_token == 2 * 30 * 3 * 64 * real.dtype.itemsize
    assert hello.layers == 30 and hello.cache_blocks == 512 // 16
    assert 130e6 < hello.params < 140e6


def run_and_compare(real, eng, texts, max_new=24):
    """`texts` added one step apart (two after the first); each output must equal
    `model.generate` alone. Returns the run."""
    run = Run(eng)
    for i, text in enumerate(texts):
        run.add(text, max_new_tokens=max_new, chat=False)
        run.step(2 if i == 0 else 1)
    run.until_idle()
    for i, text in enumerate(texts):
        assert run.tokens(run.ids[i]) == reference(real, text, max_new), f"prompt {i} diverged"
    return run


@pytest.mark.slow
def test_real_model_mixed_steps_preemption_and_prefix_hits_keep_greedy_output(real):
    """A 32-token step budget (prompts chunked, decodes riding along), a cache too small for
    everyone (preemption and recompute), and two chat prompts with the same system prompt
    (prefix hits): every output still equals `model.generate` alone."""
    tok = real.tokenizer
    system = {"role": "system", "content": "You are a careful assistant. Answer in one short sentence, "
                                           "plainly, without lists, and never repeat the question back."}
    chats = [[system, {"role": "user", "content": q}] for q in ("What is a KV cache?", "Why is the sky blue?")]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    texts += PROMPTS[:2]
    eng = Engine(real, EngineConfig(slots=4, kv_tokens=16 * 7, max_context=512))
    eng.apply_settings({"max_batched_tokens": 32})
    run = run_and_compare(real, eng, texts)
    assert run.of(ev.Preempted), "the cache was meant to be too small for all four"
    assert any(e.kind == "mixed" for e in run.of(ev.Step))
    assert max(e.cached_tokens for e in run.of(ev.Admitted) if e.id == run.ids[1]) >= 16
    assert_clean(eng)


@pytest.mark.parametrize("method,k", [("ngram", 4), ("suffix", 8)])
def test_real_model_speculation_keeps_greedy_output(real, method, k):
    """Speculation on the real model: two copy tasks (guesses mostly right) and two ordinary
    prompts, a 32-token step budget, a cache small enough to preempt, a shared system prompt:
    every output equals `model.generate` alone, guesses were accepted, and every block is back."""
    tok = real.tokenizer
    system = {"role": "system", "content": "You are a careful assistant. Answer in one short sentence."}
    texts = [tok.apply_chat_template([system, {"role": "user", "content": TASKS["copy"].format(text=t)}],
                                     tokenize=False, add_generation_prompt=True)
             for t in ("Four score and seven years ago our fathers brought forth on this continent a new nation.",
                       "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n")]
    texts += PROMPTS[2:]
    eng = Engine(real, EngineConfig(slots=4, kv_tokens=16 * 14, max_context=512))
    eng.apply_settings({"max_batched_tokens": 32, "speculation": method, "spec_tokens": k})
    run = run_and_compare(real, eng, texts)
    fins = [run.finished(r) for r in run.ids]
    assert sum(f.spec_accepted_tokens for f in fins[:2]) > 0
    assert any(e.kind == "mixed" and e.spec for e in run.of(ev.Step))
    assert max(e.cached_tokens for e in run.of(ev.Admitted) if e.id == run.ids[1]) >= 16
    assert_clean(eng)
