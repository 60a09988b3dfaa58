"""Observe mode: a First Token page watching another server through its OpenAI API and /metrics.

The shared real app is the "external" server (it is a real OpenAI-compatible server with
vLLM-named /metrics); the observe-mode app under test is started on its own. Every event
the observe-mode page receives follows the same schema as the engine's."""
import json
import subprocess
import sys
import time

import pytest
import requests
from simple_websocket import Client

from helpers import ROOT, frames, schema_validator, start_app
from server.observe import parse_gauges

BURST = 3
MAX_NEW = 24   # long enough that the server's /metrics (scraped every 0.5 s) sees them running


@pytest.fixture(scope="module")
def observer(server):
    s = start_app("--observe", server.url + "/v1")
    yield s
    s.stop()


def test_observe_page_sees_every_request_from_the_client_side(server, observer):
    health = requests.get(observer.url + "/healthz").json()
    assert health["mode"] == "observe" and health["model"] == requests.get(server.url + "/healthz").json()["model"]
    conn = Client.connect(observer.ws_url)

    def settled(events):
        """Every request finished, and a later stats event shows the server idle again."""
        done = [e for e in events if e["type"] == "finished"]
        return len(done) == BURST and any(
            e["type"] == "stats" and e["t"] > max(d["t"] for d in done) and e["server"] and e["running"] == 0
            for e in events)
    try:
        received = json.loads(conn.receive(timeout=10))
        hello = received[0]
        assert hello["type"] == "hello" and hello["mode"] == "observe" and hello["model"] == health["model"]
        assert set(hello["limits"]) == {"load", "rate", "prompt_tokens", "max_new_tokens", "temperature", "top_p"}
        conn.send(json.dumps({"type": "set", "settings": {"slots": 2}}))   # an engine-only setting
        conn.send(json.dumps({"type": "set", "settings": {"max_new_tokens": MAX_NEW, "prompt_tokens": 32}}))
        conn.send(json.dumps({"type": "burst", "n": BURST}))
        events = frames(conn, 240, until=settled)
    finally:
        conn.close()
    check = schema_validator()
    for e in received + events:
        check.validate(e)

    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["field"] == "slots"
    requested = [e for e in events if e["type"] == "request"]
    assert len(requested) == BURST and all(e["source"] == "observe" for e in requested)
    for req in requested:
        mine = [e for e in events if e.get("id") == req["id"]]
        tokens = [e for e in mine if e["type"] == "token"]
        (fin,) = [e for e in mine if e["type"] == "finished"]
        assert tokens and tokens[0]["first"] and [t["index"] for t in tokens] == list(range(len(tokens)))
        assert all(req["t"] < a["t"] <= b["t"] for a, b in zip(tokens, tokens[1:]))
        assert fin["reason"] in ("length", "stop") and fin["client_side"]
        assert fin["ttft"] == pytest.approx(tokens[0]["t"] - req["t"])
        assert fin["gaps"] == pytest.approx([b["t"] - a["t"] for a, b in zip(tokens, tokens[1:])])
        assert fin["e2e"] >= fin["ttft"] + sum(fin["gaps"]) - 1e-9
        # What only the server knows comes from its usage report, never from a guess.
        assert fin["prompt_tokens"] > 0 and fin["output_tokens"] <= MAX_NEW
        assert fin["stages"]["other"] == fin["ttft"]
        assert all(fin["stages"][k] is None for k in ("tokenize", "queue", "prefill", "first_sample", "delivery"))
    stats = [e for e in events if e["type"] == "stats" and e["server"]]
    assert stats, "the server's /metrics gauges never reached the page"
    assert max(e["server"]["running"] for e in stats) >= 1
    assert all(0 <= e["server"]["kv_cache_usage"] <= 1 and e["queue"] == e["server"]["waiting"] for e in stats)
    assert stats[-1]["running"] == 0 and stats[-1]["finished"] == BURST


