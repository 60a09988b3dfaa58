"""Traces without a browser: recording on the tiny model (engine/teach/record.py and `app.py record`),
the one-file export (server/export.py), the shipped examples, /embed's parameters and framing,
and clear errors for bad input (a file that is not a trace, an unknown example, a bad --set)."""
import base64
import json
import re
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest
import requests

import app as app_cli
from engine.teach import record
from helpers import SCHEMA, csp, engine_driver
from server import create_app, export, loader, pages

QUICK = {"load": True, "rate": 8.0, "prompt_tokens": 32, "max_new_tokens": 6}


def trace_validator():
    """The whole-trace schema (docs/events.schema.json's top level: hello, then events)."""
    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))


@pytest.fixture
def tiny_cli(tiny, monkeypatch):
    """`app.py record` builds its engine on the tiny model instead of loading the bundled one."""
    built = []

    def tiny_driver(args, progress):
        d = engine_driver(tiny, slots=args.slots, kv_tokens=None)   # the engine's own KV default
        built.append(d)
        return d
    monkeypatch.setattr(loader, "driver", tiny_driver)
    yield built
    for d in built:
        d.shutdown()


def test_a_drained_recording_is_a_schema_valid_trace_of_whole_requests(driver):
    trace = record.record(driver, 1.0, settings=QUICK, drain=True)
    trace_validator().validate(trace)
    types = [ev["type"] for ev in trace]
    assert types[0] == "hello" and "sync" not in types
    settings = [ev for ev in trace if ev["type"] == "settings"]
    assert settings and settings[0]["settings"]["load"] is True and settings[-1]["settings"]["load"] is False
    asked = {ev["id"] for ev in trace if ev["type"] == "request"}
    ended = {ev["id"] for ev in trace if ev["type"] in ("finished", "rejected")}
    assert len(asked) >= 3 and asked == ended   # drained: every request it saw ended inside the trace
    tokens = sum(1 for ev in trace if ev["type"] == "token")
    assert tokens == sum(ev["output_tokens"] for ev in trace if ev["type"] == "finished")


def test_a_preset_recording_carries_its_explanation(driver):
    from engine.teach.presets import PRESETS
    trace = record.record(driver, 1.5, preset="queueing", drain=True)
    trace_validator().validate(trace)
    preset = [ev for ev in trace if ev["type"] == "preset"]
    assert len(preset) == 1 and preset[0]["explain"] == PRESETS["queueing"].explain
    assert [ev["type"] for ev in trace].index("reset") < [ev["type"] for ev in trace].index("preset")
    finished = [ev for ev in trace if ev["type"] == "finished"]
    assert len(finished) == 12   # the two bursts, all ended inside the trace


def test_bad_settings_record_nothing_and_change_nothing(driver):
    before = driver.settings.now
    with pytest.raises(record.SettingError, match="rate"):
        record.record(driver, 0.2, settings={"load": True, "rate": 999})
    assert driver.settings.now == before


def test_parse_sets():
    assert record.parse_sets(["rate=2", "load=true", "schedule=static", "top_p=0.5"]) == \
        {"rate": 2, "load": True, "schedule": "static", "top_p": 0.5}
    with pytest.raises(record.SettingError, match="NAME=VALUE"):
        record.parse_sets(["rate"])


