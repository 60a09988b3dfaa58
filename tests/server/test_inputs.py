"""Input no entry point may fail on (server/inputs.py, issue 25): JSON nested past any sane
depth, lone surrogates (JSON's "\\ud800", which the tokenizer raises TypeError on) and NUL in
every text field. Through the app factory on the tiny random model, each is answered 4xx
naming the problem — the API in OpenAI's error shape, the websocket with an `error` event on
a connection that stays open — and the same client's next normal request succeeds."""
import json

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest
from simple_websocket import Client

from engine.core.request import GenerateRequest
from engine.settings import SettingError
from helpers import frames, wait_idle, wait_until
from server import inputs
from server.errors import ApiError

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
            live.driver.submit(GenerateRequest(**kw))
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


# ------------------------------------------------------------------ hypothesis, every entry point

# Text as hostile as JSON can carry: any text, or text around a lone surrogate or a NUL.
bad_char = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF)
hostile_text = st.text(max_size=10) | st.builds(lambda a, bad, b: a + bad + b, st.text(max_size=5), bad_char,
                                                st.text(max_size=5))
nested = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)   # as data it is a deep list
leaf = st.none() | st.booleans() | st.integers(-5, 5) | hostile_text
json_values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=6)


def encodings(obj):
    """Ways to put `obj` on the wire: escaped (\\ud800), raw UTF-8 with surrogates passed through."""
    return st.sampled_from([json.dumps(obj), json.dumps(obj, ensure_ascii=False)])


def api_case(model):
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                     "content": hostile_text | st.lists(st.fixed_dictionaries(
                                         {"type": st.just("text"), "text": hostile_text}), max_size=2)})
    completion = st.fixed_dictionaries({"model": st.just(model), "prompt": hostile_text, "max_tokens": st.just(2)},
                                       optional={"stop": st.lists(hostile_text, max_size=2), "extra": json_values})
    chat = st.fixed_dictionaries({"model": st.just(model), "messages": st.lists(message, min_size=1, max_size=2),
                                  "max_tokens": st.just(2)}, optional={"stream": st.booleans(), "user": json_values})
    bodies = st.one_of(completion.flatmap(encodings).map(lambda b: ("/v1/completions", b)),
                       chat.flatmap(encodings).map(lambda b: ("/v1/chat/completions", b)))
    raw_deep = st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), nested | json_values.map(json.dumps))
    return bodies | raw_deep


join_case = st.one_of(
    st.fixed_dictionaries({"prompt": hostile_text}).flatmap(encodings).map(lambda b: ("/join/ask", b)),
    st.fixed_dictionaries({"name": hostile_text}).flatmap(encodings).map(lambda b: ("/join/session", b)),
    st.tuples(st.sampled_from(["/join/ask", "/join/session"]), nested | json_values.map(json.dumps)))

ws_case = st.one_of(   # escaped: a text frame itself must be UTF-8
    st.fixed_dictionaries({"type": st.just("submit"), "prompt": hostile_text, "max_new_tokens": st.just(2)},
                          optional={"seed": json_values}).map(json.dumps),
    st.fixed_dictionaries({"type": st.sampled_from(["set", "preset", "sync"]), "settings": json_values,
                           "name": hostile_text}).map(json.dumps),
    nested, json_values.map(json.dumps))


@pytest.fixture(scope="module")
def classroom_app(tiny):
    """Classroom mode (every entry point open: the API with the presenter key, /join for one
    phone, the websocket as the presenter), a rate limit the examples never reach."""
    from helpers import open_classroom
    app = open_classroom(tiny)
    yield app
    app.stop()


def idle(driver, room, timeout=30):
    """No leaked request, slot or KV block, and no student left holding a claim."""
    wait_idle(driver, timeout)
    wait_until(lambda: all(s.request is None for s in room.students.values()), timeout,
               lambda: f"no claims; held by {[s.name for s in room.students.values() if s.request is not None]}")


