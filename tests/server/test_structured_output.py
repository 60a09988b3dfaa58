"""Structured output through the OpenAI API (the official `openai` client on the in-process app,
tiny random model): response_format json_schema / json_object, vLLM's structured_outputs and its
older guided_* fields; what cannot compile is a 400 naming the field it came in, nothing queued."""
import json
import re

import jsonschema

from helpers import idle
from test_openai_api import client, model  # noqa: F401  (fixtures: the openai client on the in-process app, its model)

SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer",
                                                                                                  "maximum": 99}},
          "required": ["colour", "count"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "Pick a colour and a count."}]


def test_a_json_schema_response_parses_and_validates(live, client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=80, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "pick", "schema": SCHEMA}})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"
    # the same on /v1/completions, streamed, with vLLM's own field, two samples
    stream = client.completions.create(model=model, prompt="Colour:", max_tokens=80, temperature=1.0, seed=3, n=2,
                                       stream=True, extra_body={"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}})
    texts = ["", ""]
    for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    r = client.completions.create(model=model, prompt="Data:", max_tokens=60, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})   # vLLM's, on completions
    text = r.choices[0].text
    assert text.startswith("{") and (r.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))
    assert idle(live.driver)


def test_regex_and_choice_constrain_the_text(live, client, model):
    r = client.completions.create(model=model, prompt="Code:", max_tokens=30, temperature=1.0, seed=5,
                                  extra_body={"guided_regex": "[A-Z]{2}-[0-9]{2,4}"})
    assert re.fullmatch("[A-Z]{2}-[0-9]{2,4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10, temperature=1.0, n=3,
                                       extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}})
    assert {c.message.content for c in r.choices} <= {"alpha", "beta"}
    assert idle(live.driver)


def test_a_constraint_that_cannot_compile_is_a_400_naming_its_field(live):
    web, model = live.app.test_client(), live.driver.api_model
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
              "response_format"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
             ({"response_format": {"type": "structural_tag"}}, "response_format"),
             ({"response_format": "json"}, "response_format"),
             ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
             ({"structured_outputs": {"json": {}, "choice": ["a"]}}, "structured_outputs"),
             ({"guided_json": {"properties": {"a": {"$ref": "#/nope"}}}}, "guided_json"),
             ({"guided_choice": "yes"}, "guided_choice"),
             ({"guided_grammar": "start: ("}, "guided_grammar"),
             ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex")]
    for body, param in cases:
        for path, shape in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": CHAT})):
            r = web.post(path, json={"model": model, "max_tokens": 4, **shape, **body})
            assert r.status_code == 400 and r.get_json()["error"]["param"] == param, (body, r.get_json())
    # `text` is no constraint
    r = web.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2,
                                          "response_format": {"type": "text"}})
    assert r.status_code == 200
    assert idle(live.driver)
