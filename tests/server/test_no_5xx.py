"""No value is a 5xx: every number a client can send, on every entry point (the OpenAI API bodies,
the websocket's messages of every type, the classroom's join forms, URL query strings, trace
files), is answered with a 4xx or an `error` event naming its field, never a 500, an exception or a
logged traceback. JSON has integers of any length: `float()` of a 400-digit one raises
OverflowError, which once reached the client as a 500 (engine/settings.py `finite_number`).
Hypothesis draws the numbers (huge integers, infinities, NaN, floats of every size) and the field;
the examples are few and in process, so the module runs in seconds."""
import json
import logging

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from engine.settings import SettingError, coerce, finite_number
from server import control, export
from server.classroom import Role
from helpers import open_classroom, wait_idle

HUGE = 10**400   # JSON allows it; float(HUGE) raises OverflowError
FEW = settings(max_examples=60, deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Any number JSON can carry (Python's json reads NaN and the infinities too), the far ends weighted in.
numbers = (st.integers() | st.integers(-10**450, 10**450) | st.sampled_from([HUGE, -HUGE, 2**1024, 2**1024 - 1])
           | st.floats() | st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e308, -0.0]))

# The API's numeric parameters, where each goes in a body (a path of keys).
API_NUMBERS = {"chat": [("max_tokens",), ("max_completion_tokens",), ("temperature",), ("top_p",), ("seed",),
                        ("min_tokens",), ("priority",), ("top_logprobs",), ("n",),
                        ("speculative_config", "num_speculative_tokens")],
               "completion": [("max_tokens",), ("temperature",), ("top_p",), ("seed",), ("min_tokens",),
                              ("priority",), ("logprobs",), ("n",), ("speculative_config", "num_speculative_tokens")]}
PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@pytest.fixture(scope="module")
def app(tiny):
    """The app on the tiny model in classroom mode (every entry point open: the API with the
    presenter's key, /join for a phone), a rate limit the examples never reach."""
    served = open_classroom(tiny)
    yield served
    served.stop()


@pytest.fixture
def no_traceback(caplog):
    """Fails the test if anything logged an error (a traceback in the server's log)."""
    caplog.set_level(logging.ERROR)
    yield
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[:2000]


def body(kind, model, path, value):
    b = {"model": model, "max_tokens": 2}
    b.update({"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {"prompt": "hi"})
    if path == ("top_logprobs",):
        b["logprobs"] = True
    target = b
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return b


def api_answer(client, key, kind, raw):
    """POST `raw`; the status, after checking a 4xx is OpenAI's error shape and a 200 ran to its end."""
    r = client.post(PATHS[kind], data=raw, content_type="application/json",
                    headers={"Authorization": f"Bearer {key}"})
    assert r.status_code < 500, (raw[:120], r.status_code, r.get_data(as_text=True)[:300])
    if r.status_code >= 400:
        err = r.get_json()["error"]
        assert err["message"] and err["type"] == "invalid_request_error" and len(err["message"]) < 300, err
    else:
        r.get_data()
    return r


def test_finite_number_never_converts_first():
    assert finite_number(1) and finite_number(-2.5) and finite_number(10**300)
    assert not any(finite_number(v) for v in (HUGE, -HUGE, 2**1024, float("inf"), float("nan"), True, "1", None))
    for kind in ("int", "float"):
        with pytest.raises(SettingError) as e:
            coerce("temperature", kind, HUGE, 0, 2)
        assert e.value.field == "temperature" and "401 digits" in e.value.message   # not the digits themselves


@pytest.mark.parametrize("kind,path", [(k, p) for k, paths in API_NUMBERS.items() for p in paths])
def test_a_400_digit_integer_in_any_api_number_is_a_400_naming_it(app, no_traceback, kind, path):
    client = app.app.test_client()
    r = api_answer(client, app.room.key, kind, json.dumps(body(kind, app.driver.api_model, path, HUGE)))
    assert r.status_code == 400
    assert r.get_json()["error"]["param"] in (path[-1], path[0]), r.get_json()
    wait_idle(app.driver)


# Every websocket message type a page (or the presenter) sends with a number in it, and the field.
WS_NUMBERS = [({"type": "set", "settings": {"rate": None}}, "rate", ("settings", "rate")),
              ({"type": "set", "settings": {"temperature": None}}, "temperature", ("settings", "temperature")),
              ({"type": "set", "settings": {"slots": None}}, "slots", ("settings", "slots")),
              ({"type": "preset", "name": "idle", "settings": {"top_p": None}}, "top_p", ("settings", "top_p")),
              ({"type": "submit", "prompt": "hi"}, "temperature", ("temperature",)),
              ({"type": "submit", "prompt": "hi"}, "top_p", ("top_p",)),
              ({"type": "submit", "prompt": "hi"}, "max_new_tokens", ("max_new_tokens",)),
              ({"type": "submit", "prompt": "hi"}, "seed", ("seed",)),
              ({"type": "submit", "prompt": "hi"}, "priority", ("priority",)),
              ({"type": "sync"}, "client_t", ("client_t",)),
              ({"type": "burst"}, "n", ("n",)),
              ({"type": "burst", "n": 1}, "seed", ("seed",)),
              ({"type": "load"}, "load", ("on",)),
              ({"type": "view"}, "candidates", ("candidates",))]


def message(template, path, value):
    msg = json.loads(json.dumps(template))
    target = msg
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(msg)


class Stream:
    candidates = False


@pytest.mark.parametrize("template,field,path", WS_NUMBERS, ids=[f"{t['type']}-{f}" for t, f, _ in WS_NUMBERS])
def test_a_400_digit_integer_in_any_websocket_message_is_an_error_naming_it(app, no_traceback, template, field, path):
    replies = [e.to_dict() for e in control.handle(app.driver, message(template, path, HUGE), Role.PRESENTER,
                                                   app.room, Stream())]
    assert [(e["type"], e["field"]) for e in replies] == [("error", field)], replies
    assert "digits" in replies[0]["message"] and len(replies[0]["message"]) < 300
    app.driver.reset()
    wait_idle(app.driver)


def test_a_400_digit_time_in_a_trace_file_says_it_is_not_a_trace(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"type": "hello", "t": 0}, {"type": "token", "t": HUGE}]))
    with pytest.raises(export.TraceError, match="event 1 has no type and time"):
        export.check(export.read_trace(path))


