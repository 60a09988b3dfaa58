"""The app over a disaggregated backend (engine/disagg/): two engine processes on the tiny
random model behind the same routes and websocket as a colocated engine."""
import json
import os
import signal

import pytest
import requests
from simple_websocket import Client

from engine import EngineConfig
from engine.disagg.backend import DisaggBackend
from helpers import Served, frames, reference, tiny_factory, wait_until


class DisaggApp(Served):
    """create_app over a DisaggBackend, served in this process (`Served`)."""

    def __init__(self):
        from server import create_app
        self.backend = DisaggBackend(tiny_factory, EngineConfig(slots=4, kv_tokens=2048, max_context=512)).start()
        self.shm = [seg.name for seg in self.backend.instances.segments]
        super().__init__(create_app({"TESTING": True}, backend=self.backend))

    def stop(self):
        super().stop()
        self.backend.shutdown()


def left_in_shm(names):
    return [n for n in names if os.path.exists(f"/dev/shm/{n}")]


@pytest.fixture
def disagg():
    app = DisaggApp()
    yield app
    app.stop()
    assert not left_in_shm(app.shm)


def test_the_app_serves_a_disaggregated_backend(tiny, disagg):
    """/healthz names both instances, the API's greedy completion equals generate's, the page's
    websocket gets hello.instances, the events of both instances and the transfer, /metrics
    counts the transfer under vLLM's NIXL names, and what only one engine can do is refused."""
    h = requests.get(disagg.url + "/healthz", timeout=10).json()
    assert h["status"] == "ok" and set(h["instances"]) == {"prefill", "decode"}
    conn = Client.connect(disagg.ws_url)
    try:
        hello = json.loads(conn.receive(timeout=10))[0]
        assert hello["type"] == "hello" and [i["name"] for i in hello["instances"]] == ["prefill", "decode"]
        prompt = "We hold these truths to be self-evident"
        body = {"model": disagg.backend.api_model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        r = requests.post(disagg.url + "/v1/completions", json=body, timeout=60).json()
        ref = tiny.tokenizer.decode(reference(tiny, prompt, 8))
        assert r["choices"][0]["text"] == ref
        evs = frames(conn, 30, until=lambda es: any(e["type"] == "finished" for e in es))
        kinds = {(e["type"], e.get("instance")) for e in evs}
        assert {("admitted", "prefill"), ("admitted", "decode"), ("prefill", "prefill"), ("prefill", "decode"),
                ("step", "prefill"), ("step", "decode"), ("kv_transfer", None)} <= kinds
        fin = next(e for e in evs if e["type"] == "finished")
        moved = next(e for e in evs if e["type"] == "kv_transfer")
        assert fin["stages"]["transfer"] == pytest.approx(moved["end"] - moved["start"])
        assert sum(fin["stages"].values()) == pytest.approx(fin["ttft"], abs=1e-9)
        conn.send(json.dumps({"type": "set", "settings": {"kv_cache": False}}))
        conn.send(json.dumps({"type": "measure"}))
        errors = [e for e in frames(conn, 10, until=lambda es: sum(e["type"] == "error" for e in es) >= 2)
                  if e["type"] == "error"]
        assert [e["field"] for e in errors] == ["kv_cache", "measure"]
    finally:
        conn.close()
    text = requests.get(disagg.url + "/metrics", timeout=10).text
    assert 'vllm:nixl_xfer_time_seconds_count{model_name="tiny-random-llama"} 1.0' in text
    assert "vllm:nixl_bytes_transferred_sum" in text and "first_token:kv_transfer_tokens_total" in text


def test_a_dead_instance_makes_healthz_503_and_fails_the_request(disagg):
    body = {"model": disagg.backend.api_model, "prompt": "Four score and seven years ago", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(disagg.url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith(b"data:"))       # streaming: the decode instance holds it
        os.kill(disagg.backend.instances.prefill.info["pid"], signal.SIGKILL)
        rest = b"\n".join(lines)
    assert b"error" in rest
    wait_until(lambda: requests.get(disagg.url + "/healthz", timeout=10).status_code == 503, 30, "/healthz 503")
    assert "prefill" in requests.get(disagg.url + "/healthz", timeout=10).json()["message"]
    wait_until(lambda: not left_in_shm(disagg.shm), 30, "the shared memory freed")
