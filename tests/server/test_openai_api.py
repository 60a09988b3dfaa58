"""The OpenAI-compatible API, driven by the official `openai` client: in process against the app
from `create_app` on the tiny random model (validation through Flask's test client), plus one
end-to-end test of the real app on the real model."""
import json
import math

import openai
import pytest
import requests
from simple_websocket import Client

from helpers import collect, frames, reference, wait_until

PROMPT = "We hold these truths to be self-evident, that all men"
CHAT = [{"role": "user", "content": "Name three colours."}]


def openai_client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def client(live):
    return openai_client(live.url)


@pytest.fixture
def model(live):
    return live.driver.api_model


def greedy(bundle, text, max_new):
    """`model.generate`'s greedy continuation of `text`: (prompt tokens, token ids, decoded text)."""
    ids = reference(bundle, text, max_new)
    n_prompt = len(bundle.tokenizer(text, add_special_tokens=False).input_ids)
    return n_prompt, ids, bundle.tokenizer.decode(ids, skip_special_tokens=True)


def check_greedy_chat_and_streamed_completion(client, model, bundle):
    """A greedy chat completion and a streamed greedy completion equal `model.generate`."""
    chat_text = bundle.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    n_prompt, ids, text = greedy(bundle, chat_text, 10)
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == text
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == len(ids)
    assert r.choices[0].finish_reason == ("stop" if ids[-1] == bundle.tokenizer.eos_token_id else "length")

    n_prompt, ids, text = greedy(bundle, PROMPT, 10)
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == n_prompt
    assert chunks[-1].usage.completion_tokens == len(ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def health(live):
    return live.app.test_client().get("/healthz").get_json()


def clean(live):
    h = health(live)
    return h["running"] == 0 and h["waiting"] == 0


def test_models_lists_the_served_model(live, client, model, tiny):
    served = client.models.list().data
    assert [m.id for m in served] == [tiny.name] == [health(live)["model"]]
    assert served[0].max_model_len == live.driver.max_context == 512


def test_greedy_chat_and_completion_equal_generate(client, model, tiny):
    check_greedy_chat_and_streamed_completion(client, model, tiny)


@pytest.mark.slow
def test_real_model_end_to_end_greedy_equals_generate(server, real):
    """The one end-to-end check: `python app.py` in its own process on the real model."""
    client = openai_client(server.url)
    model = client.models.list().data[0].id
    assert model == requests.get(server.url + "/healthz", timeout=30).json()["model"] == real.name
    check_greedy_chat_and_streamed_completion(client, model, real)


def test_streaming_chat_equals_non_streaming(client, model):
    full = client.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=8,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage == full.usage
    no_usage = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature=0,
                                                   stream=True))
    assert all(c.usage is None and c.choices for c in no_usage)


def test_seed_reproducible(client, model):
    def sample(seed):
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0,
                                         seed=seed).choices[0].text
    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first


def mid_stop(text):
    """Four printable characters from the middle of `text` (the tiny model's text is gibberish,
    with U+FFFD where it emits a lone byte): they may begin inside one token and end in another."""
    return next(text[i:i + 4] for i in range(6, len(text) - 4)
                if text[i:i + 4].isprintable() and "\ufffd" not in text[i:i + 4])


