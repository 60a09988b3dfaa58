"""Observe mode's page in real Chromium: a First Token (`python app.py --observe URL`) watching
a second First Token (the in-process app on the tiny model), and a recorded trace of one
watching a real llama.cpp server (tests/data/traces/observe-llamacpp.json, written by
`python -m bench.observe_llamacpp --trace`). Everything asserted is compared with the events
the page received (`firstToken.state`), not with numbers written here."""
import json
from pathlib import Path

import pytest

from helpers import ARTIFACTS, ask_on_phone, start_app

LLAMACPP_TRACE = Path(__file__).parents[1] / "data" / "traces" / "observe-llamacpp.json"
GAUGE_NAMES = ("batch_size", "prefix_hit_rate", "spec_accept_rate", "spec_accept_length")
ENGINE_WORDS = ("measured by the server", "engine time", "engine's", "queued ", "in the queue")


@pytest.fixture
def observer(live):
    app = start_app("--observe", live.url + "/v1")
    yield app
    app.stop()


def open_page(browser, url, width=1366, height=768):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    return page


# Everything the checks read, at one moment, after every view drew from the same state.
READ = """() => {
  firstToken.refresh();
  const s = firstToken.state, L = s.last, fig = (id) => document.getElementById(id).parentElement;
  const by = (id) => { const t = fig(id).querySelector('.by'); return t && !t.hidden ? t.textContent : null; };
  return {model: document.getElementById('model').textContent, hello: s.hello,
          last: L && {running: L.running, queue: L.queue, server: L.server, measured_by: L.measured_by},
          running: document.getElementById('h-running').textContent, waiting: document.getElementById('h-waiting').textContent,
          tags: {ttft: by('h-ttft50'), itl: by('h-itl50'), tps: by('h-tps'), running: by('h-running'),
                 waiting: by('h-waiting'), in_flight: by('h-policy')},
          lanes: firstToken.layout().server.map((l) => l.id),
          strip: !document.getElementById('server-strip').hidden,
          legend: [document.getElementById('legend-observe').hidden, document.getElementById('legend-engine').hidden],
          gauges: [...document.querySelectorAll('#server-gauges .sg')].map((g) => ({name: g.dataset.name,
                     exposed: g.dataset.exposed, text: g.textContent})),
          scrape: document.getElementById('server-scrape').textContent,
          accounting: document.getElementById('d-accounting').textContent, why: document.getElementById('d-why').textContent,
          sched: document.getElementById('d-sched').textContent, title: document.getElementById('d-title').textContent};
}"""


def check_picture(v):
    """The checks every observe-mode picture passes, against the state's own events."""
    h, L = v["hello"], v["last"]
    srv = L["server"] or {}
    title, version = srv.get("title") or h["server"]["title"], srv.get("version") or h["server"]["version"]
    assert v["model"].startswith(f"observing {title}" + (f" {version}" if version else "")), v["model"]
    assert h["model"].split("/")[-1] in v["model"]
    # RUNNING and WAITING are the server's figures from the last stats event, and say so.
    assert v["running"] == str(L["running"]) and v["waiting"] == str(L["queue"]), (v["running"], v["waiting"], L)
    assert L["measured_by"]["running"] == "server" and L["measured_by"]["ttft"] == "client"
    assert "server" in v["tags"]["running"] and " s ago" in v["tags"]["running"]
    assert "server" in v["tags"]["waiting"]
    assert v["tags"]["ttft"] == v["tags"]["itl"] == v["tags"]["tps"] == v["tags"]["in_flight"] == "this client"
    if srv.get("slots"):
        assert f"of {len(srv['slots'])} slots" in v["tags"]["running"]
    # The server strip: its lanes, and every gauge it does not expose said to be so.
    assert v["strip"] and v["legend"] == [False, True]
    assert v["lanes"][:4] == ["queue", "kv", "prompt", "generated"]
    exposed = set(h["server"]["exposed"]["gauges"])
    for g in v["gauges"]:
        if g["name"] in GAUGE_NAMES:
            assert g["exposed"] == str(g["name"] in exposed).lower(), g
            assert ("not exposed by this server" in g["text"]) == (g["name"] not in exposed), g
    assert any(g["exposed"] == "false" for g in v["gauges"]), "every gauge exposed: nothing to grey here"
    assert v["scrape"].startswith(f"scraped every {srv['every_s']} s · last ")
    # The request panel speaks only of what this client measured.
    text = v["accounting"] + v["why"] + v["sched"]
    assert "this client" in text
    assert not [w for w in ENGINE_WORDS if w in text], text


