"""The way out and the cold start on the page (issue 21), in Chromium on an in-process app on the
midsize random model whose reload sleeps a known time: each lesson's preset shows what its text
says, read from the page's own state (`window.firstToken`: each token's engine time and its
arrival here) and from what it drew and wrote — `buffered-proxy`: steady engine tokens arrive
here in clumps; `slow-network`: TTFT here exceeds the engine's by about the injected delay, said
to be injected; `cold-start`: the first requests' `load` stage is the measured load, drawn as
the model-loading band, and after it each forward that was the first of its shape is outlined.
The diagnosis names each."""
import time

import pytest

from engine.model import runner
from helpers import ARTIFACTS, LiveApp, collect, page_module, record_sent, sent_since, settled
from test_browser import Page
from test_teaching import midsize_bundle

LOAD_S = 0.8


@pytest.fixture(scope="module")
def app():
    """The midsize model on one torch thread (Chromium needs the other core); a reload sleeps
    LOAD_S, then hands the same weights back."""
    import torch
    from engine import EngineConfig
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    bundle = midsize_bundle()

    def loader():
        time.sleep(LOAD_S)   # the time under test: a load that takes a known time
        return bundle

    live = LiveApp(bundle, EngineConfig(slots=4, kv_tokens=4096, max_context=512), loader=loader)
    yield live
    live.stop()
    torch.set_num_threads(threads)


@pytest.fixture
def page(browser, app):
    p = Page(browser, app.url + "/", 1366, 768)
    yield p
    p.close()


def run_preset(page, name, n):
    """Click the preset's button in the lessons panel (it renders from hello.presets); wait until n
    of its requests finished with every token's arrival here known. Their tokens, arrivals,
    TTFT, stages; and the preset's engine time."""
    assert page.page.is_visible(f"#presets .preset[data-preset='{name}']")
    page.page.click(f"#presets .preset[data-preset='{name}']")
    page.wait("n => { const b = document.querySelector('#presets .preset.on'); return b && b.dataset.preset === n; }", name,
              timeout=15_000)
    page.wait("""n => { const s = firstToken.state; const done = [...s.reqs.values()].filter(r => r.end !== null &&
                 r.stages && r.arrivals.length === r.tokens.length && r.arrivals.every(a => a !== null));
                 return done.length >= n; }""", n, timeout=90_000)
    # its lesson: the preset's own title and explanation from hello.presets (engine/teach/presets.py)
    p = page.js("n => firstToken.state.hello.presets.find(p => p.name === n)", name)
    assert page.page.text_content("#lesson-title") == p["title"]
    assert page.page.text_content("#lesson-text") == p["explain"] and page.page.is_visible("#lesson-text")
    return page.js("""() => [...firstToken.state.reqs.values()].filter(r => r.end !== null).map(r => ({id: r.id,
        tokens: r.tokens, arrivals: r.arrivals, ttft: r.ttft, arrival: r.arrival, first: r.first, stages: r.stages}))""")


def why(page, rid):
    """Select request rid; its diagnosis ({cause, text}) and request-panel accounting text."""
    page.js("id => firstToken.select(id)", rid)
    page.wait("id => document.getElementById('d-title').textContent.startsWith(id + ' ')", rid, timeout=5_000)
    page.wait("() => document.getElementById('d-why').dataset.cause", timeout=5_000)
    return page.js("""() => ({cause: document.getElementById('d-why').dataset.cause,
        text: document.getElementById('d-why').textContent, acc: document.getElementById('d-accounting').textContent})""")


def moments(arrivals, within=0.02):
    """The indices where a distinct arrival moment starts: frames within 20 ms of the previous
    moment count as one."""
    out = [0]
    for i in range(1, len(arrivals)):
        if arrivals[i] - arrivals[out[-1]] > within:
            out.append(i)
    return out


