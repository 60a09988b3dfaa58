"""Replay in real Chromium, on the tiny model in process: a trace round-trips (recorded while a
live page watched -> loaded in another page -> the same events in its state and the same
figures on screen), an exported file replays from file:// with every request blocked, /embed
replays a trace inside an iframe on another origin, slow motion and back to live, and a file
that is not a trace changes nothing. An article opened from disk frames /embed; a saved trace's
and an export's axis start at the trace's first event, and an export in a 640x400 window takes
the compact layout; /embed?preset= replays a shipped recording, or asks before resetting an
engine other pages watch."""
import json
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest

from engine.teach import record
from helpers import ARTIFACTS, SCHEMA, Served, record_sent, sent_since, wait_until
from server import export, pages

QUICK = {"load": True, "rate": 6.0, "prompt_tokens": 32, "max_new_tokens": 8}

# Every figure the page shows as text, except delivery to this page (a live measure only).
FIGURES = r"""() => {
  const ids = ["h-ttft50", "h-ttft99", "h-itl50", "h-itl99", "h-tps", "h-running", "h-waiting", "h-policy",
               "kv-info", "blocks-info", "prefix-info", "queue-info", "slots-info", "waiting-info", "step-info",
               "d-title", "d-sched", "d-text", "d-ntok"];
  const out = {};
  for (const id of ids) out[id] = document.getElementById(id).textContent;
  // delivery to this page is measured live only; a replay has no arrival times to measure it by
  out.accounting = document.getElementById("d-accounting").innerText.replace(/ · TTFT here [^\n]*? as this page saw it \([^)]*\)/, "");
  for (const id of ["chart-stages", "chart-steps"]) {
    out[id] = (document.getElementById(id).data || []).map((t) => [t.name, Array.from(t.x || []), Array.from(t.y || [])]);
  }
  return out;
}"""

# Per request, what the state holds (the same events folded the same way give the same rows).
REQUESTS = """(ids) => ids.map((id) => { const r = firstToken.state.reqs.get(id);
  return r && [r.id, r.source, r.promptTokens, r.tokens, r.text.join(""), r.ttft, r.tpot, r.stages, r.reason,
               r.admits, r.prefills]; })"""


class Watch:
    """A Chromium page, collecting console errors and websocket traffic."""

    def __init__(self, context_or_browser, url, width=1920, height=1080):
        self.page = context_or_browser.new_page()
        self.page.set_viewport_size({"width": width, "height": height})
        self.errors, self.sockets, self.sent = [], [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("websocket", self._socket)
        self.page.goto(url)

    def _socket(self, ws):
        self.sockets.append(ws.url)
        ws.on("framesent", lambda payload: self.sent.append(payload))

    def js(self, expr, arg=None):
        return self.page.evaluate(expr, arg)

    def wait(self, expr, arg=None, timeout=30_000):
        self.page.wait_for_function(expr, arg=arg, timeout=timeout, polling=50)

    def load_file(self, path):
        """Load a trace with the page's file picker, as a user would."""
        self.page.set_input_files("#trace-file", str(path))

    def to_end(self):
        """Scrub to the end of the replay, then draw the panels and charts (else at 4 and 2 Hz)."""
        self.js("firstToken.replay.seek(Infinity); firstToken.refresh()")

    def shot(self, name):
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / name))


def validate(trace):
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(trace)