def waiting_pixels(page):
    """For each request in view with time before its first chunk: the timeline's colour in the
    middle of that wait (device pixels of the canvas), with the queue colour for comparison."""
    return page.evaluate("""() => {
      firstToken.view.paused = true; firstToken.refresh();
      const s = firstToken.state, lay = firstToken.ui.layouts.timeline, f = lay.f;
      const c = document.getElementById('timeline'), ctx = c.getContext('2d'), dpr = c.width / c.clientWidth;
      const out = [];
      lay.lanes.forEach((lane, i) => {
        for (const r of lane.reqs) {
          const until = r.first ?? r.end; if (until === null || r.rejected) continue;
          const x0 = Math.max(f.gutter, f.x(r.arrival)), x1 = Math.min(f.gutter + f.pw, f.x(until));
          if (x1 - x0 < 4) continue;
          const x = (x0 + x1) / 2, y = lay.top + i * lay.rowH + lay.rowH / 2;
          out.push({id: r.id, rgb: Array.from(ctx.getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data.slice(0, 3))});
        }
      });
      const q = getComputedStyle(document.documentElement).getPropertyValue('--c-queue').trim();
      firstToken.view.paused = false;
      return {out, queue: [1, 3, 5].map((i) => parseInt(q.slice(i, i + 2), 16))};
    }""")


def not_queue(pixels):
    """No wait before a first chunk drawn in the queue's colour (and some wait was seen)."""
    assert pixels["out"], "no request waited long enough to be seen"
    for p in pixels["out"]:
        assert max(abs(a - b) for a, b in zip(p["rgb"], pixels["queue"])) > 40, p


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))
    assert page.errors == []


def test_observe_page_draws_the_server_and_who_measured_what(observer, browser):
    page = open_page(browser, observer.url + "/")
    try:
        page.wait_for_function("() => window.firstToken && firstToken.state.hello && firstToken.state.hello.server "
                               "&& firstToken.state.last && firstToken.state.last.server", timeout=30_000)
        page.evaluate("firstToken.send({type: 'set', settings: {max_new_tokens: 200, prompt_tokens: 32}})")
        page.wait_for_function("() => firstToken.state.settings.max_new_tokens === 200", timeout=10_000)
        page.evaluate("firstToken.send({type: 'burst', n: 16})")
        busy = []   # RUNNING/WAITING read while the server's stats say it is busy
        page.wait_for_function("() => firstToken.state.order.length >= 16", timeout=30_000)
        for _ in range(300):
            v = page.evaluate(READ)
            assert v["running"] == str(v["last"]["running"]) and v["waiting"] == str(v["last"]["queue"])
            if v["last"]["running"]:
                busy.append(v)
            if page.evaluate("[...firstToken.state.reqs.values()].every((r) => r.end !== null)"):
                break
            page.wait_for_timeout(100)   # the sampling pace: the picture read at 10 Hz through the run
        assert busy, "the server's stats never showed a request running"
        check_picture(busy[-1])   # mid-run too: the same picture while the server is busy
        pixels = waiting_pixels(page)
        # a scrape after the last finish: the server idle again
        page.wait_for_function("() => { const s = firstToken.state, L = s.last, end = Math.max(...[...s.reqs.values()]"
                               ".map((r) => r.end)); return L && L.server && L.server.scraped_t > end && L.running === 0; }",
                               timeout=30_000)
        v = page.evaluate(READ)
        assert v["hello"]["server"]["kind"] == "first-token"
        check_picture(v)
        assert "waiting for its first chunk" in v["why"] or "streaming its" in v["why"]
        # Time before the first chunk is drawn as a client-side wait, never in the queue's colour.
        not_queue(pixels)
        shot(page, "observe-first-token.png")
    finally:
        page.close()


