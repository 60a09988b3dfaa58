"""vLLM's small endpoints beside /v1 (server/tokenizing.py, server/api.py), on the tiny model's
app: /health, /version, /tokenize and /detokenize in vLLM's shapes, /tokenizer_info as
lm-evaluation-harness's remote tokenizer reads it."""
from test_openai_api import error_of, clean


def test_health_is_200_while_serving_and_version_names_the_protocol(live):
    http = live.app.test_client()
    r = http.get("/health")
    assert r.status_code == 200 and r.data == b""
    assert http.get("/healthz").status_code == 200   # kept
    from engine.events import PROTOCOL
    assert http.get("/version").get_json()["protocol"] == PROTOCOL


def test_health_is_503_once_the_engine_failed(live):
    live.driver.failure = "a test said so"
    try:
        assert live.app.test_client().get("/health").status_code == 503
    finally:
        live.driver.failure = None


def test_tokenize_then_detokenize_round_trips(live, tiny):
    http, tok = live.app.test_client(), tiny.tokenizer
    text = "We hold these truths to be self-evident, ünïcödé 🙂"
    r = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.get_json()
    assert body["tokens"] == tok(text, add_special_tokens=False)["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == live.driver.max_context
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])
    back = http.post("/detokenize", json={"model": live.driver.api_model, "tokens": body["tokens"]}).get_json()
    assert back == {"prompt": text}
    plain = http.post("/tokenize", json={"prompt": text}).get_json()
    assert plain["token_strs"] is None
    assert plain["tokens"] == tok(text)["input_ids"]   # vLLM's default: add_special_tokens true


def test_tokenize_counts_a_chat_as_the_engine_does(live, tiny):
    """`messages` go through the chat template; the count is the prompt_tokens a chat completion reports."""
    http = live.app.test_client()
    chat = [{"role": "user", "content": "Name three colours."}]
    counted = http.post("/tokenize", json={"messages": chat}).get_json()["count"]
    r = http.post("/v1/chat/completions", json={"model": live.driver.api_model, "messages": chat, "max_tokens": 1})
    assert r.get_json()["usage"]["prompt_tokens"] == counted


def test_tokenizer_info_has_what_lm_eval_reads(live, tiny):
    info = live.app.test_client().get("/tokenizer_info").get_json()
    assert info["eos_token"] == tiny.tokenizer.eos_token   # lm-eval refuses a server without it
    assert {"bos_token", "pad_token", "chat_template"} <= set(info)
    assert info["chat_template"] == tiny.tokenizer.chat_template
    assert info["model_max_length"] == live.driver.max_context


def test_bad_tokenizer_requests_name_the_field(live, tiny):
    http = live.app.test_client()
    vocab = len(tiny.tokenizer)
    cases = [("/tokenize", {}, 400, "prompt"), ("/tokenize", {"prompt": 5}, 400, "prompt"),
             ("/tokenize", {"prompt": "a\u0000b"}, 400, "prompt"),
             ("/tokenize", {"prompt": "hi", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
             ("/tokenize", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
             ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
             ("/detokenize", {"tokens": "12"}, 400, "tokens"),
             ("/detokenize", {"tokens": [1, vocab]}, 400, "tokens"),
             ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
             ("/detokenize", {"tokens": [True]}, 400, "tokens")]
    for url, body, status, param in cases:
        r = http.post(url, json=body)
        assert r.status_code == status, (url, body, r.text)
        assert error_of(r)["param"] == param, (url, body)
    assert clean(live)