def test_a_trace_round_trips(live, browser, tmp_path):
    watcher = Watch(browser, live.url)
    watcher.wait("() => firstToken.state.hello && firstToken.state.last")
    other = Watch(browser, live.url)   # opened now: it replays while the server is gone
    other.wait("() => firstToken.state.hello")
    # the watcher shows candidates, so it receives every field the recording keeps (a page that
    # does not gets tokens without them: its own trace has `top: null`)
    watcher.page.check("#cand-on")
    wait_until(live.driver.events.candidates_shown, 10, "the watcher's view")

    trace = record.record(live.driver, 1.5, settings=QUICK, drain=True)   # the CLI's recording
    validate(trace)
    ids = [ev["id"] for ev in trace if ev["type"] == "request"]
    assert len(ids) >= 3
    watcher.wait("ids => ids.every((id) => { const r = firstToken.state.reqs.get(id); return r && r.end !== null; })", ids)
    live.driver.publishing = False   # nothing more reaches the watcher: its figures are final
    # The engine thread's turn that may be publishing still ends before it applies a command: once
    # this one is applied (its settings are a new object), the last event ever published is known;
    # the watcher has all of it when that one has arrived.
    applied = live.driver.settings.now
    live.driver.update_settings({"rate": QUICK["rate"]})
    wait_until(lambda: live.driver.settings.now is not applied, 30, "the engine thread's next turn")
    last = dict(live.driver.events.last())
    watcher.wait("last => firstToken.trace().some(e => e.type === last.type && e.t === last.t)", last)
    watcher.js("firstToken.refresh()")
    seen = watcher.js("firstToken.trace()")
    validate(seen)
    assert seen[0]["type"] == "hello" and not any(ev["type"] == "sync" for ev in seen)
    # The same events: the recording is a contiguous run of what the live page received.
    start = seen.index(trace[1])
    assert seen[start:start + len(trace) - 1] == trace[1:]
    figures, rows = watcher.js(FIGURES), watcher.js(REQUESTS, ids)

    # The page's own saved trace replays to the same figures on screen.
    (tmp_path / "saved.json").write_text(json.dumps(seen))
    other.load_file(tmp_path / "saved.json")
    other.wait("() => firstToken.replay.player.mode === 'trace' && firstToken.state.hello")
    other.to_end()
    assert other.js("firstToken.state.events") == len(seen)
    assert other.js(FIGURES) == figures
    other.shot("replay-roundtrip.png")

    # The CLI's trace gives the same request rows as the live page had.
    (tmp_path / "cli.json").write_text(json.dumps(trace))
    other.load_file(tmp_path / "cli.json")
    other.wait("n => firstToken.replay.player.events.length === n", len(trace))
    other.to_end()
    assert other.js(REQUESTS, ids) == rows
    assert other.js("firstToken.state.events") == len(trace)
    # Scrubbing back re-ingests from the start into the same state object.
    other.js("firstToken.replay.seek(-1)")
    assert other.js("firstToken.state.order.length") == 0
    other.to_end()
    assert other.js(REQUESTS, ids) == rows
    assert other.errors == [] and watcher.errors == []
    other.page.close()
    watcher.page.close()


def test_a_replaying_page_leaves_the_live_connection_and_sends_nothing(live, browser, tmp_path):
    trace = record.record(live.driver, 0.5, settings=QUICK, drain=True)
    (tmp_path / "t.json").write_text(json.dumps(trace))
    listening = live.driver.events.subscribers
    page = Watch(browser, live.url)
    page.wait("() => firstToken.state.hello && firstToken.clock.offset !== null")
    assert live.driver.events.subscribers == listening + 1
    page.load_file(tmp_path / "t.json")
    page.wait("() => firstToken.replay.player.mode === 'trace'")
    # The page said `leave` and the server closed: nothing is sent to this tab any more.
    assert json.loads(page.sent[-1]) == {"type": "leave"}
    wait_until(lambda: live.driver.events.subscribers == listening, 30, "the tab's subscription gone")
    sent, recorded = len(page.sent), record_sent(page.page)
    page.js("firstToken.replay.setSpeed(4)")
    assert page.js("firstToken.send({type: 'reset'})") is False
    assert sent_since(page.page, recorded) == []   # nothing reached the socket
    assert len(page.sent) == sent and page.errors == []
    assert page.js("document.getElementById('controls').offsetParent") is None   # replaced by the replay's
    assert page.js("document.getElementById('replay').offsetParent") is not None
    page.page.close()


def test_a_file_that_is_not_a_trace_changes_nothing(live, browser, tmp_path):
    page = Watch(browser, live.url)
    page.wait("() => firstToken.state.hello")
    (tmp_path / "bad.json").write_text('[{"type": "token", "t": 1}]')
    page.load_file(tmp_path / "bad.json")
    page.wait("() => document.getElementById('toast').textContent.includes('not a First Token trace')")
    assert "starts with a hello" in page.js("document.getElementById('toast').textContent")
    assert page.js("firstToken.replay.player.mode") == "live"
    assert page.js("document.getElementById('conn').dataset.state") == "connected"
    page.page.close()


