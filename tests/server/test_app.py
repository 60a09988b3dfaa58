"""The app: CLI flags (`app.py` in a subprocess); the pages, /healthz and the websocket of the app
from `create_app` on the tiny random model, in process; and what every client sees when the
engine fails while serving, or the model fails to load."""
import json
import re
import subprocess
import sys
import threading

import pytest
import requests
from simple_websocket import Client, ConnectionClosed

from app import parse_args
from helpers import ROOT, Served, flag_error, frames, wait_until
from server import create_app, loader, pages


def cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, text=True,
                          timeout=60)


def test_help_lists_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--model", "--device", "--dtype", "--slots", "--kv-tokens"):
        assert flag in out


def test_bad_flags_get_one_line_errors(capsys):
    for args, needle in [(("--slots", "zero"), "--slots must be a whole number"),
                         (("--port", "70000"), "--port must be at most 65535"),
                         (("--device", "tpu"), "invalid choice"),
                         (("--kv-tokens", "4"), "--kv-tokens must hold at least one block")]:
        code, err = flag_error(capsys, *args)
        assert code == 2 and needle in err and "Traceback" not in err


def test_missing_model_is_a_clear_error(tmp_path):
    """The entry point itself, in a subprocess: a usage error and no traceback."""
    r = cli("--model", str(tmp_path / "nope"), "--port", "1")
    assert r.returncode == 2 and "no such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_pages_render_and_their_scripts_are_served():
    http = create_app().test_client()   # no backend: the pages do not need one
    page = http.get("/")
    assert page.status_code == 200 and "<title>First Token</title>" in page.text
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    assert "/static/plotly.min.js" in assets and any(a.endswith(".css") for a in assets)
    for path in assets:
        r = http.get(path)
        assert r.status_code == 200 and r.get_data(), path
        r.close()
    plotly = http.get("/static/plotly.min.js")
    assert plotly.mimetype == "application/javascript" and b"plotly.js v" in plotly.get_data()[:200]
    plotly.close()
    # The ES modules: the import map names each by its specifier, served as JavaScript (a browser
    # runs no module with another MIME type), and every module imports only specifiers it maps.
    for html in (page.text, http.get("/embed").text):
        modules = json.loads(re.search(r'<script type="importmap"[^>]*>(.*?)</script>', html, re.S).group(1))["imports"]
        assert set(modules) == {f"ft/{name}" for name in pages.MODULES} and {"ft/app", "ft/util"} <= set(modules)
        assert re.search(r'<script type="module" nonce="[^"]+">import "ft/app";</script>', html)
    for spec, url in modules.items():
        r = http.get(url)
        assert r.status_code == 200 and r.mimetype in ("text/javascript", "application/javascript"), url
        for imported in re.findall(r'^import .*? from "([^"]+)";$', r.get_data(as_text=True), re.M):
            assert imported in modules, (spec, imported)
        r.close()
    embed = http.get("/embed")
    assert embed.status_code == 200 and "<title>First Token (embed)</title>" in embed.text
    assert "/static/plotly.min.js" not in embed.text   # the embed draws no plotly charts
    loading = http.get("/healthz")
    assert loading.status_code == 503 and loading.get_json()["status"] == "loading"


def test_healthz_ok(live, tiny):
    r = live.app.test_client().get("/healthz")
    h = r.get_json()
    assert r.status_code == 200 and h["status"] == "ok"
    assert (h["model"], h["device"], h["dtype"]) == (tiny.name, "cpu", "float32")
    assert h["running"] == 0 and h["waiting"] == 0


def test_websocket_hello_submit_and_errors(live):
    conn = Client.connect(live.ws_url)
    try:
        first = json.loads(conn.receive(timeout=10))
        assert first[0]["type"] == "hello" and first[0]["kv_bytes_per_token"] > 0
        conn.send(json.dumps({"type": "set", "settings": {"slots": -3}}))
        conn.send(b"\x01binary")
        conn.send(json.dumps({"type": "submit", "prompt": "Say hi.", "max_new_tokens": 4, "priority": "top"}))
        conn.send(json.dumps({"type": "submit", "prompt": "Say hi.", "max_new_tokens": 4, "priority": 3}))
        evs = frames(conn, 30, until=lambda ev: any(e["type"] == "finished" and e["source"] == "page" for e in ev))
        errors = [e for e in evs if e["type"] == "error"]
        assert [e["field"] for e in errors] == ["slots", "message", "priority"]
        mine = next(e["id"] for e in evs if e["type"] == "request" and e["source"] == "page")
        tokens = [e for e in evs if e["type"] == "token" and e["id"] == mine]
        fin = next(e for e in evs if e["type"] == "finished" and e["id"] == mine)
        assert 1 <= len(tokens) == fin["output_tokens"] <= 4
        assert tokens[0]["first"] and fin["ttft"] > 0
    finally:
        conn.close()


FAULT = "injected bookkeeping fault"