def test_buffered_proxy_clumps_the_arrivals_here_while_the_engine_stays_steady(page):
    reqs = run_preset(page, "buffered-proxy", 2)
    for r in reqs:
        t, a = r["tokens"], r["arrivals"]
        assert len(t) == 64
        # the engine's tokens: one a forward, each its own moment (how even its steps are is this
        # machine's business: a busy CI run's 90th-percentile gap was 5x the median)
        assert all(b > x for x, b in zip(t, t[1:])), t
        m = moments(a)
        assert all(x >= y - 1e-6 for x, y in zip(a, t))              # never before the engine made them
        # Here: clumps, judged on the engine's clock (the page's arrivals are on it, synced), not
        # on how fast this machine makes tokens. The proxy lets go every 500 ms of what it took
        # since it last did: at most one clump per 500 ms of the engine's time (and one for the
        # tokens held at the end) ...
        span = t[-1] - t[0]
        assert len(m) <= (span + 0.55) / 0.5 + 1, (len(m), span)
        # ... and each clump after the first arrived 500 ms or more after the engine made the last
        # token of the one before (the proxy took nothing sooner; 50 ms: the clock sync's error)
        for prev, k in zip(m, m[1:]):
            assert a[k] - t[k - 1] >= 0.45, (k, a[k] - t[k - 1], prev)
    # drawn: the arrival marks apart from the ticks, and the legend names the proxy (real, not injected)
    page.js("() => firstToken.refresh()")
    # the window fitted to the run holds every arrival here, not only the engine's tokens ...
    view = page.js("() => ({left: firstToken.view.right - firstToken.view.span, right: firstToken.view.right})")
    last = max(a for r in reqs for a in r["arrivals"])
    assert view["left"] <= min(r["arrival"] for r in reqs) and last <= view["right"], (view, last)
    # ... as for an answer shorter than the proxy's half second, whose tokens all arrive after its end
    run = page.js("""w => w.latestRun({order: ["a"], reqs: new Map([["a", {id: "a", arrival: 10, end: 10.3,
        arrivals: [10.5, 10.5, null]}]])}, 11, null)""", page_module(page.page, "window"))
    assert run["start"] == 10 and run["end"] == 10.5, run
    drawn = page.js("() => firstToken.ui.layouts.timeline.delivery")
    assert drawn["marks"] > 0 and drawn["apart"] > 0 and "buffering proxy" in drawn["note"]
    legend = page.page.text_content("#tl-way")
    assert page.page.is_visible("#tl-way") and "real buffering proxy" in legend and "injected" not in legend
    d = why(page, reqs[0]["id"])
    assert d["cause"] == "buffering" and "buffering proxy holds tokens" in d["text"], d
    assert "TTFT here" in d["acc"] and "through a buffering proxy" in d["acc"], d
    assert page.errors == []


def test_slow_network_adds_the_injected_delay_to_ttft_here_and_says_injected(page):
    reqs = run_preset(page, "slow-network", 2)
    for r in reqs:
        here = r["arrivals"][r["tokens"].index(r["first"])] - r["arrival"]
        # 300 ms injected (+ 0..100 ms jitter): nothing can arrive sooner. How much later it arrives
        # is this machine's business (a busy one delays the page's frames: an upper bound here
        # failed a full run at 0.57 s), so only the injected floor is judged.
        assert here - r["ttft"] >= 0.28, (here, r["ttft"])
        lags = sorted(x - y for x, y in zip(r["arrivals"], r["tokens"]))
        assert lags[0] >= 0.28, lags     # every token at least the injected latency late
    d = why(page, reqs[0]["id"])
    assert d["cause"] == "network" and "injected network delay" in d["text"] and "300 ms injected" in d["text"], d
    fmt = page.js("() => import('ft/delivery').then(m => m.ttftHere(firstToken.state.reqs.get(firstToken.ui.selected)))")
    assert "TTFT here" in d["acc"] and "with injected network delay" in d["acc"] and fmt > reqs[0]["ttft"], d
    assert "300–400 ms injected network delay" in page.page.text_content("#tl-way")
    page.wait("() => /injected network delay/.test(document.getElementById('lesson-live').textContent)", timeout=5_000)
    assert page.errors == []


