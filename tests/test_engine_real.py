"""Integration: the engine on the real bundled SmolLM2-135M-Instruct, driven step by step."""
from engine import Engine, EngineConfig
from helpers import reference
from test_engine import Run, assert_clean

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
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims, fp32: 2*30*3*64*4 bytes per token
    assert hello.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4
    assert hello.layers == 30 and hello.cache_blocks == 512 // 16
    assert 130e6 < hello.params < 140e6