def test_observe_mode_has_no_model_of_its_own(observer):
    r = requests.post(observer.url + "/v1/completions", json={"model": "x", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "observe_mode"
    assert requests.get(observer.url + "/metrics").status_code == 404


def test_bad_observe_url_is_a_one_line_error():
    r = subprocess.run([sys.executable, str(ROOT / "app.py"), "--observe", "ftp://example"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--observe needs an http(s) URL" in r.stderr and "Traceback" not in r.stderr


def test_parse_gauges_reads_vllm_names_old_and_new():
    text = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""
    assert parse_gauges(text) == {"running": 4.0, "waiting": 2.0, "kv_cache_usage": 0.25}
    newer = text + '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_gauges(newer)["kv_cache_usage"] == 0.5
    assert parse_gauges("# TYPE other gauge\nother 1\n") == {"running": None, "waiting": None,
                                                             "kv_cache_usage": None}


# ------------------------------------------------------------------ a hostile observed server
HOSTILE = {   # prompt -> (HTTP status, stream lines): what a broken or hostile server might send
    "deep": (200, [b"data: " + b"[" * 5000 + b"]" * 5000]),
    "list": (200, [b"data: [1, 2]"]),
    "surrogate": (200, [b'data: {"choices": [{"delta": {"content": "\\ud800"}}]}']),
    "odd shapes": (200, [b'data: {"choices": [1, {"delta": "x"}, {"delta": {"content": 5}}], '
                         b'"usage": {"prompt_tokens": "many", "completion_tokens": [1]}}',
                         b'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": {"x": 1}}]}',
                         b"data: [DONE]"]),
    "deep error": (500, [b"[" * 10000]),
    "fine": (200, [b'data: {"choices": [{"delta": {"content": "Hello"}}]}',
                   b'data: {"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}], '
                   b'"usage": {"prompt_tokens": 3, "completion_tokens": 2}}',
                   b"data: [DONE]"]),
}


@pytest.fixture
def hostile_server():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b'{"data": [{"id": "fake-model"}]}' if self.path == "/v1/models" else b"{}"
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"][0]["content"]
            status, lines = HOSTILE[prompt]
            body = b"".join(line + b"\n\n" for line in lines)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_a_hostile_observed_server_fails_only_its_requests(hostile_server):
    """Whatever an observed server streams (nesting past any limit, chunks of the wrong shape,
    lone surrogates, usage that is not a count), each request ends with a schema-valid
    `finished` (or, for an HTTP error, `rejected`) event, and a good answer afterwards is
    drawn as usual."""
    from server.observe import Observer
    obs = Observer(hostile_server).start()
    deadline = time.monotonic() + 10
    while not obs.reachable and time.monotonic() < deadline:   # its /v1/models answered
        time.sleep(0.05)
    sub = obs.events.subscribe(replay=False)
    check = schema_validator()
    try:
        finished = {}
        for prompt in HOSTILE:
            handle = obs.submit(prompt)
            deadline = time.monotonic() + 10
            while handle.id not in finished and time.monotonic() < deadline:
                for e in sub.get(timeout=0.2):
                    check.validate(e)
                    if e["type"] in ("finished", "rejected"):
                        finished[e["id"]] = (prompt, e)
            assert handle.id in finished, f"{prompt!r} never ended"
        reasons = {prompt: (e.get("reason"), e.get("error")) for prompt, e in finished.values()}
        for prompt in ("deep", "list", "surrogate"):
            assert reasons[prompt][0] == "error" and reasons[prompt][1], reasons[prompt]
        rejected = next(e for p, e in finished.values() if p == "deep error")
        assert rejected["type"] == "rejected" and rejected["code"] == "http_500"
        assert "nested" in reasons["deep"][1] and "JSON object" in reasons["list"][1]
        odd = next(e for p, e in finished.values() if p == "odd shapes")
        assert odd["reason"] == "error" and odd["prompt_tokens"] is None and odd["chunks"] == 1   # the "ok"
        fine = next(e for p, e in finished.values() if p == "fine")
        assert fine["reason"] == "stop" and fine["chunks"] == 2 and fine["output_tokens"] == 2
    finally:
        obs.events.unsubscribe(sub)
        obs.shutdown()