def test_cold_start_draws_the_measured_load_and_the_first_requests_wait_for_it(page, app):
    runner.SHAPES.clear()   # as in a freshly started server: the cold start's forwards are all new shapes
    sub = app.driver.events.subscribe(replay=False)
    try:
        reqs = run_preset(page, "cold-start", 3)
        events = sub.get(0.5)
    finally:
        sub.close()
    loads = page.js("() => firstToken.state.loads")
    assert len(loads) == 1 and loads[0]["seconds"] >= LOAD_S and loads[0]["reason"] == "reload"
    seconds = loads[0]["seconds"]
    first, later = reqs[:2], reqs[2:]
    for r in first:   # arrived with the reload: waited for (nearly) all of it
        assert seconds - 0.1 <= r["stages"]["load"] <= seconds + 1e-6, r["stages"]
        assert sum(r["stages"].values()) == pytest.approx(r["ttft"], abs=1e-6)
    assert later and all(r["stages"]["load"] == 0 for r in later)
    fmt = page.js("v => import('ft/util').then(m => m.fmtS(v))", seconds)
    page.js("() => { firstToken.view.right = firstToken.state.latestT; firstToken.refresh(); }")
    drawn = page.js("() => firstToken.ui.layouts.timeline.delivery")
    assert [x["text"] for x in drawn["loads"]] == [f"model loading (reload): {fmt}"]
    assert page.page.is_visible("#tl-load")
    d = why(page, first[0]["id"])
    assert d["cause"] == "cold start" and f"the load took {fmt}, measured" in d["text"], d
    assert page.page.locator("#d-accounting .seg.load").count() == 1 and "model load" in d["acc"]
    d = why(page, later[0]["id"])
    assert d["cause"] != "cold start" and page.page.locator("#d-accounting .seg.load").count() == 0
    first_shapes_are_outlined(page, events)
    # the Reload model button: with nothing running it sends `reload` at once, and a load follows
    page.page.click("#btn-reload")
    page.wait("() => firstToken.state.loads.length === 2", timeout=15_000)
    assert page.dialogs == [] and page.errors == []


def test_reload_asks_first_while_requests_run(page):
    page.js("() => firstToken.send({type: 'set', settings: {prompt_tokens: 32, max_new_tokens: 400}})")
    page.wait("() => firstToken.state.settings.max_new_tokens === 400", timeout=5_000)
    page.page.fill("#burst-n", "1")
    page.page.click("#btn-burst")   # one request of 400 tokens (the context holds 512): running for seconds
    page.wait("() => [...firstToken.state.reqs.values()].some(r => r.end === null)", timeout=10_000)
    before = page.js("() => firstToken.state.loads.length")
    sent = record_sent(page.page)
    page.page.click("#btn-reload")            # the page's dialog handler dismisses the confirm
    assert len(page.dialogs) == 1 and "running or waiting" in page.dialogs[0]
    assert sent_since(page.page, sent) == []   # no reload sent: none can happen
    assert page.js("() => firstToken.state.loads.length") == before
    assert not any('"reload"' in m for m in page.sent)
    page.js("() => { const lim = firstToken.state.limits; firstToken.send({type: 'reset'}); firstToken.send({type: 'set', "
            "settings: {prompt_tokens: lim.prompt_tokens.default, max_new_tokens: lim.max_new_tokens.default}}); }")


