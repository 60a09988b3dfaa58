"""The request registry (engine/core/fields.py): each field declared once reaches every reader,
the API under its body's name, the websocket's `submit` and observe mode under the engine's, and
the typed SamplingParams the sampler and scheduler read."""
from dataclasses import fields
import json

import pytest

from engine import GenerateRequest, SettingError
from engine.core.fields import BY_NAME, FIELDS, SETTING_FIELDS
from engine.core.sequence import SamplingParams
from engine.settings import SamplingSettings
from server import control
from server.errors import ApiError
from server.openai_api import parse_request


def asked(f):
    """A value of field `f` other than its default and within its bounds."""
    if f.kind == "bool":
        return not f.default
    if f.kind == "token_ids":
        return (3, 5)
    if f.kind == "token_bias":
        return {3: 1.5}
    if f.kind == "structured":
        return {"regex": "[ab]+"}
    if f.kind == "int":
        return 7 if f.default != 7 else 8
    return f.hi if f.hi is not None and f.hi != f.default else f.lo + 0.5


def test_the_setting_fields_are_the_sampling_settings():
    """A field left out to the engine's live setting has that setting (engine/settings.py)."""
    assert set(SETTING_FIELDS) == {f.name for f in fields(SamplingSettings)}


@pytest.mark.parametrize("f", [f for f in FIELDS if f.role != "fanout"], ids=lambda f: f.name)
def test_each_field_reaches_the_request_and_the_engines_parameters(f):
    value = asked(f)
    for kind, shape in (("chat", {"messages": [{"role": "user", "content": "hi"}]}), ("completion", {"prompt": "hi"})):
        req = parse_request(kind, {"model": "m", **shape, f.body_name: value}, "m").requests[0]
        assert getattr(req, f.name) == value
    settings = SamplingSettings(max_new_tokens=9, temperature=0.5, top_p=0.5)
    params = GenerateRequest(prompt="hi", **{f.name: value}).sampling(settings, 4096, 400)
    assert isinstance(params, SamplingParams) and getattr(params, f.name) == value
    # left out: its default, or the live setting's value
    left = GenerateRequest(prompt="hi").sampling(settings, 4096, 400)
    assert getattr(left, f.name) == (getattr(settings, f.name) if f.setting else f.default)


def test_n_makes_as_many_requests_of_one_sample_each():
    """`n` (the one "fanout" field) is read by no sampler: the API and the websocket queue its
    samples (GenerateRequest.samples), and a request of several is refused by the engine."""
    assert [f.name for f in FIELDS if f.role == "fanout"] == ["n"]
    reqs = parse_request("completion", {"model": "m", "prompt": "hi", "n": 7, "seed": 5}, "m").requests
    assert [(r.n, r.seed) for r in reqs] == [(1, 5 + i) for i in range(7)]
    backend = Capture()
    control.handle(backend, json.dumps({"type": "submit", "prompt": "hi", "n": 3}))
    assert [r.n for r in backend.got] == [1, 1, 1]
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", n=3).sampling(SamplingSettings(max_new_tokens=9, temperature=0.5, top_p=0.5),
                                                   4096, 400)
    assert e.value.field == "n"


class Capture:
    """A backend that keeps what `submit` was given."""

    def __init__(self):
        self.got = []

    def submit(self, request):
        self.got.append(request)


@pytest.mark.parametrize("f", [f for f in FIELDS if f.role != "fanout"], ids=lambda f: f.name)
def test_the_websockets_submit_takes_each_field_by_its_name(f):
    backend = Capture()
    assert control.handle(backend, json.dumps({"type": "submit", "prompt": "hi", f.name: asked(f)})) == []
    assert getattr(backend.got[0], f.name) == asked(f) and backend.got[0].source == "page"


@pytest.mark.parametrize("f", [f for f in FIELDS if f.hi is not None or f.kind == "bool"], ids=lambda f: f.name)
def test_a_bad_value_is_refused_under_the_name_its_client_used(f):
    bad = "yes" if f.kind == "bool" else f.hi + 1
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", **{f.name: bad})
    assert e.value.field == f.name
    with pytest.raises(ApiError) as e:
        parse_request("completion", {"model": "m", "prompt": "hi", f.body_name: bad}, "m")
    assert e.value.status == 400 and e.value.param == f.body_name and f.body_name in e.value.message


@pytest.mark.parametrize("bias", [10**400, float("nan"), True, "5"])
def test_a_logit_bias_that_is_no_finite_number_is_a_400(bias):
    with pytest.raises(ApiError) as e:    # 10**400: float() of it raised OverflowError, a 500
        parse_request("completion", {"model": "m", "prompt": "hi", "logit_bias": {"1": bias}}, "m")
    assert e.value.status == 400 and e.value.param == "logit_bias"


def test_a_token_id_of_thousands_of_digits_is_a_400():
    with pytest.raises(SettingError) as e:    # str() of it raised ValueError (over 4,300 digits), a 500
        BY_NAME["stop_token_ids"].check_ids(BY_NAME["stop_token_ids"].check([10**5000]), 100)
    assert e.value.field == "stop_token_ids" and "5001 digits" in str(e.value)


def test_observe_mode_sends_each_field_under_the_apis_name(monkeypatch):
    from observe import Observer
    obs = Observer("http://127.0.0.1:9/v1")   # never started: `_launch` is where it would send
    sent = []
    monkeypatch.setattr(obs, "_launch", lambda source, path, body, prompt, **kw: sent.append(body))
    given = {f.name: asked(f) for f in FIELDS if not f.setting}
    obs.submit(GenerateRequest(prompt="hi", temperature=0.5, **given))
    body = sent[0]
    assert body["temperature"] == 0.5 and body["max_tokens"] == 64   # the setting's
    assert all(body[f.body_name] == given[f.name] for f in FIELDS if not f.setting)