def test_stop_strings_cut_before_the_stop(client, model, tiny):
    _, _, full = greedy(tiny, PROMPT, 12)
    assert client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text == full
    stop = mid_stop(full)
    want = full[:full.find(stop)]
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 12
    streamed = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                              stop=["never-appears", stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want
    assert streamed[-1].choices[0].finish_reason == "stop"


def error_of(response):
    body = response.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def test_bad_requests_get_openai_shaped_errors(live, model):
    http = live.app.test_client()
    chat, comp = "/v1/chat/completions", "/v1/completions"
    user = [{"role": "user", "content": "hi"}]
    too_long = live.driver.max_context - 1   # valid on its own; with the chat prompt it does not fit
    cases = [  # (url, body, status, param, code)
        (chat, {"model": model}, 400, "messages", None),
        (chat, {"model": model, "messages": []}, 400, "messages", None),
        (chat, {"model": model, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", None),
        (chat, {"model": model, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
        (chat, {"model": model, "messages": user, "max_tokens": -1}, 400, "max_tokens", None),
        (chat, {"model": model, "messages": user, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
        (chat, {"model": model, "messages": user, "temperature": "hot"}, 400, "temperature", None),
        (chat, {"model": model, "messages": user, "top_p": 0}, 400, "top_p", None),
        (chat, {"model": model, "messages": user, "seed": 1.5}, 400, "seed", None),
        (chat, {"model": model, "messages": user, "stop": 5}, 400, "stop", None),
        (chat, {"model": model, "messages": user, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
        (chat, {"model": model, "messages": user, "stream": "yes"}, 400, "stream", None),
        (chat, {"model": model, "messages": user, "stream_options": {"include_usage": True}}, 400,
         "stream_options", None),
        (chat, {"model": model, "messages": user, "n": 0}, 400, "n", None),
        (chat, {"model": model, "messages": user, "speculative_config": {"method": "eagle"}}, 400,
         "speculative_config", None),
        (chat, {"model": model, "messages": user, "priority": "urgent"}, 400, "priority", None),
        (comp, {"model": model, "prompt": "hi", "priority": 2**40}, 400, "priority", None),
        (chat, {"model": model, "messages": user, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "logprobs": True, "top_logprobs": -1}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "logprobs": True, "top_logprobs": "5"}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "logprobs": True, "top_logprobs": 2.5}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "top_logprobs": 3}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "logprobs": "yes"}, 400, "logprobs", None),
        (comp, {"model": model, "prompt": "hi", "logprobs": 50}, 400, "logprobs", None),
        (comp, {"model": model, "prompt": "hi", "logprobs": -1}, 400, "logprobs", None),
        (comp, {"model": model, "prompt": "hi", "logprobs": "five"}, 400, "logprobs", None),
        (comp, {"model": model, "prompt": "hi", "logprobs": True}, 400, "logprobs", None),
        (comp, {"model": model, "prompt": "hi", "top_logprobs": 5}, 400, "top_logprobs", None),
        (chat, {"model": model, "messages": user, "echo": True}, 400, "echo", "unsupported_parameter"),
        (chat, {"messages": user}, 400, "model", None),
        (chat, {"model": "gpt-9", "messages": user}, 404, "model", "model_not_found"),
        (comp, {"model": model, "prompt": ""}, 400, "prompt", None),
        (comp, {"model": model, "prompt": [1, 2, 10**9]}, 400, "prompt", None),
        (comp, {"model": model, "prompt": "truths " * 5000, "max_tokens": 4}, 400, "prompt",
         "context_length_exceeded"),
        (comp, {"model": model, "prompt": "truths " * 5000, "max_tokens": 4, "stream": True}, 400, "prompt",
         "context_length_exceeded"),
        (chat, {"model": model, "messages": user, "max_tokens": too_long}, 400, "messages",
         "context_length_exceeded"),
    ]
    for url, body, status, param, code in cases:
        r = http.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        err = error_of(r)
        assert (err["param"], err["code"]) == (param, code), (body, err)
        assert err["type"] == "invalid_request_error"
    for raw, status in ((b"{not json", 400), (b"[1, 2]", 400), (b"\xff\xfe", 400), (b" " * (1 << 20) + b"{}", 413)):
        r = http.post(chat, data=raw, content_type="application/json")
        assert r.status_code == status and error_of(r)
    assert clean(live)


def test_openai_client_raises_the_right_exceptions(client, model):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=CHAT)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="truths " * 5000, max_tokens=4)
    assert e.value.code == "context_length_exceeded"


def test_api_requests_are_on_the_timeline_and_a_dropped_stream_frees_its_slot(live, model):
    max_tokens = 450   # the tiny model writes these in well under a second: the client leaves long before
    ws = Client.connect(live.ws_url)
    try:
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with requests.post(live.url + "/v1/completions", json=body, stream=True, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line.startswith(b"data:"))
            first = json.loads(next(lines)[5:])
            next(lines)
        rid = first["id"].removeprefix("cmpl-")   # the engine's request id
        events = frames(ws, 60, until=lambda evs: any(e["type"] == "finished" and e.get("id") == rid for e in evs))
    finally:
        ws.close()
    mine = [e for e in events if e.get("id") == rid]
    assert [e["source"] for e in mine if e["type"] == "request"] == ["api"]
    finished = [e for e in mine if e["type"] == "finished"]
    assert finished and finished[0]["reason"] == "cancelled" and finished[0]["output_tokens"] < max_tokens
    assert clean(live)   # the slot was freed before `finished` was published


def test_a_rows_preview_is_what_was_asked_not_the_chat_template(live, client, model):
    """`request.preview` is the user's message of a chat (the template around it, the same for
    every row, is not shown) and a completion's prompt."""
    sub = live.driver.events.subscribe(replay=False)
    client.chat.completions.create(model=model, max_tokens=2, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour, please."}])
    client.completions.create(model=model, max_tokens=2, prompt="Once upon a time")
    events = collect(sub, lambda evs: sum(e["type"] == "request" for e in evs) >= 2)
    previews = [e["preview"] for e in events if e["type"] == "request"]
    assert previews == ["Name a colour, please.", "Once upon a time"]


# ------------------------------------------------------------------ log-probabilities (protocol 14)
def token_events(live, rid):
    """The engine's own token events of request `rid` (the broadcaster's history), once its
    `finished` is there: the client may have its answer before the step's events are published."""
    got = []

    def finished():
        sub = live.driver.events.subscribe(replay=True)
        try:
            got[:] = [e for e in sub.get(timeout=0) if e.get("id") == rid]
        finally:
            live.driver.events.unsubscribe(sub)
        return any(e["type"] == "finished" for e in got)
    wait_until(finished, 10, f"{rid}'s finished event")
    return [e for e in got if e["type"] == "token"]


def test_the_openai_client_reads_chat_top_logprobs(live, client, model, tiny):
    """Chat `logprobs: true, top_logprobs: 5`, greedy: every token's entry is the model's own
    log-probability (the engine's `p_raw`), its five candidates are the engine's, most likely
    first with the chosen one on top, and the stream carries the same entries."""
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    events = token_events(live, r.id.removeprefix("chatcmpl-"))
    for entry, ev in zip(content, events):
        assert len(entry.top_logprobs) == 5
        assert entry.token == tiny.tokenizer.decode([ev["token_id"]]) and bytes(entry.bytes) == entry.token.encode()
        assert math.exp(entry.logprob) == pytest.approx(ev["p_raw"], abs=6e-4)
        assert [t.token for t in entry.top_logprobs] == [c[1] for c in ev["top"]]
        assert [math.exp(t.logprob) for t in entry.top_logprobs] == pytest.approx([c[3] for c in ev["top"]], abs=6e-4)
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert all(a.logprob >= b.logprob for a, b in zip(entry.top_logprobs, entry.top_logprobs[1:]))
        assert entry.logprob <= 0
    assert "".join(e.token for e in content) == r.choices[0].message.content   # plain text: the pieces add up
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
                                            top_logprobs=5, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [t.logprob for t in e.top_logprobs]) for e in content]
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None
    zero = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, temperature=0, logprobs=True)
    assert [e.top_logprobs for e in zero.choices[0].logprobs.content] == [[], []]


def test_the_openai_client_reads_completions_logprobs(live, client, model):
    """Completions `logprobs: 5` in OpenAI's legacy shape, sampled (temperature 1.2, seeded): the
    chosen token's log-probability is the model's own (before temperature: the engine's
    `p_raw`, not `p`), up to five candidates plus the chosen one, text offsets that run over the
    output; the stream gives the same."""
    kw = dict(model=model, prompt=PROMPT, max_tokens=10, temperature=1.2, seed=4, logprobs=5)
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    events = token_events(live, r.id.removeprefix("cmpl-"))
    assert any(abs(ev["p"] - ev["p_raw"]) > 1e-3 for ev in events)   # the temperature changed the odds ...
    for i, ev in enumerate(events):
        assert math.exp(lp.token_logprobs[i]) == pytest.approx(ev["p_raw"], abs=6e-4)   # ... the API gives the raw ones
        assert lp.tokens[i] in lp.top_logprobs[i] and lp.top_logprobs[i][lp.tokens[i]] == lp.token_logprobs[i]
        assert len(lp.top_logprobs[i]) == len({c[1] for c in ev["top"][:5]} | {lp.tokens[i]})   # keyed by text
    offsets = [0]
    for ev in events[:-1]:
        offsets.append(offsets[-1] + len(ev["text"]))
    assert lp.text_offset == offsets
    chunks = list(client.completions.create(**kw, stream=True))
    assert [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs] == \
        lp.token_logprobs
    assert [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset] == \
        lp.text_offset


def test_a_base_models_tokenizer_bos_first_and_no_chat_template(tiny):
    """A model whose tokenizer adds BOS and has no chat template (a base model's file, as Gemma 3
    270M's): a completion's prompt starts with BOS and its greedy output equals `generate` on
    those ids; a chat is a 400 naming the template (vLLM's words), and nothing is left running."""
    from engine import EngineConfig
    from helpers import LiveApp, tiny_bundle
    bundle = tiny_bundle(bos=True, chat_template=None)
    live = LiveApp(bundle, EngineConfig(slots=2, kv_tokens=1024, max_context=256))
    try:
        client, model = openai_client(live.url), live.driver.api_model
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
        ids = reference(bundle, PROMPT, 8, add_special_tokens=True)
        assert r.choices[0].text == bundle.tokenizer.decode(ids, skip_special_tokens=True)
        assert r.usage.prompt_tokens == len(bundle.tokenizer(PROMPT, add_special_tokens=False).input_ids) + 1
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, extra_body={"add_special_tokens": False})
        assert r.usage.prompt_tokens == len(bundle.tokenizer(PROMPT, add_special_tokens=False).input_ids)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=4)
        assert e.value.param == "chat_template" and "no chat template" in e.value.message
        r = live.app.test_client().post("/v1/completions", json={"model": model, "prompt": PROMPT, "add_special_tokens": "no"})
        assert r.status_code == 400 and error_of(r)["param"] == "add_special_tokens"
        assert clean(live)
    finally:
        live.stop()