def first_shapes_are_outlined(page, events):
    """With no shape run before in the process, the first forward is flagged, and so is each later
    one whose (token rows, logit rows) had not run yet; the page outlines exactly the flagged
    forwards on the lane of forwards, the legend names the outline, and a flagged forward's hover
    says what it was."""
    (load,) = [e for e in events if e["type"] == "model_load"]
    steps = [e for e in events if e["type"] == "step" and e["start"] >= load["end"]]
    flagged = [e for e in steps if e["first_shape"]]
    assert steps[0]["first_shape"] and len(flagged) < len(steps), [(e["tokens"], e["first_shape"]) for e in steps]
    page.js("() => { firstToken.view.right = firstToken.state.latestT; firstToken.refresh(); }")
    drawn = page.js("""() => { const L = firstToken.ui.layouts.timeline;
        return {marks: L.shapes, left: L.f.left, flagged: firstToken.state.steps.filter(st => st.firstShape &&
          st.end >= L.f.left && st.start <= L.f.right).map(st => st.start)}; }""")
    assert [m["start"] for m in drawn["marks"]] == drawn["flagged"]          # one mark per flagged forward in view
    assert {e["start"] for e in flagged} <= set(drawn["flagged"])            # ... which are the events' own
    assert page.page.is_visible("#tl-shape") and "first forward of its shape" in page.page.text_content("#tl-shape")
    # zoomed in on the later request's first forward (a new prompt length): its hover read-out
    st = flagged[-2] if flagged[-1]["kind"] == "decode" and len(flagged) > 1 else flagged[-1]
    page.js("""st => { const d = st.end - st.start; Object.assign(firstToken.view, {paused: true, span: d * 5,
        right: st.end + d * 2}); firstToken.refresh(); }""", st)
    x = page.js("st => firstToken.ui.layouts.timeline.f.x((st.start + st.end) / 2)", st)
    box = page.page.locator("#timeline").bounding_box()
    page.page.mouse.move(box["x"] + x, box["y"] + 8)
    page.wait("() => !document.getElementById('tip').hidden", timeout=5_000)
    tip = page.page.text_content("#tip")
    assert f"first forward of its shape ({st['tokens']} tokens) since the server started: its kernels were set up now" \
        in tip, tip
    page.page.screenshot(path=str(ARTIFACTS / "first-shape-1366x768.png"))
    page.page.set_viewport_size({"width": 390, "height": 844})
    page.js("() => firstToken.refresh()")
    page.page.locator(".timeline-wrap").screenshot(path=str(ARTIFACTS / "first-shape-390x844.png"))
    page.page.set_viewport_size({"width": 1366, "height": 768})
    page.page.mouse.move(0, 0)
    page.js("() => { firstToken.view.paused = false; firstToken.view.span = 20; }")


