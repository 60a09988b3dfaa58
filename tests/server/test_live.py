"""The websocket control protocol (/ws): the page's control messages, checked transport-free
with `server.control.handle` on an engine driver (tiny random model), then end to end through a
real websocket on the app from `create_app`; and every event a page receives follows the schema."""
import json
import time

import pytest
from simple_websocket import Client, ConnectionClosed

from engine.events import Error, Sync
from engine.core.request import GenerateRequest
from helpers import collect, engine_driver, frames, schema_validator, wait_until
from server import control

BAD = [
    ("not json", "message"), ("[1,2]", "message"), (b"\x00", "message"), ('{"type":"fly"}', "type"),
    ('{"type":"submit"}', "prompt"), ('{"type":"submit","prompt":""}', "prompt"),
    ('{"type":"submit","prompt":"hi","max_new_tokens":-1}', "max_new_tokens"),
    ('{"type":"submit","prompt":"hi","temperature":"hot"}', "temperature"),
    ('{"type":"submit","prompt":"hi","chat":"yes"}', "chat"),
    ('{"type":"burst","n":1000}', "n"), ('{"type":"load","on":"yes"}', "load"),
    ('{"type":"sync","client_t":"x"}', "client_t"), ('{"type":"sync","client_t":Infinity}', "client_t"),
    ('{"type":"sync","client_t":true}', "client_t"), ("x" * 300_000, "message"),
    ('{"type":"preset","name":"fast"}', "name"), ('{"type":"preset"}', "name"),
    ('{"type":"preset","name":"idle","settings":{"slots":0}}', "slots"),
    ('{"type":"burst","n":2,"seed":-1}', "seed"), ('{"type":"burst","n":2,"seed":"x"}', "seed")]


@pytest.fixture(scope="module")
def idle_driver(tiny):
    """A driver that was never started: whatever a message queues stays in its inbox."""
    return engine_driver(tiny, slots=2, kv_tokens=1024, max_context=256, start=False)


@pytest.mark.parametrize("raw,field", BAD)
def test_bad_control_messages_get_named_errors(idle_driver, raw, field):
    before = idle_driver.settings.now
    replies = control.handle(idle_driver, raw)
    assert [type(r) for r in replies] == [Error] and replies[0].field == field and replies[0].message
    assert not replies[0].fatal
    assert idle_driver._inbox.empty() and idle_driver.settings.now == before


def test_control_submit_and_sync(live):
    sub = live.driver.events.subscribe(replay=False)
    assert control.handle(live.driver, '{"type":"submit","prompt":"<script>x</script>","max_new_tokens":2}') == []
    asked = time.time()
    (reply,) = control.handle(live.driver, '{"type":"sync","client_t":12.5}')
    answered = time.time()
    assert isinstance(reply, Sync) and reply.client_t == 12.5
    assert reply.server_time == pytest.approx(live.driver.clock.wall0 + reply.t)
    # the wall clock's seconds, told between asking and the answer (a second's slack: the engine's
    # monotonic clock and the wall clock may drift apart that much over a long test run)
    assert asked - 1 <= reply.server_time <= answered + 1
    evs = collect(sub, lambda evs: any(e["type"] == "finished" for e in evs), timeout=30)
    (req,) = [e for e in evs if e["type"] == "request"]
    assert req["source"] == "page" and req["preview"] == "<script>x</script>"   # what was asked, not the template
    (fin,) = [e for e in evs if e["type"] == "finished"]
    assert fin["id"] == req["id"] and fin["source"] == "page" and 1 <= fin["output_tokens"] <= 2


def test_bad_messages_over_the_websocket_are_named_and_the_connection_keeps_working(live):
    bad = [BAD[0], BAD[2], BAD[3], BAD[6], BAD[10], BAD[12]]
    conn = Client.connect(live.ws_url)
    try:
        assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
        for raw, _ in bad:
            conn.send(raw)
        errors = [e for e in frames(conn, 10, until=lambda ev: sum(e["type"] == "error" for e in ev) == len(bad))
                  if e["type"] == "error"]
        assert [e["field"] for e in errors] == [field for _, field in bad]
        assert live.driver.settings.now.load.load is False   # the bad `load` changed nothing
        conn.send(json.dumps({"type": "submit", "prompt": "Still there?", "max_new_tokens": 3}))
        evs = frames(conn, 30, until=lambda ev: any(e["type"] == "finished" for e in ev))
    finally:
        conn.close()
    (fin,) = [e for e in evs if e["type"] == "finished"]
    assert fin["source"] == "page" and fin["reason"] in ("length", "stop") and 1 <= fin["output_tokens"] <= 3
    assert not any(e["type"] == "error" for e in evs)