def test_a_recorded_llamacpp_observe_trace_replays_with_the_lanes(live, browser):
    trace = json.loads(LLAMACPP_TRACE.read_text())
    assert trace[0]["mode"] == "observe" and trace[0]["server"]["kind"] == "llamacpp"
    page = open_page(browser, live.url + "/")
    try:
        page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
        page.evaluate("t => { firstToken.replay.load(t, 'observe-llamacpp.json'); firstToken.replay.pause(); }", trace)
        # At the moment the server's stats said most was running and waiting at once.
        stats = [e for e in trace if e["type"] == "stats" and e["server"]]
        busiest = max(stats, key=lambda e: (e["running"] or 0, e["queue"] or 0))
        assert busiest["running"] and busiest["queue"], "the recording never had a queue"
        page.evaluate("t => firstToken.replay.seek(t)", busiest["t"] + 0.01)
        v = page.evaluate(READ)
        assert v["last"]["running"] == busiest["running"] and v["last"]["queue"] == busiest["queue"]
        check_picture(v)
        assert v["model"].startswith("observing llama.cpp server ")
        n = len(busiest["server"]["slots"])
        assert v["lanes"][4:] == [f"slot{i}" for i in range(n)]
        # llama.cpp's batch size is a mean since it started: the note says so beside the number.
        (batch,) = [g for g in v["gauges"] if g["name"] == "batch_size"]
        assert trace[0]["server"]["exposed"]["notes"]["batch_size"] in batch["text"]
        # llama.cpp's prefix hits / lookups: exposed, with a value only in intervals with lookups; in
        # one without, the gauge says so rather than a bare "—" tagged "server"; its draft acceptance,
        # never reported by this build, says that
        seen = [e for e in stats if e["server"]["ratios"]["prefix_hit_ratio"] is not None]
        quiet = next(e for e in stats if e["t"] > seen[0]["t"] and e["server"]["ratios"]["prefix_hit_ratio"] is None)
        assert not any(e["server"]["ratios"]["spec_acceptance"] is not None for e in stats)
        page.evaluate("t => firstToken.replay.seek(t)", quiet["t"] + 0.01)
        text = {g["name"]: g["text"] for g in page.evaluate(READ)["gauges"]}
        assert text["prefix_hit_ratio"].endswith("—server: none this interval (nothing to divide)"), text
        assert text["spec_acceptance"].endswith("—server: none in this server's /metrics so far"), text
        page.evaluate("t => { firstToken.replay.seek(t); firstToken.refresh(); }", busiest["t"] + 0.01)
        # A slot's strip holds the request the server's /slots said it held.
        ours = [row for row in busiest["server"]["slots"] if row["request"]]
        assert ours
        page.evaluate("""([slot, t]) => {
          const lay = firstToken.ui.layouts.server, lane = lay.lanes.find((l) => l.id === 'slot' + slot);
          const c = document.getElementById('server'), box = c.getBoundingClientRect();
          c.dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + lay.f.x(t) + 1,
                                                       clientY: box.top + lane.y + lane.h / 2, bubbles: true}));
        }""", [ours[0]["id"], busiest["server"]["scraped_t"]])
        page.wait_for_function("() => !document.getElementById('tip').hidden", timeout=5_000)
        tip = page.evaluate("document.getElementById('tip').textContent")
        assert f"slot {ours[0]['id']}: {ours[0]['request']}" in tip and "decoded" in tip and "remaining" in tip
        # the requests not yet answered wait for their first chunk: not drawn as queue
        not_queue(waiting_pixels(page))
        shot(page, "observe-llamacpp-replay.png")
        # An engine's trace after it: the engine's page again, none of observe mode's labels left.
        engine = json.loads((Path(__file__).parents[2] / "examples" / "queueing.json").read_text())
        page.evaluate("t => { firstToken.replay.load(t, 'queueing.json'); firstToken.refresh(); }", engine)
        back = page.evaluate("""() => ({tps: document.getElementById('h-tps').previousElementSibling.textContent,
          tags: [...document.querySelectorAll('.fig .by')].filter((t) => !t.hidden).length,
          strip: document.getElementById('server-strip').hidden, legend: document.getElementById('legend-engine').hidden,
          observing: document.body.classList.contains('observing'), model: document.getElementById('model').textContent})""")
        assert back == {"tps": "tokens/s", "tags": 0, "strip": True, "legend": False, "observing": False,
                        "model": back["model"]} and not back["model"].startswith("observing")
        assert page.errors == []
    finally:
        page.close()