def median(values):
    """static/core/ft-state.js percentile(values, 50): the element at round(half the index range)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(0.5 * (len(s) - 1) + 0.5))]


def tour_step_run(page, sub, step, n):
    """Start the tour at `step` (its index and preset); wait until n requests of its preset
    finished, in the events published and on the page with every token's arrival here. Their
    requests {id: {arrival, tokens (engine times), finished}} from the events, the page's arrivals
    {id: [...]}, the model_load events, and the figure the lesson quotes."""
    page.js("([i]) => import('ft/tour').then(t => t.start(firstToken.state, firstToken.ui, i))", [step["index"]])
    page.wait("t => document.getElementById('lesson-title').textContent === t", step["title"], timeout=5_000)
    def since_preset(evs):
        at = next((i for i, e in enumerate(evs) if e["type"] == "preset" and e["name"] == step["preset"]), None)
        return [] if at is None else evs[at:]

    got = since_preset(collect(sub, lambda evs: sum(e["type"] == "finished" for e in since_preset(evs)) >= n,
                               timeout=90))
    reqs = {e["id"]: {"arrival": e["t"], "tokens": []} for e in got if e["type"] == "request"}
    for e in got:
        if e["type"] == "token":
            reqs[e["id"]]["tokens"].append(e["t"])
        elif e["type"] == "finished":
            reqs[e["id"]]["finished"] = e
    page.wait("ids => ids.every(id => { const r = firstToken.state.reqs.get(id); return r && r.end !== null && "
              "r.arrivals.length === r.tokens.length && r.arrivals.every(a => a !== null); })",
              [i for i, r in reqs.items() if "finished" in r], timeout=30_000)
    arrivals = page.js("ids => Object.fromEntries(ids.map(id => [id, firstToken.state.reqs.get(id).arrivals]))",
                       list(reqs))
    page.js("() => firstToken.refresh()")    # the banner, written now rather than on the page's 4 Hz tick
    return reqs, arrivals, [e for e in got if e["type"] == "model_load"], page.page.text_content("#lesson-live")


def test_the_tour_ends_with_the_other_suspects_and_quotes_what_the_events_give(browser, app):
    """The tour's last three steps (a buffering proxy, a slow network, a cold start), in presenter
    mode as a class sees it, each apply their preset, spot what shows it, and quote figures equal
    to the events' (the engine's token times, TTFT and stages, the model load) and the page's own
    arrival times."""
    page = Page(browser, app.url + "/?present=1", 1366, 768)
    try:
        steps = page.js("() => import('ft/tour').then(t => t.STEPS.map((s, index) => ({key: s.key, title: s.title, "
                        "preset: s.preset, spot: s.spot, index})))")
        suspects = [s for s in steps if s["key"] in ("proxy", "network", "cold")]   # (choosing a token comes after)
        assert [s["key"] for s in suspects] == ["proxy", "network", "cold"] and suspects[-1]["index"] == len(steps) - 2
        for step in suspects:
            sub = app.driver.events.subscribe(replay=False)
            try:
                reqs, arrivals, loads, shown = tour_step_run(page, sub, step, 3 if step["key"] == "cold" else 2)
            finally:
                sub.close()
            assert shown == quoted(page, step["key"], {i: r for i, r in reqs.items() if "finished" in r}, arrivals, loads)
            spotted = page.js("sels => sels.map(s => [...document.querySelectorAll(s)].filter(e => e.classList.contains('spot')).length)",
                              step["spot"])
            assert all(n >= 1 for n in spotted), (step, spotted)
            for w, h in ((1366, 768), (390, 844)):
                page.page.set_viewport_size({"width": w, "height": h})
                page.js("() => firstToken.refresh()")
                settled(page.page)   # the step scrolls its parts into view again (a screenshot's settle)
                page.page.screenshot(path=str(ARTIFACTS / f"tour-{step['key']}-{w}x{h}.png"))
            page.page.set_viewport_size({"width": 1366, "height": 768})
        page.js("() => import('ft/tour').then(t => t.stop())")
        assert page.errors == []
    finally:
        page.close()


def quoted(page, key, done, arrivals, loads):
    """The figure the tour's step `key` should quote, from the events of its finished requests
    (`done`: tour_step_run's), the page's arrivals here and the model_load events."""
    fmt = lambda v: page.js("v => import('ft/util').then(m => m.fmtS(v))", v)   # noqa: E731
    if key == "proxy":
        gaps = [median([b - a for a, b in zip(r["tokens"], r["tokens"][1:])]) for r in done.values()]
        clumps = sum(len(moments(arrivals[i])) for i in done)
        lags = [median([a - t for a, t in zip(arrivals[i], r["tokens"])]) for i, r in done.items()]
        return (f"{sum(len(r['tokens']) for r in done.values())} tokens made {fmt(median(gaps))} apart arrived here "
                f"in {clumps} clumps (median {fmt(median(lags))} after the engine made them)")
    if key == "network":
        here = median([arrivals[i][0] - r["arrival"] for i, r in done.items()])
        engine = median([r["finished"]["ttft"] for r in done.values()])
        return (f"TTFT here {fmt(here)} vs the engine's {fmt(engine)}: +{fmt(here - engine)} on the way "
                "(injected network delay: 300 ms + up to 100 ms jitter)")
    (load,) = loads
    fin = [r["finished"] for r in done.values()]
    waited, after = [f for f in fin if f["stages"]["load"] > 0], [f for f in fin if not f["stages"]["load"]]
    assert len(waited) == 2 and len(after) == 1
    return (f"model load {fmt(load['seconds'])} · 2 requests waited for it (TTFT {fmt(median([f['ttft'] for f in waited]))}, "
            f"load stage {fmt(median([f['stages']['load'] for f in waited]))}) · later: TTFT {fmt(after[0]['ttft'])}, no load")