# ------------------------------------------------------------------ hypothesis, every entry point

def test_any_number_in_any_api_field_is_never_a_5xx(app, no_traceback):
    client = app.app.test_client()
    cases = st.sampled_from([(k, p) for k, paths in API_NUMBERS.items() for p in paths])

    @FEW
    @given(cases, numbers)
    def run(case, value):
        kind, path = case
        api_answer(client, app.room.key, kind, json.dumps(body(kind, app.driver.api_model, path, value)))
        wait_idle(app.driver)

    run()


def test_any_number_in_any_websocket_message_is_answered_not_raised(app, no_traceback):
    @FEW
    @given(st.sampled_from(WS_NUMBERS), numbers)
    def run(case, value):
        template, field, path = case
        replies = [e.to_dict() for e in control.handle(app.driver, message(template, path, value), Role.PRESENTER,
                                                       app.room, Stream())]
        assert len(replies) <= 1, replies
        for r in replies:
            json.dumps(r, allow_nan=False)   # strict JSON back, whatever came in
            assert r["type"] == "sync" or (r["type"] == "error" and r["field"] == field), r
        app.driver.update_settings({name: spec.default for name, spec in app.driver.specs.items()})
        app.driver.update_settings({"max_new_tokens": 2})
        app.driver.reset()
        wait_idle(app.driver)

    run()


def test_any_value_in_the_join_forms_is_never_a_5xx(app, no_traceback):
    client = app.app.test_client()
    assert client.post("/join/session", json={"name": "Numbers"}).status_code == 200
    anything = numbers | st.none() | st.booleans() | st.text(max_size=8) | st.lists(numbers, max_size=2)

    @FEW
    @given(st.sampled_from([("/join/session", "name"), ("/join/session", "code"), ("/join/ask", "prompt")]), anything)
    def run(case, value):
        url, field = case
        r = client.post(url, data=json.dumps({field: value}), content_type="application/json")
        assert r.status_code < 500, (url, field, value, r.status_code)
        r.get_data()
        wait_idle(app.driver)

    run()


def test_any_query_string_is_never_a_5xx(app, no_traceback):
    client = app.app.test_client()
    keys = st.sampled_from(["panels", "theme", "compact", "live", "trace", "preset", "key", "view", "x"])
    value = st.text(max_size=12) | numbers.map(str)

    @FEW
    @given(st.sampled_from(["/", "/embed", "/join", "/healthz", "/examples/none.json", "/v1/models"]),
           st.dictionaries(keys, value, max_size=3))
    def run(url, params):
        r = client.get(url, query_string=params)
        assert r.status_code < 500, (url, params, r.status_code)

    run()


def test_any_number_as_a_trace_events_time_is_a_trace_error_or_a_trace():
    @FEW
    @given(numbers | st.none() | st.booleans() | st.text(max_size=4), numbers)
    def run(t, t0):
        trace = [{"type": "hello", "t": t0}, {"type": "token", "t": t}]
        try:
            assert export.check(trace) is trace
        except export.TraceError as e:
            assert "has no type and time" in str(e)

    run()