def test_an_engine_fault_reaches_every_client(live, monkeypatch):
    """An exception outside any forward (here: in the scheduler's admission, which runs every
    step) stops the engine. The API call in flight fails with a 5xx, /healthz answers 503 naming
    the fault, the page gets a fatal `error`, and new requests are refused at once, not left
    waiting on an engine that will never step again."""
    body = {"model": live.driver.api_model, "prompt": "Four score and seven years ago", "max_tokens": 450,
            "temperature": 0}
    answer = {}

    def call():
        answer["r"] = requests.post(live.url + "/v1/completions", json=body, timeout=60)
    api_call = threading.Thread(target=call, daemon=True)
    conn = Client.connect(live.ws_url)
    scheduler = live.driver.engine.scheduler
    schedule = scheduler.schedule

    def broken(*a, **kw):
        # The fault strikes in the engine's own thread once the request has decoded a few tokens,
        # however fast the engine runs (the test thread cannot race it to the end of its 450)
        if any(len(s.output_ids) >= 5 for s in scheduler.running):
            raise KeyError(FAULT)
        return schedule(*a, **kw)
    monkeypatch.setattr(scheduler, "schedule", broken)
    try:
        assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
        api_call.start()
        evs = frames(conn, 30, until=lambda ev: any(e["type"] == "error" for e in ev))
        (rid,) = {e["id"] for e in evs if e["type"] == "token"}   # the API request was decoding
        api_call.join(30)

        # The page: the request failed with the reason, then a fatal error naming the fault.
        (fin,) = [e for e in evs if e["type"] == "finished" and e["id"] == rid]
        assert fin["reason"] == "error" and FAULT in fin["error"] and fin["output_tokens"] < 450
        (fatal,) = [e for e in evs if e["type"] == "error"]
        assert fatal["fatal"] and FAULT in fatal["message"]
        # The API call in flight: an OpenAI-shaped server error.
        assert not api_call.is_alive()
        r = answer["r"]
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        # /healthz over HTTP.
        h = requests.get(live.url + "/healthz", timeout=10)
        assert h.status_code == 503 and h.json()["status"] == "error" and FAULT in h.json()["message"]
        # New requests are refused at once: the API with 503, the page with a `rejected` event.
        queued = live.driver._inbox.qsize()
        for stream in (False, True):
            late = requests.post(live.url + "/v1/completions", json={**body, "max_tokens": 3, "stream": stream},
                                 timeout=10)
            assert late.status_code == 503 and late.json()["error"]["code"] == "engine_error"
            # at once, not after a wait: refused in the caller's thread ("the engine stopped"),
            # nothing queued for an engine thread that will never take it
            assert FAULT in late.json()["error"]["message"] and "the engine stopped" in late.json()["error"]["message"]
            assert live.driver._inbox.qsize() == queued
        conn.send(json.dumps({"type": "submit", "prompt": "anyone there?", "max_new_tokens": 3}))
        later = frames(conn, 10, until=lambda ev: sum(e["type"] == "rejected" for e in ev) == 3)
        refused = [e for e in later if e["type"] == "rejected"]
        assert len(refused) == 3 and all(e["code"] == "engine_error" for e in refused)   # two API, one page
    finally:
        conn.close()


def test_a_model_that_fails_to_load_is_reported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": ')   # cut short
    args = parse_args(["--model", str(tmp_path), "--device", "cpu", "--dtype", "float32", "--slots", "2",
                       "--max-context", "256"])
    app = create_app()
    http = app.test_client()
    loader.start(args, app.extensions["first_token"])
    # nothing to wait on but /healthz itself, as a deploy probe would
    r = wait_until(lambda: (h := http.get("/healthz")).get_json()["status"] != "loading" and h, 60,
                   "/healthz past loading")
    body = r.get_json()
    assert r.status_code == 503 and body["status"] == "error", body
    assert "config.json" in body["message"] and "not a valid JSON" in body["message"]
    api = http.post("/v1/completions", json={"model": "any", "prompt": "hi"})
    assert api.status_code == 503 and api.get_json()["error"]["code"] == "load_failed"
    assert "not a valid JSON" in api.get_json()["error"]["message"]
    served = Served(app)
    try:
        conn = Client.connect(served.ws_url)
        (fatal,) = json.loads(conn.receive(timeout=10))
        assert fatal["type"] == "error" and fatal["fatal"] and "not a valid JSON" in fatal["message"]
        with pytest.raises(ConnectionClosed):   # and the server closed the connection
            conn.receive(timeout=10)
    finally:
        served.stop()


def test_record_and_export_are_subcommands_of_one_parser(tmp_path, capsys):
    """One argparse parser: no subcommand serves; `record` takes the model's flags after it
    and checks them as serving does; an unknown subcommand or a serving flag on `export` is a
    usage error naming it."""
    serve = parse_args(["--slots", "3"])
    assert serve.command is None and serve.slots == 3 and serve.host == "127.0.0.1"
    rec = parse_args(["record", "--seconds", "2", "-o", "t.json", "--slots", "5", "--set", "rate=2"])
    assert (rec.command, rec.slots, rec.seconds, rec.set) == ("record", 5, 2.0, [{"rate": 2}])
    exp = parse_args(["export", "t.json", "-o", "t.html"])
    assert (exp.command, exp.trace, exp.theme) == ("export", "t.json", "dark")
    for argv, message in [(["replay"], "invalid choice: 'replay'"),
                          (["record", "--seconds", "1", "-o", "t", "--kv-tokens", "4"], "at least one block"),
                          (["record", "--seconds", "1", "-o", "t", "--model", str(tmp_path / "no")], "no such file"),
                          (["export", "t.json", "-o", "t.html", "--slots", "2"], "unrecognized arguments: --slots")]:
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
