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

from engine.events import PROTOCOL
from engine.core.request import GenerateRequest
from helpers import ROOT, LiveApp, Served, collect, frames, schema_validator, start_app, wait_until

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
        assert fin["ttft"] == pytest.approx(tokens[0]["t"] - req["t"], abs=1e-6)   # token times are sent to the microsecond
        assert fin["gaps"] == pytest.approx([b["t"] - a["t"] for a, b in zip(tokens, tokens[1:])], abs=2e-6)
        assert fin["e2e"] >= fin["ttft"] + sum(fin["gaps"]) - 1e-9
        # What only the server knows comes from its usage report, never from a guess.
        assert fin["prompt_tokens"] > 0 and fin["output_tokens"] <= MAX_NEW
        assert fin["stages"]["other"] == fin["ttft"]
        assert all(fin["stages"][k] is None for k in ("tokenize", "queue", "prefill", "first_sample", "delivery"))
    stats = [e for e in events if e["type"] == "stats" and e["server"]]
    assert stats, "the server's /metrics gauges never reached the page"
    assert all(e["server"]["profile"] == "first-token" for e in stats)
    assert max(e["server"]["gauges"]["running"] for e in stats) >= 1
    assert all(0 <= e["server"]["gauges"]["kv_usage"] <= 1 and e["queue"] == e["server"]["gauges"]["waiting"]
               for e in stats)
    assert stats[-1]["running"] == 0 and stats[-1]["finished"] == BURST