def test_a_students_phone_on_an_observed_server_says_the_classroom_app_measured(live, browser):
    """On an observed server the phone's first row of figures is this app's, as a client of that
    server (`measured_by: "client"`): labelled so, never as the engine's."""
    from server.classroom import Classroom
    from test_observe import observing
    app = observing(live.url, classroom=Classroom(join_code="owl"))
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    sub = app.observer.events.subscribe(replay=False)
    try:
        ask_on_phone(page, app.url, "What is a token?")
        page.wait_for_function("document.getElementById('f-ttft-engine').textContent !== '—'", timeout=30_000)
        events = sub.get(timeout=1)
        (fin,) = [e for e in events if e["type"] == "finished"]
        assert fin["client_side"]
        assert page.text_content("#f-by") == "classroom app"
        note = page.text_content("#f-note")
        assert "measured by the classroom app" in note and "measured by the server" not in note
        assert "engine" not in note
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "join-observe-390x844.png"))
        assert errors == []
    finally:
        ctx.close()
        app.stop()
        app.observer.shutdown()


def test_a_server_gone_unreadable_is_a_gap_and_an_old_scrape_is_stale(live, browser):
    """The recorded llama.cpp trace with its /metrics made unreadable (`stats.server: null`, as
    observe mode sends it then) for its last seconds, and one stretch before that where the same
    scrape kept being repeated with a growing age: the page says "not readable" and draws a gap,
    and marks the repeated scrape stale once it is older than twice its period."""
    trace = json.loads(LLAMACPP_TRACE.read_text())
    stats = [e for e in trace if e["type"] == "stats" and e["server"]]
    cut = stats[len(stats) * 3 // 4]["t"]
    held = stats[len(stats) // 2]
    stale_at = None
    for e in trace:
        if e["type"] != "stats":
            continue
        if e["t"] >= cut:
            e.update(server=None, running=None, queue=None, cache_usage=None)
        elif held["t"] < e["t"] < held["t"] + 2:
            e["server"] = dict(held["server"], age_s=held["server"]["age_s"] + e["t"] - held["t"])
            e.update(running=held["running"], queue=held["queue"])
            if stale_at is None and e["server"]["age_s"] > 2 * e["server"]["period_s"]:
                stale_at = e["t"]
    assert stale_at is not None
    page = open_page(browser, live.url + "/")
    try:
        page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
        page.evaluate("t => { firstToken.replay.load(t, 'unreadable.json'); firstToken.replay.pause(); }", trace)
        page.evaluate("t => firstToken.replay.seek(t)", stale_at + 0.01)
        v = page.evaluate(READ)
        assert v["scrape"].endswith(" · stale") and page.evaluate(
            "document.getElementById('server-scrape').dataset.stale") == "true"
        # the headline's server figures and the gauges from that scrape are greyed and say so, at
        # the same moment: a stale count is not shown as the server's now
        marks = page.evaluate("""() => ({figs: ['h-running', 'h-waiting'].map(id => document.getElementById(id).parentElement.dataset.stale),
          gauges: [...document.querySelectorAll('#server-gauges .sg')].filter(g => g.dataset.stale === 'true').map(g => g.dataset.name),
          grey: getComputedStyle(document.getElementById('h-running')).color,
          white: getComputedStyle(document.getElementById('h-ttft50')).color})""")
        assert marks["figs"] == ["true", "true"] and "stale" in v["tags"]["running"] and "stale" in v["tags"]["waiting"]
        assert "batch_size" in marks["gauges"] and marks["grey"] != marks["white"]
        page.evaluate("t => firstToken.replay.seek(t)", held["t"] + 0.01)   # the same scrape while fresh
        v = page.evaluate(READ)
        assert "stale" not in v["tags"]["running"] and page.evaluate(
            "document.getElementById('h-running').parentElement.dataset.stale") == "false"
        page.evaluate("t => firstToken.replay.seek(t)", trace[-1]["t"])
        v = page.evaluate(READ)
        assert v["last"]["server"] is None
        assert v["scrape"].startswith("its /metrics is not readable since ")
        assert v["running"] == v["waiting"] == "—" and "not readable" in v["tags"]["running"]
        gaps = page.evaluate("firstToken.state.scrapes.filter((p) => !p.server).map((p) => p.t)")
        # (the recording's own first stats came before the observer's first scrape: a gap too)
        assert gaps[-1] == pytest.approx(min(e["t"] for e in trace if e["type"] == "stats" and e["t"] >= cut))
        # the gap is hatched across the lanes: many of the running lane's pixels there are not the background
        assert 0.08 < page.evaluate("""([t0, t1]) => {
          firstToken.view.paused = true; firstToken.view.right = t1; firstToken.refresh();
          const lay = firstToken.ui.layouts.server, f = lay.f, lane = lay.lanes[0];
          const c = document.getElementById('server'), ctx = c.getContext('2d'), dpr = c.width / c.clientWidth;
          const px = [];
          for (let x = f.x(t0) + 2; x < f.x(t1) - 2; x += 1) px.push(ctx.getImageData(Math.round(x * dpr), Math.round((lane.y + lane.h / 2 + 4) * dpr), 1, 1).data.slice(0, 3).join());
          const bg = getComputedStyle(document.documentElement).getPropertyValue('--c-panel2').trim();
          const bgRgb = [1, 3, 5].map((i) => parseInt(bg.slice(i, i + 2), 16)).join();
          return px.filter((p) => p !== bgRgb).length / px.length;   // hatch lines every few pixels, not a grid line's one
        }""", [gaps[-1], trace[-1]["t"]])
        assert page.errors == []
    finally:
        page.close()


@pytest.mark.parametrize("metrics, says", [((404, b"not here"), "its /metrics is not readable"),
                                           ((200, b"# an exporter of something else\nsome_other_total 3\n"),
                                            "its /metrics has no names First Token knows")])
def test_a_server_not_recognised_is_named_by_its_address_and_says_why(browser, metrics, says):
    from helpers import loopback_http

    def get(handler):
        if handler.path == "/v1/models":
            return 200, b'{"data": [{"id": "some/model"}]}'
        return metrics if handler.path == "/metrics" else (404, b"{}")
    httpd = loopback_http(get, lambda h: (500, b"{}"))
    app = start_app("--observe", httpd.url + "/v1")
    page = open_page(browser, app.url + "/")
    try:
        page.wait_for_function("() => window.firstToken && firstToken.state.last", timeout=30_000)
        v = page.evaluate(READ)
        assert v["hello"]["server"] is None
        assert v["model"] == f"observing {httpd.url}/v1 · model · {says}"
        assert v["running"] == v["waiting"] == "—"
        assert v["tags"]["ttft"] == "this client"
        assert v["tags"]["running"] == ("server: /metrics not readable" if metrics[0] == 404 else "server: no names First Token knows")
        # nothing is drawn as if the server had said it: every gauge greyed
        assert v["gauges"] and all(g["exposed"] == "false" and "not exposed by this server" in g["text"] for g in v["gauges"])
        assert page.errors == []
    finally:
        page.close()
        app.stop()
        httpd.shutdown()
