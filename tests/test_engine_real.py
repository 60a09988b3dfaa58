"""Integration: the engine on the real bundled SmolLM2-135M-Instruct."""
from engine import Engine
from test_engine import assert_clean, reference, run

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,",
           "Explain in one sentence why a KV cache speeds up decoding."]


def test_real_model_greedy_equals_generate_in_a_changing_batch(real):
    eng = Engine(real, slots=3, kv_tokens=4096, max_context=1024).start()
    try:
        subs = [(p, {"max_new_tokens": 8 + 6 * i, "chat": i % 2 == 1}) for i, p in enumerate(PROMPTS)]
        got = run(eng, subs, stagger_s=0.1)
        tok = real.tokenizer
        for i, (p, kw) in enumerate(subs):
            text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) if kw["chat"] else p
            assert got[i][0] == reference(real, text, kw["max_new_tokens"]), f"prompt {i} diverged"
        # the answer to the chat question ends at <|im_end|> (EOS) or at its length limit
        assert got[1][1][1]["reason"] in ("stop", "length")
        assert_clean(eng)
    finally:
        eng.shutdown()


def test_real_model_kv_bytes_and_capacity(real):
    eng = Engine(real, slots=2, kv_tokens=512, max_context=1024)
    hello = eng.hello()
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims, fp32: 2*30*3*64*4 bytes per token
    assert hello["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert hello["layers"] == 30 and hello["cache_blocks"] == 512 // 16
    assert 130e6 < hello["params"] < 140e6