def test_export_replays_from_file_with_the_network_blocked(live, browser, tmp_path):
    from engine.teach.presets import PRESETS
    trace = record.record(live.driver, 1.5, preset="queueing", drain=True)
    path = tmp_path / "page.html"
    path.write_text(export.render(trace, "tiny"))
    url = path.as_uri()
    context = browser.new_context(viewport={"width": 1920, "height": 1080})
    refused = []

    def only_the_file(route):
        if route.request.url == url:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()
    context.route("**/*", only_the_file)
    page = Watch(context, url)
    # The page's modules came from the import map's data: URLs (a file:// page loads no module
    # from a file, and every other URL is refused): the boot module ran and set firstToken.
    page.wait("() => window.firstToken && firstToken.replay.player.mode === 'trace'")
    assert page.js("typeof window.FT") == "undefined"   # no global namespace: modules import what they read
    page.js("firstToken.replay.setSpeed(4)")
    page.wait("() => !firstToken.replay.player.playing", timeout=30_000)   # played to the end
    assert page.js("firstToken.state.events") == len(trace)
    finished = [ev for ev in trace if ev["type"] == "finished"]
    assert page.js("firstToken.state.finishedCount") == len(finished)
    page.js("firstToken.refresh()")   # else the panels' 4 Hz and the charts' 2 Hz ticks may be due
    # Charts drawn (plotly, inlined), tokens shown (the newest request's output), the credit line.
    assert page.js("document.querySelectorAll('#chart-stages .bars .point').length") > 0
    assert page.js("document.querySelectorAll('#chart-steps .scatterlayer .trace').length") > 0
    newest = [ev["id"] for ev in trace if ev["type"] == "request"][-1]   # the request panel follows it
    last = [ev for ev in trace if ev["type"] == "token" and ev["id"] == newest]
    assert page.js("document.getElementById('d-text').textContent") == "".join(ev["text"] for ev in last)
    assert page.js("document.getElementById('rp-credit').textContent").startswith(
        "Recorded with First Token on tiny-random-llama, cpu, ")
    assert page.js("document.getElementById('lesson-text').textContent") == PRESETS["queueing"].explain
    assert page.js("document.getElementById('rp-preset-title').textContent") == PRESETS["queueing"].title
    assert page.sockets == [] and refused == [] and page.errors == []
    page.shot("export-file.png")
    context.close()


