"""Reliability and security (issue 13), on the tiny random model: origins, the bounded inbox and
429, the API deadline, disconnects, a fault in one request, a budget lowered under waiting
requests, the server beyond loopback (gunicorn), what is logged, and the CLI flags."""
import json
import logging
import socket
import threading
import time

import pytest
import requests
from simple_websocket import Client, ConnectionError as WsRefused

from bench.launch import App, free_port
from engine import Engine, EngineConfig, SettingError
from engine import events as ev
from engine.core.request import GenerateRequest
from helpers import ARTIFACTS, Served, collect, csp, engine_driver, flag_error, frames, idle, wait_until

CHAT = [{"role": "user", "content": "We hold these truths"}]


# ------------------------------------------------------------------ helpers
def slow_forwards(monkeypatch, driver, seconds=0.02):
    """Each forward takes `seconds` longer, so a request is still generating when a test acts."""
    forward = driver.engine.runner.forward

    def slowed(*args, **kw):
        time.sleep(seconds)
        return forward(*args, **kw)
    monkeypatch.setattr(driver.engine.runner, "forward", slowed)


def body(model, **kw):
    return {"model": model, "messages": CHAT, "max_tokens": 400, "ignore_eos": True, **kw}


def raw_request(url, method, path, headers=None, payload=None):
    """A request sent on a bare socket (not read), so a test can close it whenever it likes."""
    host, port = url.split("//")[1].split(":")
    data = json.dumps(payload).encode() if payload is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(data)}",
            "Content-Type: application/json"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    return sock


def first_api_token(sub, timeout=30):
    """Id of the first API request that has produced a token (events from `sub`)."""
    events = collect(sub, lambda evs: any(e["type"] == "token" and e["first"] for e in evs), timeout)
    return next(e["id"] for e in events if e["type"] == "token" and e["first"])


# ------------------------------------------------------------------ origins
def ws_handshake(url, origin):
    """The server's answer to a websocket handshake from a browser page at `origin`: its head,
    and its body when it refuses (it closes the connection after a refusal)."""
    sock = raw_request(url, "GET", "/ws", {
        "Origin": origin, "Upgrade": "websocket", "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13"})
    reply = b""
    while not (reply.startswith(b"HTTP/1.1 101") and b"\r\n\r\n" in reply):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    sock.close()
    return reply.decode("utf-8", "replace")   # after a 101, the first websocket frame's bytes follow


def test_cross_origin_websocket_is_refused_before_it_can_send(live):
    subscribers = live.driver.events.subscribers
    # null: sandboxed frames, file://; https on this http server's host and port: another origin
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1", live.url.replace("http:", "https:")):
        reply = ws_handshake(live.url, origin)
        assert reply.startswith("HTTP/1.1 403") and "origin_not_allowed" in reply, origin
    assert live.driver.events.subscribers == subscribers          # never upgraded, never subscribed
    assert ws_handshake(live.url, live.url).startswith("HTTP/1.1 101")   # the app's own page
    conn = Client.connect(live.ws_url)                            # no Origin: not a browser page
    assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
    conn.close()


def test_cross_origin_post_is_refused_with_an_openai_error(live):
    url = live.url + "/v1/chat/completions"
    payload = body(live.driver.api_model, max_tokens=2)
    sub = live.driver.events.subscribe(replay=False)
    for origin in ("http://evil.example", "null", live.url.replace("127.0.0.1", "localhost"), "http://127.0.0.1:1",
                   live.url.replace("http:", "https:")):
        r = requests.post(url, json=payload, headers={"Origin": origin})
        assert r.status_code == 403, origin
        err = r.json()["error"]
        assert err["code"] == "origin_not_allowed" and err["type"] == "invalid_request_error" and origin in err["message"]
    allowed = requests.post(url, json=payload)                                         # curl, openai client
    assert allowed.status_code == 200
    # Nothing refused reached the engine: the allowed request, sent after them, is its first.
    rid = allowed.json()["id"].removeprefix("chatcmpl-")
    events = collect(sub, lambda evs: any(e["type"] == "request" and e["id"] == rid for e in evs))
    assert [e["id"] for e in events if e["type"] == "request"] == [rid]
    assert requests.post(url, json=payload, headers={"Origin": live.url}).status_code == 200   # own page
    assert requests.get(live.url + "/healthz", headers={"Origin": "http://evil.example"}).status_code == 200


