"""Observe mode: a First Token page watching another server through its OpenAI API and /metrics.

The shared real app is the "external" server (it is a real OpenAI-compatible server with
vLLM-named /metrics); the observe-mode app under test is started on its own. Every event
the observe-mode page receives follows the same schema as the engine's."""
import json
import subprocess
import sys

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