def test_observe_mode_has_no_model_of_its_own(observer):
    r = requests.post(observer.url + "/v1/completions", json={"model": "x", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "observe_mode"
    assert requests.get(observer.url + "/metrics").status_code == 404


def test_observe_mode_and_the_web_layer_load_no_model_code():
    """observe/ and server/ import nothing of torch or transformers (seconds to import, for a
    model observe mode does not have): the model code stays behind engine's lazy imports."""
    code = ("import sys; import observe, server; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_bad_observe_url_is_a_one_line_error():
    r = subprocess.run([sys.executable, str(ROOT / "app.py"), "--observe", "ftp://example"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--observe needs an http(s) URL" in r.stderr and "Traceback" not in r.stderr


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
    from helpers import loopback_http

    def models(handler):
        if handler.path == "/v1/models":
            return 200, b'{"data": [{"id": "fake-model"}]}'
        return 404, b"{}"

    def answer(handler):
        prompt = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))["messages"][0]["content"]
        status, lines = HOSTILE[prompt]
        return status, b"".join(line + b"\n\n" for line in lines)
    httpd = loopback_http(models, answer)
    yield httpd.url + "/v1"
    httpd.shutdown()


def test_a_hostile_observed_server_fails_only_its_requests(hostile_server):
    """Whatever an observed server streams (nesting past any limit, chunks of the wrong shape,
    lone surrogates, usage that is not a count), each request ends with a schema-valid
    `finished` (or, for an HTTP error, `rejected`) event, and a good answer afterwards is
    drawn as usual."""
    from observe import Observer
    obs = Observer(hostile_server).start()
    wait_until(lambda: obs.watch.reachable, 30, "the server's /v1/models answered")
    sub = obs.events.subscribe(replay=False)
    check = schema_validator()
    try:
        finished = {}
        for prompt in HOSTILE:
            handle = obs.submit(GenerateRequest(prompt=prompt, source="page", chat=True))
            for e in collect(sub, lambda evs: any(e["type"] in ("finished", "rejected") and e["id"] == handle.id
                                                  for e in evs)):
                check.validate(e)
                if e["type"] in ("finished", "rejected"):
                    finished[e["id"]] = (prompt, e)
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


# ------------------------------------------------------------------ First Token observing First Token (tiny model)
def observing(url, api_key=None, classroom=None):
    """An observe-mode app on `url`, in this process, once it has read the server's /metrics."""
    from server import create_app
    from observe import Observer
    obs = Observer(url + "/v1", api_key=api_key).start()
    app = Served(create_app({"TESTING": True}, backend=obs, classroom=classroom))
    app.observer = obs
    wait_until(lambda: obs.watch.scraper.describe() is not None, 30, "the server's /metrics read")
    return app


def stop_all(conn, obs, observed):
    """Close the page's socket, the observer and its app, then the observed server."""
    conn.close()
    obs.observer.shutdown()
    obs.stop()
    observed.stop()


def tiny_server(tiny, classroom=None):
    from engine import EngineConfig
    return LiveApp(tiny, EngineConfig(slots=2, kv_tokens=4096, max_context=512), classroom=classroom)


def test_observing_first_token_on_the_tiny_model_draws_server_lanes_and_request_rows(tiny):
    """A second First Token (tiny model, 2 slots) is the observed server: its profile is
    detected, its gauges and rates reach `stats.server` with the scrape's age and period, and
    every request has its client-side row, each figure saying who measured it."""
    observed = tiny_server(tiny)
    eng = observed.driver.engine
    step = eng.step

    def slow_step():     # the tiny model is too fast for a 0.5 s scrape to catch it busy
        time.sleep(0.02)
        return step()
    eng.step = slow_step
    obs = observing(observed.url)
    conn = Client.connect(obs.ws_url)
    n = 5            # more than its 2 slots: some must wait on the server

    def settled(events):
        done = [e for e in events if e["type"] == "finished"]
        return len(done) == n and any(e["type"] == "stats" and e["t"] > max(d["t"] for d in done)
                                      and e["server"] and e["server"]["gauges"]["running"] == 0 for e in events)
    try:
        (hello, *history) = json.loads(conn.receive(timeout=10))
        conn.send(json.dumps({"type": "set", "settings": {"max_new_tokens": 48, "prompt_tokens": 64}}))
        conn.send(json.dumps({"type": "burst", "n": n}))
        events = frames(conn, 120, until=settled)
    finally:
        stop_all(conn, obs, observed)
    check = schema_validator()
    for e in [hello, *history, *events]:
        check.validate(e)
    assert hello["server"]["kind"] == "first-token" and hello["server"]["version"] == f"protocol {PROTOCOL}"
    assert hello["server"]["title"] == "First Token" and hello["metrics"] is True
    assert {"running", "waiting", "kv_usage"} <= set(hello["server"]["exposed"]["gauges"])
    assert "prefix_hit_ratio" in hello["server"]["exposed"]["ratios"]
    # Per-request rows, measured here.
    ids = [e["id"] for e in events if e["type"] == "request"]
    assert len(ids) == n
    for rid in ids:
        (fin,) = [e for e in events if e["type"] == "finished" and e["id"] == rid]
        tokens = [e for e in events if e["type"] == "token" and e["id"] == rid]
        assert fin["client_side"] and fin["reason"] in ("length", "stop") and len(tokens) == fin["chunks"] >= 1
    # Server lanes, measured there, each with its age.
    stats = [e for e in events if e["type"] == "stats" and e["server"]]
    assert stats and all(e["server"]["profile"] == "first-token" for e in stats)
    assert all(e["measured_by"]["running"] == "server" and e["measured_by"]["ttft"] == "client" for e in stats)
    assert max(e["server"]["gauges"]["running"] for e in stats) == 2          # its two slots full...
    assert max(e["server"]["gauges"]["waiting"] for e in stats) >= 1          # ...and the rest queued there
    assert all(e["running"] == e["server"]["gauges"]["running"] for e in stats)
    assert all(0 <= e["server"]["gauges"]["kv_usage"] <= 1 for e in stats)
    assert all(e["server"]["gauges"][k] is None for e in stats for k in ("spec_accept_rate", "batch_size"))
    assert all(0 <= e["server"]["age_s"] < 3 and e["server"]["every_s"] == 0.5 for e in stats)
    periods = [e["server"]["period_s"] for e in stats if e["server"]["period_s"] is not None]
    assert periods and all(0.4 < p < 5 for p in periods)
    assert max(e["server"]["rates"]["generated_tokens_per_s"] or 0 for e in stats) > 0
    assert max(e["server"]["rates"]["prompt_tokens_per_s"] or 0 for e in stats) > 0
    assert all(e["server"]["slots"] is None for e in stats)    # slots are llama.cpp's


NAMES = ("Ada", "Grace")


def test_a_classroom_on_an_observed_server_with_an_api_key(tiny):
    """`--classroom --observe URL`: two students' prompts go to the observed server, labelled on
    the observer's timeline, each answer streams back to its student, the limits are enforced
    here. The observed server is a First Token in classroom mode, so its API needs its key as a
    bearer token: the observer sends it, and it appears in nothing a page or student receives."""
    from server.classroom import Classroom
    upstream = Classroom()                       # the observed server's own key
    observed = tiny_server(tiny, classroom=upstream)
    key = upstream.key
    room = Classroom(join_code="owl", rate_burst=1, rate_every_s=60)
    obs = observing(observed.url, api_key=key, classroom=room)
    room.base = obs.url
    seen = obs.observer.events.subscribe(replay=False)
    try:
        presenter = Client.connect(obs.ws_url, headers={"Cookie": f"ft_presenter={room.key}"})
        viewer = Client.connect(obs.ws_url)
        hellos = [json.loads(c.receive(timeout=10))[0] for c in (presenter, viewer)]
        assert [h["role"] for h in hellos] == ["presenter", "viewer"] and hellos[0]["mode"] == "observe"
        sessions = {}
        for name in NAMES:
            sessions[name] = requests.Session()
            r = sessions[name].post(obs.url + "/join/session", json={"name": name, "code": "owl"}, timeout=10)
            assert r.status_code == 200, r.text
        answers = {}

        def ask(name):
            with sessions[name].post(obs.url + "/join/ask", json={"prompt": f"{name} asks: what is a token?"},
                                     stream=True, timeout=60) as r:
                answers[name] = (r.status_code, [json.loads(line[6:]) for line in r.iter_lines(decode_unicode=True)
                                                 if line.startswith("data: ")])
        import threading
        threads = [threading.Thread(target=ask, args=(name,)) for name in NAMES]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        # The limit is enforced here, before anything is sent: Ada's second prompt is refused.
        again = sessions["Ada"].post(obs.url + "/join/ask", json={"prompt": "again"}, timeout=10)
        page_frames = frames(presenter, 2) + frames(viewer, 1)
        health = requests.get(obs.url + "/healthz").json()
        clients = requests.get(obs.url + "/classroom/clients", cookies={"ft_presenter": room.key}).json()
        events = []
        while True:
            batch = seen.get(timeout=0.2)
            if not batch:
                break
            events += batch
    finally:
        obs.observer.events.unsubscribe(seen)
        for c in (presenter, viewer):
            c.close()
        obs.observer.shutdown()
        obs.stop()
        observed.stop()
    assert again.status_code == 429
    for name in NAMES:
        status, sse = answers[name]
        assert status == 200 and sse[0]["type"] == "start" and sse[0]["name"] == name, sse
        assert sse[-1]["type"] == "finished" and sse[-1]["reason"] in ("length", "stop"), sse
        assert sse[-1]["measured_by"] == "client"       # timed here, as a client of the observed server
        assert any(e["type"] == "token" for e in sse)
        (req,) = [e for e in events if e["type"] == "request" and e["label"] == name]
        assert req["source"] == "join" and req["preview"].startswith(name)
        (fin,) = [e for e in events if e["type"] == "finished" and e["id"] == req["id"]]
        assert fin["client_side"] and fin["output_tokens"] >= 1
        # The student's stream carries the same text the timeline shows for that request.
        assert "".join(e["text"] for e in sse if e["type"] == "token") == \
            "".join(e["text"] for e in events if e["type"] == "token" and e["id"] == req["id"])
    assert sorted(c["name"] for c in clients["clients"]) == sorted(NAMES)
    # The observed server's key went out with the requests (its /v1 refuses without it) but
    # back to nobody: not in hellos, events, the pages' frames, /healthz, the class list, answers.
    blob = json.dumps([hellos, events, page_frames, health, clients, answers])
    assert key not in blob


def test_the_observed_servers_key_comes_from_the_environment_and_is_never_printed(tiny):
    """`app.py --observe URL` with FIRST_TOKEN_OBSERVE_API_KEY: the key is sent (the observed
    First Token is in classroom mode, so a request without it is refused 403), never printed."""
    from bench.launch import App
    from helpers import ARTIFACTS
    from server.classroom import Classroom
    upstream = Classroom()
    observed = tiny_server(tiny, classroom=upstream)
    apps = {}
    try:
        for label, env in (("with", {"FIRST_TOKEN_OBSERVE_API_KEY": upstream.key}), ("without", {})):
            ARTIFACTS.mkdir(exist_ok=True)
            log = ARTIFACTS / f"observe-key-{label}.log"
            app = App("--observe", observed.url + "/v1", log=log, env=env)
            conn = Client.connect(app.ws_url)
            try:
                conn.send(json.dumps({"type": "submit", "prompt": "What is a token?", "max_new_tokens": 4}))
                events = frames(conn, 60, until=lambda ev: any(e["type"] in ("finished", "rejected") for e in ev))
                health = requests.get(app.url + "/healthz").text
            finally:
                conn.close()
                app.stop()
            apps[label] = (events, health, log.read_text())
    finally:
        observed.stop()
    events, health, output = apps["with"]
    assert any(e["type"] == "finished" and e["reason"] in ("length", "stop") for e in events), events[-3:]
    assert upstream.key not in json.dumps(events) + health + output
    events, _, _ = apps["without"]
    assert any(e["type"] == "rejected" and e["code"] == "http_403" for e in events)


def test_clear_queue_cancels_what_has_had_no_chunk_yet():
    """Observe mode's `clear_queue` (the classroom presenter's button): the requests that have
    had no streamed chunk yet, all a client can tell of the server's queue, are cancelled."""
    import threading
    from helpers import loopback_http
    from observe import Observer
    release = threading.Event()

    def models(handler):
        return 200, b'{"data": [{"id": "fake-model"}]}'

    arrived = []

    def slow(handler):               # a server whose queue holds every request until released
        handler.rfile.read(int(handler.headers["Content-Length"]))
        arrived.append(handler.path)
        release.wait(20)
        return 200, b'data: {"choices": [{"delta": {"content": "late"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    httpd = loopback_http(models, slow)
    obs = Observer(httpd.url + "/v1").start()
    sub = obs.events.subscribe(replay=False)
    try:
        wait_until(lambda: obs.watch.reachable, 30, "the server's /v1/models answered")
        ids = [obs.submit(GenerateRequest(prompt=f"q{i}", source="page", chat=True)).id for i in range(3)]
        wait_until(lambda: len(arrived) == 3, 30, "the three requests waiting on the server")
        obs.clear_queue()
        # cancelled, not answered: the server would let them go (20 s on) with a `stop`
        events = collect(sub, lambda evs: sum(e["type"] == "finished" for e in evs) >= 3)
        ended = {e["id"]: e["reason"] for e in events if e["type"] == "finished"}
        assert ended == {rid: "cancelled" for rid in ids}
    finally:
        release.set()
        obs.events.unsubscribe(sub)
        obs.shutdown()
        httpd.shutdown()


def test_an_observer_asks_for_logprobs_while_a_page_shows_candidates(tiny):
    """Observing First Token on the tiny model: while no page shows candidates the observer asks
    for none (its token events have no odds); once a page sends `view`, its load (completions)
    and page prompts (chat) ask for 5, and each one-token chunk's event carries the server's
    log-probabilities as probabilities, the same as the server's own token events (p_raw,
    and the candidates' texts), ids and the transformed p unknown (null)."""
    observed = tiny_server(tiny)
    obs = observing(observed.url)
    conn = Client.connect(obs.ws_url)
    server_sub = observed.driver.events.subscribe(replay=False)
    try:
        json.loads(conn.receive(timeout=10))
        done = lambda k: lambda evs: sum(e["type"] == "finished" for e in evs) >= k   # noqa: E731
        conn.send(json.dumps({"type": "set", "settings": {"max_new_tokens": 6, "temperature": 0}}))
        conn.send(json.dumps({"type": "burst", "n": 1}))
        before = frames(conn, 60, until=done(1))
        conn.send(json.dumps({"type": "view", "candidates": True}))
        wait_until(obs.observer.events.candidates_shown, 10, "the page's view")
        conn.send(json.dumps({"type": "burst", "n": 1}))
        conn.send(json.dumps({"type": "submit", "prompt": "Name three colours."}))
        after = frames(conn, 60, until=done(2))
        theirs = collect(server_sub, lambda evs: sum(e["type"] == "finished" for e in evs) >= 3)
    finally:
        stop_all(conn, obs, observed)
    check = schema_validator()
    for e in before + after:
        check.validate(e)
    assert all(e["p_raw"] is None and e["top"] is None for e in before if e["type"] == "token")
    mine = [e for e in after if e["type"] == "token"]
    server = [e for e in theirs if e["type"] == "token"]
    assert len({e["id"] for e in mine}) == 2 and all(e["p"] is None and 0 < e["p_raw"] <= 1 for e in mine)
    one = [e for e in mine if e["top"] is not None]     # a chunk of several tokens has no candidates
    assert len(one) >= len(mine) - 2
    for e in one:
        assert e["token_id"] is None and 1 <= len(e["top"]) <= 5    # completions key them by text: a clash is one
        assert all(c[0] is None and c[2] is None and 0 < c[3] <= 1 for c in e["top"])
    mine = one
    by_text = {}
    for e in server:
        by_text.setdefault(e["text"], []).append(e)
    for e in mine:
        same = [s for s in by_text.get(e["text"], []) if abs(s["p_raw"] - e["p_raw"]) < 1.1e-3]
        # chat's candidates are the server's; completions' are keyed by text (a clash keeps one)
        assert same and {c[1] for c in e["top"]} <= {c[1] for c in same[0]["top"]} | {same[0]["text"]}