HYPO = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def test_hostile_text_and_nesting_on_every_http_entry_point_never_a_5xx(classroom_app):
    app, room = classroom_app, classroom_app.room
    client = app.app.test_client()
    auth = {"Authorization": f"Bearer {room.key}"}
    assert client.post("/join/session", json={"name": "Fuzz"}).status_code == 200

    @HYPO
    @given(api_case(app.driver.api_model) | join_case)
    def run(case):
        path, raw = case
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        r = client.post(path, data=data, content_type="application/json", headers=auth)
        assert r.status_code < 500, (path, raw[:80], r.status_code, r.get_data(as_text=True)[:200])
        if r.status_code >= 400:
            err = r.get_json()["error"]
            assert err["message"] and err["type"] == "invalid_request_error"
        else:
            r.get_data()      # the whole answer (a stream runs to its end)
        idle(app.driver, room)

    run()
    r = client.post("/join/ask", json={"prompt": "still here?"})
    assert r.status_code == 200 and '"type":"finished"' in r.get_data(as_text=True)
    idle(app.driver, room)


def test_hostile_text_and_nesting_over_the_websocket_never_drop_it(classroom_app):
    app, room = classroom_app, classroom_app.room
    conn = Client.connect(app.ws_url, headers={"Cookie": f"ft_presenter={room.key}"})
    marker = iter(range(10**9, 2 * 10**9))
    try:
        frames(conn, 10, until=lambda evs: any(e["type"] == "hello" for e in evs))

        @settings(HYPO, max_examples=40)
        @given(ws_case)
        def run(raw):
            conn.send(raw)
            mark = next(marker)   # once the sync after it is answered, the frame was handled
            conn.send(json.dumps({"type": "sync", "client_t": mark}))
            got = frames(conn, 10, until=lambda evs: any(e["type"] == "sync" and e["client_t"] == mark
                                                          for e in evs))
            assert any(e["type"] == "sync" and e["client_t"] == mark for e in got), raw[:80]
            assert not any(e["type"] == "error" and (e["fatal"] or "failed on this message" in e["message"])
                           for e in got), raw[:80]
            app.driver.reset()
            idle(app.driver, room)

        run()
        conn.send(json.dumps({"type": "submit", "prompt": "Liberty", "max_new_tokens": 2}))
        done = frames(conn, 20, until=lambda evs: any(e["type"] == "finished" and e["source"] == "page"
                                                       for e in evs))
        assert any(e["type"] == "finished" and e["source"] == "page" for e in done)
    finally:
        conn.close()
    idle(app.driver, room)


# ------------------------------------------------------------------ absurd declared frame sizes

def ws_connect_raw(url):
    """A websocket opened on a bare socket (handshake read), so a test can send any bytes."""
    import socket
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)   # liveness: a server that waits fails here
    sock.sendall(f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 101"), reply[:80]
    return sock, reply.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("declared", [2**62, 4 * 1024 * 1024])
def test_a_frame_declaring_an_absurd_size_is_closed_at_once_with_1009(live, declared):
    """A text frame's header claims `declared` bytes (over the 1 MiB bound) and nothing follows:
    the server answers a close frame with 1009 at once and closes; other pages are served."""
    import struct
    sock, early = ws_connect_raw(live.url)
    try:
        sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", declared) + b"\x00\x00\x00\x00" + b"{")
        got = early
        while True:   # closed without waiting for the declared bytes, which never come
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    finally:
        sock.close()
    close = got.index(b"\x88")     # the close frame, after whatever hello/replay frames came first
    assert struct.unpack("!H", got[close + 2:close + 4])[0] == 1009, got[close:close + 8]
    other = Client.connect(live.ws_url)
    try:
        other.send(json.dumps({"type": "sync", "client_t": 7}))
        assert any(e["type"] == "sync" for e in frames(other, 10, until=lambda evs: any(
            e["type"] == "sync" for e in evs)))
    finally:
        other.close()