def test_allow_list_and_framing(live):
    """An allowed origin may use the websocket and the API; the page itself is framed only by
    its own origin, /embed by any (tests/test_replay_embed.py: --frame-ancestors narrows it)."""
    from server import create_app
    served = Served(create_app({"ALLOWED_ORIGINS": ["https://Course.Example.org:443/"]}, backend=live.driver))
    url = served.url
    try:
        ok = {"Origin": "https://course.example.org"}
        assert requests.post(url + "/v1/completions", json={"model": live.driver.api_model, "prompt": "Hi",
                                                            "max_tokens": 1}, headers=ok).status_code == 200
        conn = Client.connect(url.replace("http", "ws") + "/ws", headers=ok)
        assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
        conn.close()
        assert requests.post(url + "/v1/completions", json={}, headers={"Origin": "http://course.example.org"}
                             ).status_code == 403   # another scheme is another origin
        page, embed = requests.get(url + "/"), requests.get(url + "/embed")
        assert csp(page)["frame-ancestors"] == "'self'"
        assert page.headers["X-Frame-Options"] == "SAMEORIGIN"
        assert csp(embed)["frame-ancestors"] == "* file:"
        assert "X-Frame-Options" not in embed.headers
    finally:
        served.stop()


# ------------------------------------------------------------------ overload
def test_a_full_inbox_refuses_at_once_and_never_blocks(tiny):
    from concurrent.futures import ThreadPoolExecutor
    d = engine_driver(tiny, slots=2, kv_tokens=1024, max_context=256, start=False, inbox=3)
    sub = d.events.subscribe(replay=False)
    handles = [d.submit(GenerateRequest(prompt="Liberty", max_new_tokens=2, stream=True)) for _ in range(3)]

    def over_the_bound():
        late = d.submit(GenerateRequest(prompt="Liberty", max_new_tokens=2, stream=True))
        refused = late.next(timeout=0)   # at once, in this thread
        assert isinstance(refused, ev.Rejected) and refused.code == "queue_full" and late.ended
        with pytest.raises(SettingError) as e:
            d.update_settings({"rate": 2.0})
        assert "busy" in e.value.message
        d.cancel(handles[0].id)    # what frees capacity always goes in
        d.reset()
    # Not started, the engine never drains the inbox: a put that blocked would never return. The
    # calls run in a thread of their own, so a hang fails here (a liveness bound, not a speed).
    with ThreadPoolExecutor(1) as pool:
        pool.submit(over_the_bound).result(timeout=30)
    assert d._inbox.qsize() == 5
    assert [(x["type"], x["code"]) for x in sub.get(timeout=0)] == [("rejected", "queue_full")]
    d.start()
    try:
        wait_until(lambda: idle(d), 10, "the queued commands ran")
    finally:
        d.shutdown()


def test_queue_full_is_429(live):
    url, model = live.url + "/v1/chat/completions", live.driver.api_model
    live.driver.engine.scheduler.max_waiting = 0        # the engine's waiting queue is full
    r = requests.post(url, json=body(model, max_tokens=2))
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and r.headers["Retry-After"] == "1"
    live.driver.engine.scheduler.max_waiting = 512
    live.driver.inbox_max = 0                           # the inbox in front of it is full
    r = requests.post(url, json=body(model, max_tokens=2, stream=True))
    assert r.status_code == 429 and "inbox is full" in r.json()["error"]["message"]
    live.driver.inbox_max = 8
    assert requests.post(url, json=body(model, max_tokens=2)).status_code == 200