def test_record_cli_writes_a_valid_trace_that_exports(tiny_cli, tmp_path, capsys):
    out, page = tmp_path / "t.json", tmp_path / "t.html"
    app_cli.main(["record", "--seconds", "1", "--drain", "--slots", "4", "-o", str(out)] +
                 [a for k, v in QUICK.items() for a in ("--set", f"{k}={json.dumps(v)}")])
    trace = json.loads(out.read_text())
    trace_validator().validate(trace)
    assert any(ev["type"] == "finished" for ev in trace)
    assert tiny_cli[0].settings.now.scheduling.slots == 4
    app_cli.main(["export", str(out), "-o", str(page)])
    html = page.read_text()
    # Self-contained: no element refers to anything outside the file, and the import map maps
    # every module the page has (each of static/JOB/ft-*.js) to a data: URL of its own text.
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=\"(?!data:)", html)
    modules = json.loads(re.search(r'<script type="importmap"[^>]*>(.*?)</script>', html, re.S).group(1))["imports"]
    assert set(modules) == {f"ft/{name}" for name in pages.MODULES} and "ft/app" in modules
    assert len(modules) == len(list(pages.STATIC.glob("*/ft-*.js")))   # no two folders hold one name
    for spec, url in modules.items():
        assert url.startswith("data:text/javascript;base64,")
        file = pages.STATIC / pages.MODULES[spec.removeprefix("ft/")]
        assert base64.b64decode(url.split(",", 1)[1]).decode() == file.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="ft-trace">(.*?)</script>', html, re.S)
    assert json.loads(m.group(1)) == {"name": "t", "events": trace}
    assert html.count("<script") == html.count("</script>")


