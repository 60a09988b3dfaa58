"""Input no entry point may fail on (server/inputs.py, issue 25): JSON nested past any sane
depth, lone surrogates (JSON's "\\ud800", which the tokenizer raises TypeError on) and NUL in
every text field. Through the app factory on the tiny random model, each is answered 4xx
naming the problem — the API in OpenAI's error shape, the websocket with an `error` event on
a connection that stays open — and the same client's next normal request succeeds."""
import json

import pytest
from simple_websocket import Client

from engine.settings import SettingError
from helpers import frames
from server import inputs
from server.openai_api import ApiError

DEEP = "[" * 100000 + "]" * 100000            # the body: RecursionError in json.loads
SURROGATE = "\ud800"


@pytest.mark.parametrize("text, deep", [
    ("[" * 33 + "]" * 33, True), ("[" * 32 + "]" * 32, False), ('{"a":' * 33 + "1" + "}" * 33, True),
    ('["' + "[" * 40 + '"]', False),          # brackets in a string do not nest
    ('["\\"' + "[" * 40 + '"]', False),       # nor after an escaped quote
    ('["\\\\"' + ",[" * 40, True),            # an escaped backslash ends the string
    ('"' + "[" * 40, False)])                 # an unterminated string runs to the end
def test_nesting_is_measured_without_parsing(text, deep):
    assert inputs.too_deep(text) is deep


@pytest.mark.parametrize("raw, code, param", [
    (DEEP, "nested_too_deeply", None), ("[" * 10000, "nested_too_deeply", None),
    ('{"a": ["ok", "\\udfff"]}', "invalid_text", "a[1]"), ('{"\\ud800": 1}', "invalid_text", None),
    (b'{"p": "\xed\xa0\x80"}', "invalid_text", "p"),     # a surrogate encoded as UTF-8 bytes
    (b'{"p": "\xff"}', "invalid_json", None), ("{", "invalid_json", None)])
def test_the_loader_refuses_with_a_code_and_the_field(raw, code, param):
    with pytest.raises(ApiError) as e:
        inputs.loads(raw)
    assert (e.value.status, e.value.code, e.value.param) == (400, code, param)


def test_the_loader_passes_real_text():
    assert inputs.loads('{"p": "caf\\u00e9 \\ud83d\\ude00 \\u0000"}') == {"p": "café 😀 \x00"}


def test_the_engine_refuses_text_its_tokenizer_cannot_take(live):
    for kw, field in ((dict(prompt="a" + SURROGATE), "prompt"), (dict(prompt="a\x00b"), "prompt"),
                      (dict(messages=[{"role": "user", "content": "x\x00"}]), "prompt"),
                      (dict(prompt="ok", stop=["\x00"]), "stop"), (dict(prompt="ok", label="n\ud800"), "label")):
        with pytest.raises(SettingError) as e:
            live.driver.submit(**kw)
        assert e.value.field == field


def api_bad_bodies(model):
    chat = {"model": model, "max_tokens": 3}
    return [
        ("/v1/completions", DEEP, None, "nested_too_deeply"),
        ("/v1/chat/completions", DEEP, None, "nested_too_deeply"),
        ("/v1/completions", json.dumps({**chat, "prompt": "hi" + SURROGATE}), "prompt", "invalid_text"),
        ("/v1/chat/completions", json.dumps({**chat, "messages": [{"role": "user", "content": SURROGATE}]}),
         "messages[0].content", "invalid_text"),
        ("/v1/chat/completions", json.dumps({**chat, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a" + SURROGATE}]}]}),
         "messages[0].content[0].text", "invalid_text"),
        ("/v1/completions", json.dumps({**chat, "prompt": "nul\x00here"}), "prompt", None),
        ("/v1/chat/completions", json.dumps({**chat, "messages": [{"role": "user", "content": "a\x00"}]}),
         "messages", None),
        ("/v1/completions", json.dumps({**chat, "prompt": "ok", "stop": ["\x00"]}), "stop", None),
    ]


def test_every_bad_api_body_is_a_400_then_the_client_is_served(live):
    client = live.app.test_client()
    model = live.driver.api_model
    for path, raw, param, code in api_bad_bodies(model):
        r = client.post(path, data=raw, content_type="application/json")
        assert r.status_code == 400, (path, raw[:60], r.status_code)
        err = r.get_json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
        assert (err["param"], err["code"]) == (param, code), (raw[:60], err)
        good = ({"model": model, "prompt": "We hold", "max_tokens": 3} if path == "/v1/completions"
                else {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        r = client.post(path, json=good)
        assert r.status_code == 200 and r.get_json()["choices"][0]["finish_reason"] in ("stop", "length")


WS_BAD = [
    ("[" * 10000, "message"),
    ('{"type": "submit", "prompt": "' + "\\ud800" + '"}', "prompt"),
    ('{"type": "submit", "prompt": "a\\u0000b"}', "prompt"),
    ('{"type": "set", "settings": {"\\udc00": 1}}', "settings"),
    ('{"type": "submit", "prompt": "x", "seed": [' + "[" * 40 + "]" * 40 + "]}", "message"),
]


def test_every_bad_websocket_message_gets_an_error_and_the_connection_serves_on(live):
    conn = Client.connect(live.ws_url)
    try:
        frames(conn, 10, until=lambda evs: any(e["type"] == "hello" for e in evs))
        for raw, field in WS_BAD:
            conn.send(raw)
            errors = [e for e in frames(conn, 10, until=lambda evs: any(e["type"] == "error" for e in evs))
                      if e["type"] == "error"]
            assert len(errors) == 1 and errors[0]["field"] == field and not errors[0]["fatal"], (raw[:40], errors)
        conn.send(json.dumps({"type": "submit", "prompt": "Liberty", "max_new_tokens": 3}))
        done = frames(conn, 20, until=lambda evs: any(e["type"] == "finished" and e["source"] == "page"
                                                       for e in evs))
        assert any(e["type"] == "finished" and e["reason"] in ("stop", "length") for e in done)
    finally:
        conn.close()