def other_origin(src):
    """A page on another origin (another loopback port) that frames /embed."""
    body = (f'<!doctype html><title>article</title><p>An article.</p>'
            f'<iframe id="ft" src="{src}" width="640" height="400" style="border:0"></iframe>').encode()

    def article(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/html")])
        return [body]
    served = Served(article)
    served.url += "/"
    return served


def test_embed_replays_a_shipped_trace_in_a_frame_on_another_origin(live, browser, tmp_path, monkeypatch):
    trace = record.record(live.driver, 1.0, settings=QUICK, drain=True)
    monkeypatch.setattr(pages, "EXAMPLES", tmp_path)   # the shipped examples: this one
    (tmp_path / "tiny-run.json").write_text(json.dumps(trace))
    article = other_origin(f"{live.url}/embed?trace=examples/tiny-run.json&panels=kv,queue")
    try:
        page = Watch(browser, article.url, width=800, height=500)
        frame = page.page.frame_locator("#ft")
        frame.locator("#replay").wait_for(state="visible")
        inner = page.page.frames[1]
        inner.wait_for_function("() => firstToken.replay.player.mode === 'trace' && firstToken.state.events > 1")
        inner.evaluate("firstToken.replay.setSpeed(4)")
        inner.wait_for_function("() => !firstToken.replay.player.playing", timeout=30_000)
        assert inner.evaluate("firstToken.state.events") == len(trace)
        # Drawn: the timeline has request rows; the headline shows measured figures.
        assert inner.evaluate("firstToken.ui.layouts.timeline.lanes.length") > 0
        inner.evaluate("firstToken.refresh()")   # else the panels' 4 Hz tick may still be due
        assert inner.evaluate("document.getElementById('h-ttft50').textContent") != "—"
        assert inner.evaluate("document.getElementById('kv') !== null && document.getElementById('blocks') === null")
        assert page.sockets == [] and page.errors == []
        page.shot("embed-iframe-other-origin.png")
    finally:
        article.stop()


def test_slow_motion_and_back_to_live(live, browser):
    page = Watch(browser, live.url)
    page.wait("() => firstToken.state.hello && firstToken.clock.offset !== null")
    live.driver.update_settings(QUICK)
    page.wait("() => firstToken.state.finishedCount >= 3")
    # two seconds behind live (the live engine time read just before and just after it started)
    before, started, vt0, after = page.js("""() => { const live = () => performance.now() / 1000 - firstToken.clock.offset;
        const before = live(), started = firstToken.slowMotion(0.1, 2);
        return [before, started, firstToken.replay.player.vt, live()]; }""")
    assert started is True and before - 2 <= vt0 <= after - 2
    assert page.js("firstToken.replay.player.mode") == "slow"
    logged = page.js("firstToken.trace().length")
    # Each frame moves the view a tenth of the frame's time on (the player's own frame times, not
    # this machine's pace): read at two frames 1.5 s of frame time apart.
    sample = "() => [firstToken.replay.player.lastTs, firstToken.replay.player.vt]"
    page.wait("() => firstToken.replay.player.lastTs !== null")
    ts1, vt1 = page.js(sample)
    page.wait("t => firstToken.replay.player.lastTs >= t + 1500", ts1)
    ts2, vt2 = page.js(sample)
    assert vt2 - vt1 == pytest.approx(0.1 * (ts2 - ts1) / 1000, rel=1e-6)
    # while the engine and the log keep real time: live events still logged, newer than the view
    assert page.js("firstToken.trace().length") > logged
    assert page.js("firstToken.trace().at(-1).t") > vt2
    assert page.js("document.getElementById('rp-live').offsetParent") is not None
    page.page.click("#rp-live")
    assert page.js("firstToken.replay.player.mode") == "live"
    # Rebuilt from the whole log: every logged event is in the state again.
    ingested, logged = page.js("[firstToken.state.events, firstToken.trace().length]")   # one moment
    assert ingested == logged
    live.driver.update_settings({"load": False})
    assert page.errors == []
    page.page.close()


def test_an_article_opened_from_disk_frames_the_embed(live, browser, tmp_path):
    """A file:// article's iframe of /embed shows the live page (frame-ancestors `* file:`: CSP's
    `*` alone matches network schemes only, and the frame stayed blank)."""
    article = tmp_path / "article.html"
    article.write_text(f'<!doctype html><title>article</title><p>An article.</p>'
                       f'<iframe id="ft" src="{live.url}/embed" width="640" height="400" style="border:0"></iframe>')
    page = Watch(browser, article.as_uri(), width=800, height=500)
    page.wait("() => document.getElementById('ft').contentWindow !== null")
    wait_until(lambda: len(page.page.frames) > 1 and page.page.frames[1].url.startswith(live.url), 10, "the frame")
    inner = page.page.frames[1]
    inner.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=15_000)
    assert inner.evaluate("document.body.classList.contains('embed')")
    assert not [e for e in page.errors if "frame-ancestors" in e], page.errors