@pytest.mark.parametrize("argv, message", [
    (["--set", "rate"], "expected NAME=VALUE"),
    (["--set", "nope=1"], "unknown setting 'nope'"),
    (["--set", "rate=999"], "rate: must be at most"),
    (["--set", "schedule=fastest"], "must be one of mixed, prefill-first, static"),
    (["--seconds", "0"], "positive number of seconds"),
    (["--preset", "nope"], "--preset: unknown preset 'nope' (known: idle, queueing"),
])
def test_record_cli_bad_input_is_a_clear_error(tiny_cli, tmp_path, capsys, argv, message):
    out = tmp_path / "t.json"
    base = ["record", "--seconds", "1", "-o", str(out)]
    with pytest.raises(SystemExit) as e:
        app_cli.main(base[:1] + argv + base[1:] if argv[0] == "--seconds" else base + argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ('{"type": "hello", "t": 0}', "a JSON array"),
    ('[{"type": "token", "t": 1}]', "starts with a hello"),
    ('[{"type": "hello", "t": 0}, {"type": "token"}]', "event 1 has no type and time"),
])
def test_export_refuses_what_is_not_a_trace(tmp_path, capsys, text, message):
    bad, out = tmp_path / "bad.json", tmp_path / "out.html"
    bad.write_text(text)
    with pytest.raises(SystemExit) as e:
        app_cli.main(["export", str(bad), "-o", str(out)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "not a First Token trace" in err and message in err
    assert not out.exists()


def test_inlined_text_cannot_close_its_script(driver):
    """A prompt that says </script> stays text inside the inlined trace."""
    trace = record.record(driver, 0.1)
    trace.append({"type": "request", "t": 1.0, "id": "r99", "source": "page", "prompt_tokens": 3,
                  "max_new_tokens": 1, "preview": "</script><script>alert(1)</script><!--", "estimated": False})
    html = export.render(trace, "x</script>")
    start = '<script type="application/json" id="ft-trace">'
    boot = html[html.index(start) + len(start):]
    boot = boot[:boot.index("</script>")]
    assert "</script" not in boot.lower() and "<!--" not in boot
    assert json.loads(boot) == {"name": "x</script>", "events": trace}


def test_shipped_examples_are_valid_small_traces_from_the_real_model():
    names = pages.example_names()
    assert len(names) >= 2
    for name in names:
        path = pages.EXAMPLES / f"{name}.json"
        assert path.stat().st_size < 1_000_000, f"{name}: {path.stat().st_size} bytes"
        trace = json.loads(path.read_text())
        trace_validator().validate(trace)
        assert trace[0]["model"].startswith("SmolLM2-135M-Instruct")
        assert sum(ev["type"] == "finished" for ev in trace) >= 5


# ------------------------------------------------------------------ /embed and /examples
@pytest.fixture
def client(live):
    return requests.Session(), live.url


def test_examples_are_served_by_name_only(client):
    http, url = client
    name = pages.example_names()[0]
    r = http.get(f"{url}/examples/{name}.json")
    assert r.status_code == 200 and r.json()[0]["type"] == "hello"
    for bad in ("nope", "%2E%2E", name.upper(), "html"):
        r = http.get(f"{url}/examples/{bad}.json")
        assert r.status_code == 404
        message = r.json()["error"]["message"]
        assert "no shipped example named" in message and message.endswith(", ".join(pages.example_names()))
    for path in ("/examples/..%2Fapp.json", "/examples/../app.py", "/examples/html/x.json"):
        assert http.get(url + path).status_code == 404


@pytest.mark.parametrize("query, message", [
    ("trace=examples/nope.json", "not a shipped example"),
    ("trace=../app.py", "not a shipped example"),
    ("trace=/etc/passwd", "not a shipped example"),
    ("panels=timeline,bogus", "unknown panel(s) bogus"),
    ("theme=pink", "theme: 'pink' is not one of dark, light"),
    ("compact=maybe", "compact"),
])
def test_embed_bad_parameters_are_400_with_the_reason(client, query, message):
    http, url = client
    r = http.get(f"{url}/embed?{query}")
    assert r.status_code == 400 and message in r.text


def test_embed_parameters_choose_what_is_rendered(client):
    http, url = client
    name = pages.example_names()[0]
    plain = http.get(f"{url}/embed").text
    assert 'id="timeline"' in plain and 'id="kv"' not in plain and "plotly" not in plain
    more = http.get(f"{url}/embed?panels=kv,queue&theme=light&compact=1&trace=examples/{name}.json").text
    assert 'id="kv"' in more and 'id="queue"' in more and 'id="blocks"' not in more
    assert 'data-theme="light"' in more and 'class="embed compact"' in more


def test_embed_preset_with_a_shipped_recording_replays_it_for_the_reader(driver):
    """The live engine is one for every article reader and a preset resets it: /embed?preset=NAME
    with examples/NAME.json goes to that recording (its other parameters kept); `live=1`, or a
    lesson with no recording, stays live (the page asks before resetting what others watch)."""
    app = create_app({}, backend=driver).test_client()
    name = pages.example_names()[0]
    r = app.get(f"/embed?preset={name}&panels=kv&theme=light")
    assert r.status_code == 302
    assert parse_qs(urlsplit(r.headers["Location"]).query) == {"trace": [f"examples/{name}.json"], "panels": ["kv"],
                                                                "theme": ["light"]}
    assert app.get(f"/embed?preset={name}&live=1").status_code == 200
    assert app.get("/embed?preset=idle").status_code == 200   # no recording of it shipped
    bad = app.get(f"/embed?preset={name}&live=maybe")
    assert bad.status_code == 400 and "live" in bad.text


def test_embed_is_framed_by_anyone_by_default_and_pages_by_themselves(client):
    http, url = client
    assert csp(http.get(f"{url}/embed"))["frame-ancestors"] == "* file:"
    page = http.get(f"{url}/")
    assert csp(page)["frame-ancestors"] == "'self'"
    assert page.headers["X-Frame-Options"] == "SAMEORIGIN"


def test_frame_ancestors_narrows_embed(driver):
    app = create_app({"FRAME_ANCESTORS": "https://B.org https://a.org:443"}, backend=driver)
    r = app.test_client().get("/embed")
    assert csp(r)["frame-ancestors"] == "'self' https://a.org https://b.org"
    assert "X-Frame-Options" not in r.headers
    assert csp(app.test_client().get("/"))["frame-ancestors"] == "'self'"
    # an article opened from disk, named in the list ("*" alone allows it: see the default above)
    disk = create_app({"FRAME_ANCESTORS": "https://a.org FILE:"}, backend=driver)
    assert csp(disk.test_client().get("/embed"))["frame-ancestors"] == "'self' https://a.org file:"


@pytest.mark.parametrize("value, message", [("ftp://x.org", "not an origin"), ("* https://a.org", "alone"),
                                            ("", "give *")])
def test_frame_ancestors_flag_errors(capsys, value, message):
    with pytest.raises(SystemExit):
        app_cli.parse_args(["--frame-ancestors", value])
    assert message in capsys.readouterr().err

