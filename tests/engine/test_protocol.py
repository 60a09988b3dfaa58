"""The wire protocol: the schema is generated from the event types and current, docs/protocol.md
lists the same fields, and what a live run under load actually sends validates against it."""
import json
import re

import jsonschema

from engine import schema
from engine.core.request import GenerateRequest
from helpers import SCHEMA, collect, engine_driver, schema_validator


def test_schema_file_is_generated_from_the_event_types():
    assert schema.main(["--check"]) == 0, "docs/events.schema.json is stale: run python -m engine.schema"
    doc = json.loads(SCHEMA.read_text())
    assert set(doc["$defs"]) >= {cls.__name__ for cls in schema.events.EVENT_TYPES}


def test_every_event_of_a_live_run_under_load_validates(tiny):
    """Load generator at its top rate, a burst, a page prompt, a rejected one, settings
    changes and a reset: every event published (and a hello) validates, and a trace made of
    them validates as a whole."""
    driver = engine_driver(tiny, slots=2, kv_tokens=1024, max_context=256)
    sub = driver.events.subscribe(replay=False)
    try:
        driver.update_settings({"prompt_tokens": 32, "max_new_tokens": 4, "rate": 16.0, "load": True})
        driver.burst(4)
        driver.submit(GenerateRequest(prompt="We hold these truths", source="page", max_new_tokens=3))
        driver.submit(GenerateRequest(prompt="truths " * 400, source="page", max_new_tokens=3))   # too long: rejected
        running = {"settings", "request", "tokenized", "admitted", "prefill", "step", "token", "finished",
                   "rejected", "stats"}
        events = collect(sub, lambda evs: running <= {e["type"] for e in evs}, timeout=60)
        driver.update_settings({"load": False, "max_batched_tokens": 16, "schedule": "prefill-first"})
        driver.reset()
        events += collect(sub, lambda evs: any(e["type"] == "reset" for e in evs))
    finally:
        driver.shutdown()
    check = schema_validator()
    for e in events:
        check.validate(e)
    trace = [driver.hello().to_dict()] + events
    jsonschema.validate(trace, json.loads(SCHEMA.read_text()))


def test_a_wrong_event_is_refused_by_the_schema():
    check = schema_validator()
    good = {"type": "dropped", "t": 1.0, "count": 3}
    check.validate(good)
    for bad in ({**good, "count": "3"}, {**good, "extra": 1}, {"type": "dropped", "t": 1.0},
                {**good, "type": "nope"}):
        assert not check.is_valid(bad), bad


def documented_fields():
    """{event type: the field names listed under its `### \\`type\\`` heading in docs/protocol.md}."""
    doc, out, current = (SCHEMA.parent / "protocol.md").read_text(), {}, None
    for line in doc.splitlines():
        heading = re.fullmatch(r"### `(\w+)`", line)
        if heading:
            current = out.setdefault(heading.group(1), set())
        elif line.startswith("## "):
            current = None
        elif current is not None and line.startswith("- "):
            current.update(re.findall(r"`(\w+)`", line[2:].split(" — ")[0]))
    return out


def test_protocol_doc_lists_exactly_the_fields_sent():
    defs = json.loads(SCHEMA.read_text())["$defs"]
    documented = documented_fields()
    assert set(documented) == {cls.type for cls in schema.events.EVENT_TYPES}
    for cls in schema.events.EVENT_TYPES:
        sent = set(defs[cls.__name__]["properties"]) - {"type", "t"}
        assert documented[cls.type] == sent, (cls.type, documented[cls.type] ^ sent)