def test_a_saved_traces_axis_and_an_exports_start_at_the_traces_first_event(live, browser, tmp_path):
    """A page opened after requests ran gets their history before its hello; its saved trace starts
    before the hello's time, and the replay's (and the export's) axis counts from its first event
    (it counted from the hello: '−95 s … −80 s' over a lesson). In a 640x400 window the export takes
    the compact layout, its timeline above the fold; at 1366x768 the full page's."""
    record.record(live.driver, 1.0, settings=QUICK, drain=True)
    watcher = Watch(browser, live.url + "/")
    watcher.wait("() => firstToken.state.hello && firstToken.state.finishedCount > 0")
    trace = watcher.js("firstToken.trace()")
    start = min(ev["t"] for ev in trace)
    assert trace[0]["type"] == "hello" and trace[0]["t"] > start + 0.5   # history from before the hello
    watcher.js("(t) => firstToken.replay.load(t, 'saved')", trace)
    assert watcher.js("firstToken.view.origin") == pytest.approx(start)
    watcher.page.close()
    path = tmp_path / "saved.html"
    path.write_text(export.render(trace, "saved"))
    for (w, h), compact in (((640, 400), True), ((1366, 768), False)):
        page = Watch(browser, path.as_uri(), width=w, height=h)
        page.wait("() => window.firstToken && firstToken.replay.player.mode === 'trace'")
        page.js("firstToken.refresh()")
        assert page.js("firstToken.view.origin") == pytest.approx(start)
        got = page.js("""() => ({embed: document.body.classList.contains('embed'),
                                 tl: document.querySelector('.timeline-wrap').getBoundingClientRect().bottom, h: innerHeight})""")
        assert got["embed"] == compact, got
        if compact:
            assert got["tl"] <= got["h"], got   # the timeline whole, above the fold
        page.shot(f"export-saved-{w}x{h}.png")
        assert page.errors == []
        page.page.close()


def test_embed_preset_replays_its_recording_or_asks_before_resetting_what_others_watch(live, browser, tmp_path, monkeypatch):
    """/embed?preset=NAME: a shipped recording of that lesson is replayed for this reader (a
    redirect to ?trace=examples/NAME.json; nothing sent to the engine); with none, the frame runs
    it at once when it is the engine's only viewer, and otherwise says how many other pages it
    would reset and waits for a click."""
    trace = record.record(live.driver, 1.0, preset="idle", drain=True)
    monkeypatch.setattr(pages, "EXAMPLES", tmp_path)
    (tmp_path / "idle.json").write_text(json.dumps(trace))
    page = Watch(browser, f"{live.url}/embed?preset=idle&panels=kv", width=640, height=400)
    page.wait("() => window.firstToken && firstToken.replay.player.mode === 'trace'")
    query = parse_qs(urlsplit(page.page.url).query)
    assert query == {"trace": ["examples/idle.json"], "panels": ["kv"]}, page.page.url
    assert page.sockets == []
    page.page.close()
    (tmp_path / "idle.json").unlink()   # no recording: live

    def preset_ran(sub):
        """Whether the engine applied a preset since `sub` last looked (its events, engine-side)."""
        return any(ev["type"] == "preset" for ev in sub.get(0))

    sub = live.driver.events.subscribe(replay=False)
    other = Watch(browser, live.url + "/", width=1366, height=768)   # a second page watching the engine
    other.wait("() => firstToken.state.hello")
    page = Watch(browser, f"{live.url}/embed?preset=idle", width=640, height=400)
    page.wait("() => !document.getElementById('embed-ask').hidden", timeout=10_000)
    others = live.driver.events.subscribers - 1   # the other page, and this test's subscription
    assert f"{others} other pages are watching too: running it resets the engine for all of them" in page.js(
        "document.getElementById('embed-ask-text').textContent")
    assert not preset_ran(sub)
    page.page.click("#embed-run")
    wait_until(lambda: preset_ran(sub), 10, "the lesson run")
    assert page.errors == [] and other.errors == []
    page.page.close()
    other.page.close()
    live.driver.events.unsubscribe(sub)
    wait_until(lambda: live.driver.events.subscribers == 0, 10, "the closed pages' sockets gone")
    alone = Watch(browser, f"{live.url}/embed?preset=idle", width=640, height=400)
    # the engine's `preset` event, after this page connected: it ran at once, nobody asked
    alone.wait("async () => { const t = await import('ft/teach'); return t.active && t.active.t >= firstToken.state.connectT; }",
               timeout=10_000)
    assert alone.js("document.getElementById('embed-ask').hidden") and alone.errors == []
    alone.page.close()
