"""The app: CLI flags, /healthz, and the websocket on the shared live server."""
import json
import subprocess
import sys

from simple_websocket import Client

from helpers import ROOT, frames


def cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "app.py"), *args], capture_output=True, text=True,
                          timeout=60)


def test_help_lists_flags():
    out = cli("--help").stdout
    for flag in ("--host", "--port", "--model", "--device", "--dtype", "--slots", "--kv-tokens"):
        assert flag in out


def test_bad_flags_get_one_line_errors():
    for args, needle in [(("--slots", "zero"), "--slots must be a whole number"),
                         (("--port", "70000"), "--port must be at most 65535"),
                         (("--device", "tpu"), "invalid choice"),
                         (("--kv-tokens", "4"), "--kv-tokens must hold at least one block")]:
        r = cli(*args)
        assert r.returncode == 2
        assert needle in r.stderr and "Traceback" not in r.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    r = cli("--model", str(tmp_path / "nope"), "--port", "1")
    assert r.returncode == 2 and "no such file or directory" in r.stderr and "Traceback" not in r.stderr


def test_healthz_ok(server):
    import requests
    h = requests.get(server.url + "/healthz").json()
    assert h["status"] == "ok" and h["device"] == "cpu" and "SmolLM2" in h["model"]


def test_websocket_hello_submit_and_errors(server):
    conn = Client.connect(server.ws_url)
    try:
        first = json.loads(conn.receive(timeout=10))
        assert first[0]["type"] == "hello" and first[0]["kv_bytes_per_token"] > 0
        conn.send(json.dumps({"type": "set", "settings": {"slots": -3}}))
        conn.send(b"\x01binary")
        conn.send(json.dumps({"type": "submit", "prompt": "Say hi.", "max_new_tokens": 4}))
        evs = frames(conn, 30, until=lambda ev: any(e["type"] == "finished" for e in ev))
        errors = [e for e in evs if e["type"] == "error"]
        assert [e["field"] for e in errors] == ["slots", "message"]
        mine = next(e["id"] for e in evs if e["type"] == "request" and e["source"] == "page")
        tokens = [e for e in evs if e["type"] == "token" and e["id"] == mine]
        fin = next(e for e in evs if e["type"] == "finished" and e["id"] == mine)
        assert 1 <= len(tokens) == fin["output_tokens"] <= 4
        assert tokens[0]["first"] and fin["ttft"] > 0
    finally:
        conn.close()