def test_overload_is_refused_with_429_and_stays_bounded_and_responsive(live, monkeypatch):
    """Arrivals far beyond capacity (4 slots; every forward slowed to ~10 ms) from 24 client
    threads until 600 have come (and a probe was answered while requests waited): the waiting
    queue never passes its bound, the rest get 429, memory stays flat, and /healthz keeps
    answering while the engine is saturated."""
    import psutil
    driver, bound, arrivals = live.driver, 8, 600
    driver.engine.scheduler.max_waiting = bound
    slow_forwards(monkeypatch, driver, 0.01)
    proc = psutil.Process()
    url, payload = live.url + "/v1/completions", {"model": driver.api_model, "prompt": "Liberty",
                                                  "max_tokens": 16, "ignore_eos": True}
    statuses, health_ms, health_waiting = [], [], []
    peaks = {"waiting": 0, "inbox": 0, "rss": proc.memory_info().rss}
    rss0, stop, stepped = peaks["rss"], threading.Event(), threading.Event()
    step, put = driver.engine.step, driver._put

    def watched():
        """Each engine step: the peaks read where they change (the queue once the inbox was
        drained into it), and a probe may go (it paces itself on the engine's steps)."""
        peaks["waiting"] = max(peaks["waiting"], len(driver.engine.scheduler.waiting))
        peaks["rss"] = max(peaks["rss"], proc.memory_info().rss)
        stepped.set()
        return step()

    def counted(command):   # the inbox's peak: read at each command put in
        queued = put(command)
        peaks["inbox"] = max(peaks["inbox"], driver._inbox.qsize())
        return queued
    monkeypatch.setattr(driver.engine, "step", watched)
    monkeypatch.setattr(driver, "_put", counted)

    def client():
        with requests.Session() as s:
            while not stop.is_set():
                r = s.post(url, json=payload)
                statuses.append((r.status_code, r.json().get("error", {}).get("code")))

    def probe():
        with requests.Session() as s:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = s.get(live.url + "/healthz", timeout=30)   # liveness only: a hung probe fails here
                assert r.status_code == 200
                health_ms.append((time.perf_counter() - t0) * 1000)
                health_waiting.append(r.json()["waiting"])
                stepped.clear()
                if not stop.is_set():
                    stepped.wait()   # the next probe after the engine's next step (idle turns step too)

    threads = [threading.Thread(target=f) for f in [client] * 24 + [probe]]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    wait_until(lambda: len(statuses) >= arrivals and any(health_waiting), 120, "the overload's arrivals")
    stop.set()
    seconds = time.perf_counter() - t0   # what the printed rate is per second of (not judged)
    stepped.set()
    for t in threads:
        t.join(30)
    ok = sum(1 for s, _ in statuses if s == 200)
    refused = [c for s, c in statuses if s == 429]
    health_ms.sort()
    figures = {"arrivals_per_s": round(len(statuses) / seconds, 1), "queue_bound": bound,
               "peak_waiting": peaks["waiting"], "peak_inbox": peaks["inbox"], "served": ok,
               "rejected_429": len(refused), "rss_start_mb": round(rss0 / 2**20),
               "rss_peak_mb": round(peaks["rss"] / 2**20),
               "healthz_ms_p50": round(health_ms[len(health_ms) // 2], 1), "healthz_ms_max": round(health_ms[-1], 1)}
    print("\noverload:", json.dumps(figures))
    assert ok + len(refused) == len(statuses) and ok > 0 and len(refused) > ok   # far beyond capacity
    assert set(refused) == {"queue_full"}
    assert peaks["waiting"] <= bound
    assert peaks["rss"] - rss0 < 200 * 2**20
    # Not starved: probes were answered while requests queued in the engine, not after the queue
    # drained (how fast each came is this machine's business: printed above, not judged).
    assert any(health_waiting)
    wait_until(lambda: idle(driver), 30, "the overload drained")


# ------------------------------------------------------------------ deadline, disconnects
def test_the_deadline_cancels_and_answers_504_or_an_error_chunk(live, monkeypatch):
    slow_forwards(monkeypatch, live.driver)
    live.app.config["REQUEST_TIMEOUT"] = 1.0
    url = live.url + "/v1/chat/completions"
    # The slowed request would take seconds more than its 1 s deadline: a 504 says the deadline cut it.
    r = requests.post(url, json=body(live.driver.api_model))
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert "1 s" in r.json()["error"]["message"]
    wait_until(lambda: idle(live.driver), 30, "the timed-out request was cancelled")

    r = requests.post(url, json=body(live.driver.api_model, stream=True), stream=True)
    assert r.status_code == 200
    lines = [x for x in r.iter_lines() if x.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]" and json.loads(lines[-2][6:])["error"]["code"] == "timeout"
    wait_until(lambda: idle(live.driver), 30, "the timed-out stream was cancelled")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_client_that_disconnects_mid_generation_frees_its_slot_and_blocks(live, monkeypatch, stream):
    slow_forwards(monkeypatch, live.driver)
    sub = live.driver.events.subscribe(replay=False)
    sock = raw_request(live.url, "POST", "/v1/chat/completions", payload=body(live.driver.api_model, stream=stream))
    rid = first_api_token(sub)
    assert live.driver.engine.blocks.used > 0
    sock.close()
    wait_until(lambda: idle(live.driver), 30, "slot and blocks freed after the disconnect")
    # cancelled, not run to its length: the disconnect freed it, however long that took here
    fin = [e for e in sub.get(timeout=1) if e["type"] == "finished" and e["id"] == rid]
    assert fin and fin[0]["reason"] == "cancelled" and fin[0]["output_tokens"] < 400


def test_a_client_that_leaves_while_queued_never_runs(live, monkeypatch):
    """One slot, held by a long request: a second (non-streaming) client waits in the queue and
    leaves; its request is cancelled before it is ever admitted."""
    slow_forwards(monkeypatch, live.driver)
    live.driver.update_settings({"slots": 1})
    sub = live.driver.events.subscribe(replay=False)
    holder = raw_request(live.url, "POST", "/v1/chat/completions", payload=body(live.driver.api_model))
    first_api_token(sub)
    queued = raw_request(live.url, "POST", "/v1/chat/completions", payload=body(live.driver.api_model))
    wait_until(lambda: len(live.driver.engine.scheduler.waiting) == 1, 30, "the second request queued")
    queued.close()
    wait_until(lambda: not live.driver.engine.scheduler.waiting, 30, "the queued request cancelled")
    holder.close()
    wait_until(lambda: idle(live.driver), 30, "everything freed")
    later = sub.get(timeout=0)   # everything after the holder's first token
    queued_id = next(e["id"] for e in later if e["type"] == "request")
    assert not [e for e in later if e["type"] == "admitted"]
    assert [(e["reason"], e["output_tokens"]) for e in later
            if e["type"] == "finished" and e["id"] == queued_id] == [("cancelled", 0)]


# ------------------------------------------------------------------ one request's fault
def test_a_sampling_fault_fails_only_its_request(tiny, monkeypatch):
    """A sampling error in one request's row (injected: seed 666 raises) ends that request with
    `error`; the others in the same batch keep their tokens, equal to a run without it."""
    from engine.model import sampler
    batch = sampler._sample_batch

    def faulty(logits, params_list, generators, *odds):
        if any(p.seed == 666 for p in params_list):
            raise RuntimeError("injected sampling fault")
        return batch(logits, params_list, generators, *odds)

    def run(with_bad):
        eng = Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, max_context=512))
        seqs = [eng.new_sequence(GenerateRequest(prompt=p, max_new_tokens=8, ignore_eos=True, temperature=t, seed=s))
                for p, t, s in (("We hold these truths", 0.0, None), ("Liberty", 1.0, 7),
                                ("He has refused", 0.0, 666 if with_bad else 1))]
        out = []
        for seq in seqs:
            out += eng.add(seq)
        while eng.scheduler.running or eng.scheduler.waiting:
            out += eng.step()
        assert eng.blocks.used == 0 and eng.in_flight == 0
        return seqs, out

    monkeypatch.setattr(sampler, "_sample_batch", faulty)
    seqs, events = run(True)
    monkeypatch.setattr(sampler, "_sample_batch", batch)
    ref_seqs, _ = run(False)
    fin = {e.id: e for e in events if isinstance(e, ev.Finished)}
    good, bad = seqs[:2], seqs[2]
    assert fin[bad.id].reason == "error" and "injected sampling fault" in fin[bad.id].error
    assert [fin[s.id].reason for s in good] == ["length", "length"]
    assert [s.output_ids for s in good] == [s.output_ids for s in ref_seqs[:2]]   # the seeded row too
    errors = [e for e in events if isinstance(e, ev.Error)]
    assert errors and all(bad.id in e.message and not any(s.id in e.message for s in good) for e in errors)


# ------------------------------------------------------------------ the budget lowered under the queue
def test_a_lowered_budget_refuses_what_no_longer_fits_and_the_queue_moves_on(live, monkeypatch):
    """Issue 13's stuck queue: one slot busy, a big request waiting (its API client blocked on it)
    and a small one behind it. The cache slider goes down to 16 tokens: the big one is refused
    with a reason (its client gets a clear 400 at once), and the small one behind it runs."""
    slow_forwards(monkeypatch, live.driver, 0.01)
    d = live.driver
    d.update_settings({"slots": 1})
    sub = d.events.subscribe(replay=False)
    holder = d.submit(GenerateRequest(prompt="Liberty", max_new_tokens=60, ignore_eos=True, stream=True))
    assert isinstance(holder.next(timeout=30), ev.Token)
    big = {}
    client = threading.Thread(target=lambda: big.update(r=requests.post(
        live.url + "/v1/completions", json={"model": d.api_model, "prompt": "We hold these truths", "max_tokens": 200})))
    client.start()
    wait_until(lambda: len(d.engine.scheduler.waiting) == 1, 30, "the big request waits")
    small = d.submit(GenerateRequest(prompt="Hi", max_new_tokens=2, ignore_eos=True, stream=True))
    d.update_settings({"cache_tokens": 16})
    client.join(10)
    assert big["r"].status_code == 400
    assert "budget" in big["r"].json()["error"]["message"]
    assert list(small.events(timeout=10))[-1].reason == "length"
    assert isinstance(list(holder.events(timeout=10))[-1], ev.Finished)
    rejected = [e for e in sub.get(timeout=0) if e["type"] == "rejected"]
    assert [e["code"] for e in rejected] == ["exceeds_cache"] and "16" in rejected[0]["reason"]
    wait_until(lambda: idle(d), 5, "idle")


# ------------------------------------------------------------------ beyond loopback: gunicorn
def test_beyond_loopback_it_serves_on_gunicorn_with_websockets(live):
    """Beyond loopback (here: `--server gunicorn` on loopback, as tests bind) app.py runs on gunicorn
    (one worker, threads, server/serving.py's worker). In observe mode (watching
    the in-process app) it starts in a second; a page prompt travels websocket -> gunicorn app
    -> the observed API. Connections stay on loopback; the prompt is not in its log."""
    port = free_port()
    log = ARTIFACTS / f"server-{port}.log"
    ARTIFACTS.mkdir(exist_ok=True)
    app = App("--server", "gunicorn", "--observe", live.url + "/v1", port=port, log=log, timeout=60)
    secret = "my secret prompt 4321"
    try:
        r = requests.get(app.url + "/healthz")
        assert r.headers["Server"].startswith("gunicorn") and r.json()["mode"] == "observe"
        conn = Client.connect(app.ws_url)
        try:
            assert json.loads(conn.receive(timeout=10))[0]["type"] == "hello"
            conn.send(json.dumps({"type": "submit", "prompt": secret, "max_new_tokens": 3}))
            evs = frames(conn, 30, until=lambda es: any(e["type"] == "finished" for e in es))
            assert any(e["type"] == "finished" and e["reason"] in ("stop", "length") for e in evs)
        finally:
            conn.close()
        with pytest.raises(WsRefused):
            Client.connect(app.ws_url, headers={"Origin": "http://evil.example"})
    finally:
        app.stop()
    text = log.read_text()
    assert "server.serving.GuardedWorker" in text and secret not in text


def test_access_log_names_the_route_not_the_body(live, caplog):
    caplog.set_level(logging.INFO, logger="werkzeug")
    secret = "my other secret prompt 8765"
    requests.post(live.url + "/v1/completions", json={"model": live.driver.api_model, "prompt": secret, "max_tokens": 1})
    wait_until(lambda: "POST /v1/completions" in caplog.text, 30, "the access log line")   # written after the answer
    assert secret not in caplog.text


# ------------------------------------------------------------------ flags
def test_limit_flags_are_validated(capsys):
    from app import parser
    helptext = parser().format_help()
    assert "--allow-origin" in helptext and "--request-timeout" in helptext
    for args, needle in [(("--allow-origin", "evil.example"), "is not an origin"),
                         (("--allow-origin", "https://x.org/path"), "is not an origin"),
                         (("--request-timeout", "0"), "--request-timeout must be a positive number"),
                         (("--request-timeout", "nan"), "--request-timeout must be a positive number")]:
        code, err = flag_error(capsys, *args)
        assert code == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("bind", ["127.0.0.3", "127.0.0.2", "127.255.255.254", "::1", "localhost"])
def test_every_loopback_address_is_guarded_against_dns_rebinding(live, bind):
    """Bound to any loopback address (not only the three usual strings), a rebound name is
    refused: the API and the websocket from its origin; --allow-host is honoured there; the
    address itself and other loopback names answer; a classroom there prints no warning that
    the network can reach it."""
    from app import allowed_hosts, classroom_banner, parse_args
    from server import create_app
    from server.classroom import Classroom
    args = parse_args(["--host", bind, "--port", "5123", "--allow-host", "proxy.example.org"])
    hosts = allowed_hosts(args)
    assert hosts is not None
    app = create_app({"ALLOWED_HOSTS": hosts}, backend=live.driver).test_client()
    evil = "evil.example:5123"
    r = app.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                 headers={"Host": evil, "Origin": f"http://{evil}"})
    assert r.status_code == 403 and r.json["error"]["code"] == "host_not_allowed"
    r = app.get("/ws", headers={"Host": evil, "Origin": f"http://{evil}", "Upgrade": "websocket",
                                "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert r.status_code == 403 and r.json["error"]["code"] == "host_not_allowed"
    own = f"[{bind}]:5123" if ":" in bind else f"{bind}:5123"
    for host in (own, "127.0.0.3:5123", "localhost:5123", "proxy.example.org"):
        assert app.get("/healthz", headers={"Host": host}).status_code == 200, host
    room = Classroom(base=f"http://{own}")
    assert not any("WARNING" in line for line in classroom_banner(args, room))


def test_loopback_is_judged_by_address_after_resolving():
    from app import allowed_hosts, parse_args
    from server.security import is_loopback
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.3", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.1", "192.168.1.5", "no-such-host.invalid"))
    assert allowed_hosts(parse_args(["--host", "0.0.0.0"])) is None   # beyond loopback: any name


