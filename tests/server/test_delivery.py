"""The other suspects on the way out (server/delivery.py): a buffering proxy and an injected
network delay. The engine's own times must not change while what a client receives does: checked
on the delivery line itself, through a real streaming API client and a real websocket page."""
import json
import time
import urllib.request

from simple_websocket import Client

from engine.settings import Live, defaults, make_settings
from helpers import collect, wait_until
from server.delivery import Delivery

SPECS = make_settings(max_slots=1, cache_tokens_max=16, block_size=16, max_context=64)


def line(**settings):
    """A delivery line over settings that are the defaults with `settings` changed."""
    return Delivery(Live(defaults(SPECS).replace(settings)))


def test_latency_delays_every_piece_and_jitter_never_reorders():
    d = line(net_latency_ms=100)
    d.push(["a"], 0.0, [1])
    assert d.take(0.099) == [] and d.take(0.1) == ["a"] and d.wait_s(0.1) is None
    d = line(net_latency_ms=50, net_jitter_ms=200)
    for i in range(50):
        d.push([i], i * 0.001, [1])
    got = d.take(10.0)
    assert got == list(range(50))                    # in order, whatever each one's jitter


def test_a_line_follows_each_new_settings_value_its_backend_holds():
    settings = Live(defaults(SPECS))
    d = Delivery(settings)
    d.push(["a"], 0.0, [1])
    assert d.take(0.0) == ["a"] and not d.active()                # nothing between yet
    settings.now = settings.now.replace({"net_latency_ms": 100})   # as the engine replaces it
    d.push(["b"], 1.0, [1])
    assert d.active() and d.take(1.05) == [] and d.take(1.1) == ["b"]


def test_the_proxy_holds_until_its_interval_its_size_or_the_end():
    d = line(buffer_ms=100)
    for t in (0.0, 0.03, 0.06):
        d.push([t], t, [5])
    assert d.take(0.09) == [] and d.wait_s(0.09) == 0.01000000000000001 or abs(d.wait_s(0.09) - 0.01) < 1e-9
    assert d.take(0.1) == [0.0, 0.03, 0.06]          # all at once, at the flush
    d = line(buffer_bytes=10)
    d.push(["x"], 0.0, [6])
    assert d.take(1.0) == []                          # 6 of 10 bytes: held (no interval set)
    d.push(["y"], 1.0, [6])
    assert d.take(1.0) == ["x", "y"]
    d.push(["z"], 2.0, [1], end=True)                 # the response ended: let go
    assert d.take(2.0) == ["z"]


def set_and_wait(live, changes):
    """Change settings and wait until the engine thread has applied them (a streaming request
    reads them when it starts)."""
    live.driver.update_settings(changes)
    wait_until(lambda: all(live.driver.settings.now.wire()[k] == v for k, v in changes.items()), 30, f"settings {changes}")


def slow_forwards(live, seconds=0.01):
    """Each forward of the tiny model takes `seconds` more, so tokens come at a steady known pace."""
    forward = live.driver.engine.runner.forward
    live.driver.engine.runner.forward = lambda segments: (time.sleep(seconds), forward(segments))[1]


def stream_chunks(url, max_tokens, clock=time.monotonic):
    """(send time, arrival time of each content chunk) of one streaming completion, on `clock`."""
    body = {"model": "tiny-random-llama", "prompt": "We hold these truths", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    sent, arrivals = clock(), []
    with urllib.request.urlopen(req, timeout=60) as resp:
        for raw in resp:
            if raw.startswith(b"data: {") and json.loads(raw[6:])["choices"][0]["text"]:
                arrivals.append(clock())
    return sent, arrivals


def engine_tokens(sub, timeout=30):
    events = collect(sub, lambda evs: any(e["type"] == "finished" for e in evs), timeout)
    return [e for e in events if e["type"] == "token"], next(e for e in events if e["type"] == "finished")


def clumps(arrivals, apart=0.1):
    """Indices of the chunks that start a clump: arrived more than `apart` s after the one before."""
    return [0] + [i for i in range(1, len(arrivals)) if arrivals[i] - arrivals[i - 1] > apart]


def test_a_buffering_proxy_clumps_what_the_client_receives_while_the_engine_stays_steady(live):
    """A flush every second: the client's chunks come in clumps, each (but the one the response's
    end lets go) a second or more after the engine made its first token, at most one a second of
    the engine's time; judged on the engine's clock (the client's arrivals read from it too), so
    a slower machine only makes fewer, bigger clumps."""
    slow_forwards(live, 0.02)   # 80 tokens span 1.6 s of engine time at least: a flush before the end
    set_and_wait(live, {"buffer_ms": 1000})
    sub = live.driver.events.subscribe(replay=False)
    sent, arrivals = stream_chunks(live.url, 80, clock=live.driver.clock.now)
    tokens, _ = engine_tokens(sub)
    t = [e["t"] for e in tokens]
    assert len(t) == 80
    chunk = [k for k, e in enumerate(tokens) if e["text"]]   # the token of each chunk (one with text)
    assert len(chunk) == len(arrivals)
    assert all(a >= t[k] for a, k in zip(arrivals, chunk))            # never before the engine made it
    starts = clumps(arrivals)
    span = t[-1] - t[0]
    assert 2 <= len(starts) <= span / 1.0 + 2, (starts, span)         # a few clumps, not 80 arrivals
    # Each clump but the last (let go by the response's end) was held a second from the first
    # token the proxy took after the clump before: one made after that clump's last chunk's token.
    for i in starts[:-1]:
        first_held = 0 if i == 0 else chunk[i - 1] + 1
        assert arrivals[i] - t[first_held] >= 1.0, (i, arrivals[i] - t[first_held])


def test_injected_latency_lengthens_the_clients_ttft_but_not_the_engines(live):
    set_and_wait(live, {"net_latency_ms": 400})
    sub = live.driver.events.subscribe(replay=False)
    sent, arrivals = stream_chunks(live.url, 4)
    _, fin = engine_tokens(sub)
    # The client's wait holds the engine's whole TTFT and the 400 ms on top: the engine's stages
    # know nothing of the network (had they counted it, the client's would be the smaller).
    assert arrivals[0] - sent >= 0.4 + fin["ttft"]


def test_a_page_receives_events_late_by_the_injected_latency(live):
    conn = Client.connect(live.ws_url)
    try:
        conn.receive(timeout=5)                       # hello (and history) at once
        set_and_wait(live, {"net_latency_ms": 500})
        asked = time.monotonic()
        conn.send(json.dumps({"type": "submit", "prompt": "Liberty", "max_new_tokens": 2}))
        first = None
        while first is None and time.monotonic() - asked < 10:
            raw = conn.receive(timeout=0.2)
            if raw and any(e["type"] == "token" for e in json.loads(raw)):
                first = time.monotonic()
        assert first is not None and first - asked >= 0.5
    finally:
        conn.close()