def test_after_leave_the_server_sends_nothing_more(live):
    listening = live.driver.events.subscribers
    conn = Client.connect(live.ws_url)
    try:
        assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
        assert live.driver.events.subscribers == listening + 1
        live.driver.update_settings({"load": True, "rate": 16.0})   # events are flowing when the page leaves
        conn.send(json.dumps({"type": "leave"}))
        wait_until(lambda: live.driver.events.subscribers == listening, 30, "the page unsubscribed")
        while conn.receive(timeout=0.3) is not None:   # what was already on the wire
            pass
        assert conn.receive(timeout=1.5) is None and conn.connected   # silent, and still open
    finally:
        live.driver.update_settings({"load": False})
        conn.close()


def test_every_event_a_page_receives_under_load_follows_the_schema(live):
    """Load generator on, a burst, a page prompt, one too long, a bad message, a sync, settings
    changes and a reset: every event that reaches the page validates against the schema."""
    check = schema_validator()
    conn = Client.connect(live.ws_url)
    try:
        received = json.loads(conn.receive(timeout=10))
        assert received[0]["type"] == "hello"
        for msg in ({"type": "set", "settings": {"prompt_tokens": 32, "max_new_tokens": 4, "rate": 16.0}},
                    {"type": "load", "on": True}, {"type": "burst", "n": 3},
                    {"type": "submit", "prompt": "We hold these truths", "max_new_tokens": 3},
                    {"type": "submit", "prompt": "truths " * 400, "max_new_tokens": 3, "chat": False},
                    {"type": "set", "settings": {"slots": 0}}, {"type": "sync", "client_t": 1.5}):
            conn.send(json.dumps(msg))
        received += frames(conn, 30, until=lambda ev: sum(e["type"] == "finished" for e in ev) >= 8
                           and any(e["type"] == "stats" for e in ev))
        conn.send(json.dumps({"type": "set", "settings": {"load": False, "prefill_chunk": 16}}))
        conn.send(json.dumps({"type": "reset"}))
        received += frames(conn, 10, until=lambda ev: any(e["type"] == "reset" for e in ev))
    finally:
        conn.close()
    kinds = {e["type"] for e in received}
    assert {"hello", "settings", "request", "tokenized", "admitted", "prefill", "step", "token", "finished",
            "rejected", "stats", "error", "sync", "reset"} <= kinds, kinds
    assert any(e["type"] == "request" and e["source"] == "load" for e in received)
    for e in received:
        check.validate(e)


def test_only_a_page_that_asked_gets_the_candidates(live):
    """The `view` message: a page that sent `candidates: true` gets each token's `top`, every other
    page `null` (both get the chosen token's `p` and `p_raw`, and the same events otherwise); a
    bad value is an error naming `candidates`, the stream unchanged."""
    shows, plain = Client.connect(live.ws_url), Client.connect(live.ws_url)
    try:
        shows.send(json.dumps({"type": "view", "candidates": "yes"}))
        shows.send(json.dumps({"type": "view", "candidates": True}))
        wait_until(lambda: live.driver.events.candidates_shown(), 10, "the page's view to be set")
        rid = live.driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=5, source="page")).id
        done = lambda evs: any(e["type"] == "finished" and e.get("id") == rid for e in evs)   # noqa: E731
        got_shows, got_plain = frames(shows, 30, until=done), frames(plain, 30, until=done)
    finally:
        shows.close()
        plain.close()
    (err,) = [e for e in got_shows if e["type"] == "error"]
    assert err["field"] == "candidates"
    mine = [e for e in got_shows if e["type"] == "token" and e["id"] == rid]
    theirs = [e for e in got_plain if e["type"] == "token" and e["id"] == rid]
    assert len(mine) == len(theirs) == 5
    assert all(len(e["top"]) == 5 and e["top"][0][0] == e["token_id"] for e in mine)   # greedy: its own first
    assert all(e["top"] is None for e in theirs)
    assert [{**e, "top": None} for e in mine] == theirs
    check = schema_validator()
    for e in mine + theirs:
        check.validate(e)
    wait_until(lambda: not live.driver.events.candidates_shown(), 10, "the page's subscription to end")


def test_a_page_that_leaves_mid_send_is_no_server_error(live, monkeypatch, caplog):
    """The kernel answers a send to a page that has gone with BrokenPipeError or
    ConnectionResetError (which of them, and when, depends on how the peer left): a departure,
    not a 500 with a traceback in the log. The send fails as the kernel fails it (the race of a
    real peer leaving mid-frame is not reproducible), and the page's place is given back."""
    import logging
    from server import live as live_ws
    caplog.set_level(logging.ERROR)
    opened = live.driver.events.subscribers
    for gone in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "Connection reset by peer")):
        def send(self, data, gone=gone):
            raise gone
        monkeypatch.setattr(live_ws.BoundedServer, "send", send)
        try:   # the server closes as soon as its first send fails: maybe before the handshake is read
            conn = Client.connect(live.ws_url)
            wait_until(lambda: not conn.connected, 30, "the server to drop the page")
            conn.close()
        except ConnectionClosed:
            pass
        wait_until(lambda: live.driver.events.subscribers == opened
                   and live.app.extensions["first_token"].viewers.open == 0, 30,
                   "the page's subscription and place given back")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]

