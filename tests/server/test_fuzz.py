"""Property-based tests (hypothesis): random and hostile websocket control messages and API
bodies thrown at the app on the tiny random model. Whatever arrives, the app answers with an
error naming the problem (or does what was asked), keeps serving, and once idle its cache
accounting is back to zero. Examples are bounded so the module runs in well under a minute."""
import itertools
import json

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest
from simple_websocket import Client, ConnectionClosed

from engine import EngineConfig
from engine.events import Finished
from engine.core.request import GenerateRequest
from server import create_app, control
from helpers import LiveApp, wait_idle

FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Any JSON a client could send, hostile corners included: NaN and infinities (Python's json
# reads them), integers far beyond 64 bits and beyond a float's range (float() of 10**400 raises
# OverflowError), deep nesting, odd text.
scalars = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.sampled_from([10**400, -10**400])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
small_ints = st.integers(min_value=-3, max_value=40)


@pytest.fixture(scope="module")
def app(tiny):
    served = LiveApp(tiny, EngineConfig(slots=4, kv_tokens=2048, max_context=512))
    yield served
    served.stop()


def setting_values(driver):
    names = st.sampled_from(sorted(driver.specs) + ["bogus", ""])
    return st.dictionaries(names, values | small_ints | st.sampled_from(["mixed", "static"]), max_size=4)


def control_messages(driver):
    submit = st.fixed_dictionaries({"type": st.just("submit")}, optional={
        "prompt": st.text(max_size=40) | values, "max_new_tokens": small_ints | values,
        "temperature": st.floats(-1, 3) | values, "top_p": st.floats(-1, 2) | values,
        "seed": small_ints | values, "chat": st.booleans() | values, "extra": values})
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("set"), "settings": setting_values(driver) | values}),
        submit,
        st.fixed_dictionaries({"type": st.just("load"), "on": st.booleans() | values}),
        st.fixed_dictionaries({"type": st.just("burst"), "n": st.integers(-2, 70) | values}),
        st.just({"type": "reset"}),
        st.fixed_dictionaries({"type": st.just("sync"), "client_t": st.floats() | values}),
        st.dictionaries(st.text(max_size=8), values, max_size=4),      # unknown types and fields
        values)                                                        # not even an object


def raw_frames(driver):
    """Raw websocket frames: JSON of any message, text that is not JSON, bytes, oversized."""
    return st.one_of(control_messages(driver).map(json.dumps), st.text(max_size=60), st.binary(max_size=40),
                     st.just(" " * (control.MAX_MESSAGE_BYTES + 1)))


def settle(driver):
    """Back to defaults, everything cancelled; then idle, with every block back."""
    driver.update_settings({name: spec.default for name, spec in driver.specs.items()})
    driver.reset()
    wait_idle(driver)


def assert_serves(driver):
    """A normal request still completes."""
    handle = driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=3, stream=True))
    last = list(handle.events(timeout=30))[-1]
    assert isinstance(last, Finished) and last.reason in ("stop", "length")


def check_reply(raw, replies):
    """What `control.handle` answers: nothing, a `sync`, or one `error` that names a field."""
    assert len(replies) <= 1
    for r in replies:
        d = r.to_dict()
        json.dumps(d, allow_nan=False)   # replies are strict JSON, whatever came in
        if d["type"] == "error":
            assert d["message"] and d["field"] is not None and not d["fatal"]
        else:
            assert d["type"] == "sync"


def test_hostile_control_messages(app):
    driver = app.driver

    @FUZZ
    @given(st.lists(raw_frames(driver), min_size=1, max_size=5))
    def run(batch):
        for raw in batch:
            check_reply(raw, control.handle(driver, raw))
        assert driver.failure is None
        settle(driver)

    run()
    assert_serves(driver)
    wait_idle(driver)


def api_bodies(model):
    message = st.fixed_dictionaries({}, optional={
        "role": st.sampled_from(["user", "system", "developer", "assistant", "tool", ""]) | values,
        "content": st.text(max_size=30) | values})
    body = st.fixed_dictionaries({}, optional={
        "model": st.just(model) | values, "messages": st.lists(message, max_size=3) | values,
        "prompt": st.text(max_size=30) | values, "max_tokens": small_ints | values,
        "max_completion_tokens": small_ints | values, "temperature": st.floats(-1, 3) | values,
        "top_p": st.floats(-1, 2) | values, "seed": small_ints | values,
        "stop": st.lists(st.text(max_size=4), max_size=5) | values, "stream": st.booleans() | values,
        "stream_options": st.just({"include_usage": True}) | values, "n": st.just(1) | values,
        "logprobs": values, "ignore_eos": st.booleans() | values, "min_tokens": small_ints | values,
        "unknown": values})
    return st.one_of(body.map(lambda b: json.dumps(b).encode()), values.map(lambda v: json.dumps(v).encode()),
                     st.binary(max_size=60))


def test_hostile_api_bodies(app):
    driver = app.driver
    client = create_app({"TESTING": True}, backend=driver).test_client()

    @FUZZ
    @given(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), api_bodies(driver.api_model))
    def run(path, raw):
        r = client.post(path, data=raw, content_type="application/json")
        assert r.status_code in (200, 400, 404), r.status_code
        text = r.get_data(as_text=True)
        if r.status_code != 200:
            err = r.get_json()["error"]
            assert err["message"] and err["type"] == "invalid_request_error"
        elif r.mimetype == "text/event-stream":
            chunks = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            assert chunks[-1] == "[DONE]" and not any("error" in json.loads(c) for c in chunks[:-1])
        else:
            assert r.get_json()["choices"][0]["finish_reason"] in ("stop", "length")
        wait_idle(driver)

    run()
    assert_serves(driver)


def test_hostile_frames_over_a_real_websocket(app):
    """The same frames through the websocket: each gets at most an `error` reply, the connection
    stays open, and a normal submit on it still streams to the end."""
    driver = app.driver
    conn = Client.connect(app.ws_url)
    json.loads(conn.receive(timeout=10))   # hello and the replay

    marker = itertools.count(10**9)

    @settings(max_examples=15, deadline=None, database=None)
    @given(raw_frames(driver))
    def run(raw):
        conn.send(raw)
        mark = next(marker)   # a sync after it: once its reply is back, the frame was answered
        conn.send(json.dumps({"type": "sync", "client_t": mark}))
        replies = []
        while not any(e["type"] == "sync" and e["client_t"] == mark for e in replies):
            replies += [e for e in json.loads(conn.receive(timeout=10)) if e["type"] in ("error", "sync")]
        assert len(replies) <= 2 and all(e["field"] is not None for e in replies if e["type"] == "error")
        settle(driver)

    try:
        run()
        conn.send(json.dumps({"type": "submit", "prompt": "Liberty", "max_new_tokens": 3}))
        seen = []
        while not any(e["type"] == "finished" and e["source"] == "page" for e in seen):
            seen += json.loads(conn.receive(timeout=10))
    finally:
        conn.close()
    wait_idle(driver)


def test_a_frame_too_large_to_buffer_closes_only_that_connection(app):
    big = Client.connect(app.ws_url)
    other = Client.connect(app.ws_url)
    try:
        big.receive(timeout=10)
        other.receive(timeout=10)
        big.send("x" * (4 * control.MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(50):
                big.receive(timeout=0.2)
        assert closed.value.reason == 1009   # "message too big"
        other.send(json.dumps({"type": "sync", "client_t": 5}))
        got = []
        while not any(e["type"] == "sync" for e in got):
            got += json.loads(other.receive(timeout=10))
    finally:
        other.close()
    assert_serves(app.driver)