def test_every_response_says_nosniff_and_no_referrer(live):
    """X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer on pages, static files, JSON,
    errors and the API."""
    c = live.app.test_client()
    for r in (c.get("/"), c.get("/static/core/ft.css"), c.get("/healthz"), c.get("/metrics"), c.get("/v1/models"),
              c.get("/no-such-page"), c.post("/v1/completions", data="not json"), c.get("/join")):
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (r.request.path, r.status_code)
        assert r.headers.get("Referrer-Policy") == "no-referrer", (r.request.path, r.status_code)


def test_a_page_runs_only_its_own_scripts(tiny):
    """Every page's CSP: scripts from this origin, and inline only the ones it rendered with this
    response's nonce (each response a new one); no plugins, no <base>; /embed keeps its
    frame-ancestors. (tests/page/test_browser_security.py: what Chromium does with it.)"""
    import re
    from engine import EngineConfig
    from server.classroom import Classroom
    from helpers import LiveApp
    app = LiveApp(tiny, EngineConfig(slots=2, kv_tokens=1024, max_context=256), classroom=Classroom())
    try:
        c = app.app.test_client()
        nonces = set()
        for path in ("/", "/embed", "/join"):
            r = c.get(path)
            policy = csp(r)
            nonce = re.fullmatch(r"'self' 'unsafe-eval' 'nonce-([A-Za-z0-9_-]{22,})'", policy["script-src"]).group(1)
            inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", r.get_data(as_text=True))
            assert inline and all(f'nonce="{nonce}"' in attrs for attrs in inline), (path, inline)
            assert policy["object-src"] == "'none'" and policy["base-uri"] == "'none'"
            assert policy["frame-ancestors"] == ("* file:" if path == "/embed" else "'self'")
            nonces.add(nonce)
        assert len(nonces) == 3   # never reused
    finally:
        app.stop()


def test_default_bind_is_loopback():
    from app import parse_args
    assert parse_args([]).host == "127.0.0.1"


def test_on_loopback_other_host_names_are_refused_against_dns_rebinding(live):
    """A page whose name was rebound to 127.0.0.1 sends its own name as Host (and as Origin, which
    then looks same-site): with ALLOWED_HOSTS (app.py sets it on loopback binds) it gets 403."""
    from server import create_app
    hosts = ("localhost", "127.0.0.1", "::1", "Proxy.Example.org")
    guarded = create_app({"ALLOWED_HOSTS": hosts}, backend=live.driver).test_client()
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost:bad"):
        for r in (guarded.get("/healthz", headers={"Host": host}),
                  guarded.get("/", headers={"Host": host}),
                  guarded.post("/v1/completions", json={}, headers={"Host": host, "Origin": f"http://{host}"})):
            assert r.status_code == 403 and r.json["error"]["code"] == "host_not_allowed", (host, r.status_code)
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "proxy.example.org"):
        assert guarded.get("/healthz", headers={"Host": host}).status_code == 200, host
    open_app = create_app(backend=live.driver).test_client()   # bound beyond loopback: any name
    assert open_app.get("/healthz", headers={"Host": "evil.example"}).status_code == 200
