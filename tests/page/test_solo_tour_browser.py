"""The guided tour and the lessons as most people first see them (issues 43 and 45): the default
(solo) mode on a laptop or a monitor, in Chromium on the tiny model. At every tour step, at
1024x768, 1280x800, 1366x768 and 1920x1080, on a fresh server or after a finished request, the
explanation lies wholly on screen below the header with nothing over it, and a part the step
outlines shows at least 60 px of itself uncovered; judged by what the browser draws on top at each
sampled point (tour_check.js: elementFromPoint), not by boxes meeting the window. The console stays
clean through the tour. On a phone the explanation comes first. Every lesson's banner is on screen
however far the page was scrolled. The header is one row from 1280 px wide and at most 110 px tall
at 1366x768 after a request, each of its figures under the name of its window; the prompt box is on
the first screen once something has run, on a phone too; a lone request fills the timeline's window
and the live window comes back once load runs; a reloaded page's newest request is in the window."""
from pathlib import Path

import pytest

from helpers import ARTIFACTS, LiveApp, frames_drawn, page_module, preset_arrives, settled, wait_until
from test_layout_browser import open_page
from test_presenter_tour_browser import walk_tour

CHECK = (Path(__file__).parent / "tour_check.js").read_text()
SCREENS = [(1024, 768), (1280, 800), (1366, 768), (1920, 1080)]
SEEN_PX = 60       # of at least one outlined part, uncovered
HEADER_MAX_PX = 110


def ask(page, prompt="What is a token?"):
    """Send a prompt from the page's prompt box, as a newcomer does; wait for its answer."""
    before = page.evaluate("firstToken.state.finishedCount")
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    page.wait_for_function("n => firstToken.state.finishedCount > n", arg=before, timeout=30_000)


def check(page):
    page.evaluate("firstToken.refresh()")
    return page.evaluate(CHECK)


def assert_step_seen(r, where):
    text = r["text"]
    assert text, (where, "no explanation shown")
    b = text["box"]
    assert b["top"] >= max(0, r["header"]["bottom"]) - 1 and b["bottom"] <= r["h"] + 1 and \
        b["left"] >= -1 and b["right"] <= r["w"] + 1, (where, "explanation not wholly on screen below the header", b, r["header"])
    assert text["seen"] == text["points"], (where, "explanation covered", text)
    parts = [s for s in r["spots"] if not s["inHeader"]]
    assert parts, (where, "no part outlined outside the header", r["spots"])
    # 60 px of a part, or all of a shorter one (a running request's diagnosis is two lines until it ends)
    shown = [s for s in parts if s["allPx"] and s["seenPx"] >= min(SEEN_PX, s["allPx"])]
    assert shown, (where, "no outlined part shows 60 px uncovered, or all of itself", parts)


def tour(page, label, screens, later=False):
    """Every step from the Guided tour button, Next to the last; each step judged at each of
    `screens` (`later`: two of them again 6 s on, at 1280x800)."""
    def judge(i, key, where, screen):
        assert_step_seen(check(page), where)
        if later and key in ("weights", "speculation") and screen == (1280, 800):
            # seconds on: the legends and the banner's live line have grown; the parts are still seen
            page.wait_for_function("t => firstToken.state.latestT >= t + 6", arg=page.evaluate(
                "firstToken.state.latestT"), timeout=60_000)   # 6 s on the engine's clock (its stats events)
            settled(page)
            assert_step_seen(check(page), where + " 6 s on")
    walk_tour(page, "#btn-tour", f"solo-{label}", judge, screens)


# Each screen once, the two states taken in turn, one walk each judged at its screens (each
# state's layouts, one request row or none, differ from the others' by the width, and both
# states meet a narrow and a wide window).
TOURS = [(False, [(1024, 768), (1366, 768)]), (True, [(1280, 800), (1920, 1080)])]


@pytest.mark.slow
@pytest.mark.parametrize("answered,screens", TOURS, ids=["fresh", "after-a-request"])
def test_every_tour_step_shows_its_explanation_and_a_part_uncovered(live, browser, answered, screens):
    ctx, page = open_page(browser, live.url + "/", *screens[0])
    try:
        page.wait_for_function("() => firstToken.state.hello")
        if answered:
            ask(page)
        tour(page, "answered" if answered else "fresh", screens, later=answered)
    finally:
        ctx.close()


@pytest.mark.slow
def test_on_a_phone_the_explanation_comes_first(live, browser):
    ctx, page = open_page(browser, live.url + "/", 390, 844, 3)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        ask(page)
        tour_mod = page_module(page, "tour")
        for i in range(page.evaluate("t => t.STEPS.length", tour_mod)):
            preset_arrives(page, lambda: page.evaluate("([t, i]) => t.start(firstToken.state, firstToken.ui, i)",
                                                       [tour_mod, i]),
                           page.evaluate("([t, i]) => t.STEPS[i].preset", [tour_mod, i]))
            r = check(page)
            where = f"phone step {i + 1}"
            assert r["text"] and r["text"]["seen"] == r["text"]["points"], (where, r["text"])
            # the explanation first: above the timeline, which follows it down the page
            order = page.evaluate("() => ['lesson', 'timeline'].map(id => document.getElementById(id)"
                                  ".getBoundingClientRect().top)")
            assert order[0] < order[1], (where, order)
        assert page.errors == []
    finally:
        ctx.close()


@pytest.mark.slow
@pytest.mark.parametrize("width,height", [(1366, 768), (1024, 768)], ids=["1366x768", "1024x768"])
def test_every_lessons_banner_is_on_screen_from_wherever_the_page_was(live, browser, width, height):
    ctx, page = open_page(browser, live.url + "/", width, height)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        ask(page)
        for p in page.evaluate("firstToken.state.hello.presets"):
            if p["name"] == "disaggregation":
                continue   # needs a disaggregated server (tests/page/test_disagg_browser.py)
            button = page.locator(f"#presets .preset[data-preset='{p['name']}']")
            button.scroll_into_view_if_needed()   # where the page was scrolled to, the lesson is picked
            button.click()
            page.wait_for_function("t => document.getElementById('lesson-title').textContent === t", arg=p["title"],
                                   timeout=10_000)
            page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")   # and then further down
            settled(page)   # the banner follows the scroll
            r = check(page)
            assert r["text"], p["name"]
            b = r["text"]["box"]
            assert b["top"] >= r["header"]["bottom"] - 1 and b["bottom"] <= height + 1, (p["name"], b)
            assert r["text"]["seen"] == r["text"]["points"], (p["name"], r["text"])
        assert page.errors == []
    finally:
        ctx.close()


HEADER = """() => { const hd = document.querySelector('header.top'), vis = (e) => e.getClientRects().length > 0;
  const figs = [...hd.querySelectorAll('.fig')].filter(vis);
  return {h: hd.getBoundingClientRect().height, w: innerWidth,
    figs: figs.map(f => ({k: f.querySelector('.k').textContent, v: f.querySelector('.v').textContent.replace(/\\s+/g, ' ').trim(),
      top: Math.round(f.getBoundingClientRect().top), right: f.getBoundingClientRect().right,
      clipped: [...f.querySelectorAll('.k, .v')].some(e => e.scrollWidth > e.clientWidth + 1),
      win: f.closest('.fig-group') ? f.closest('.fig-group').querySelector('.win').textContent : null,
      setting: f.matches('.policy, .weights-fig')}))}; }"""


@pytest.mark.parametrize("width,height", [(1280, 800), (1366, 768), (1920, 1080)], ids=["1280x800", "1366x768", "1920x1080"])
def test_the_header_is_one_row_each_figure_under_its_window(live, browser, width, height):
    ctx, page = open_page(browser, live.url + "/", width, height)
    try:
        page.wait_for_function("() => firstToken.state.hello && firstToken.state.last")
        # before anything was judged, goodput is one dash: no second, smaller one beside it
        goodput = page.evaluate("document.getElementById('h-goodput-fig').querySelector('.v').innerText")
        assert goodput.split() == ["—"], goodput
        ask(page)
        page.wait_for_function("() => firstToken.state.last && firstToken.state.last.slo_attainment !== null",
                               timeout=10_000)
        page.evaluate("firstToken.refresh()")   # the 4 Hz tick's work now: the figures written, the row fitted
        frames_drawn(page)
        r = page.evaluate(HEADER)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"solo-header-{width}x{height}.png"), clip={"x": 0, "y": 0, "width": width, "height": 140})
        assert len({f["top"] for f in r["figs"]}) == 1, r["figs"]
        assert all(f["right"] <= width + 1 and not f["clipped"] for f in r["figs"]), r["figs"]
        if (width, height) == (1366, 768):
            assert r["h"] <= HEADER_MAX_PX, r["h"]
        by = {f["k"]: f for f in r["figs"]}
        assert {"TTFT p50", "ITL p50", "tokens/s"} <= set(by), by
        # every measured figure names its window; settings (the schedule) have none
        assert all(f["win"] for f in r["figs"] if not f["setting"]), r["figs"]
        assert by["TTFT p50"]["win"] == "since reset" and by["tokens/s"]["win"] == "last 5 s"
        assert [f["win"] for f in r["figs"] if f["k"].startswith("goodput")] == ["last 30 s"]
        assert page.errors == []
    finally:
        ctx.close()


@pytest.mark.parametrize("width,height,scale", [(1366, 768, 1), (390, 844, 3)], ids=["1366x768", "phone-390x844"])
def test_the_prompt_box_is_on_the_first_screen_once_something_ran(live, browser, width, height, scale):
    ctx, page = open_page(browser, live.url + "/", width, height, scale)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        ask(page)
        ctx2 = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale)
        later = ctx2.new_page()   # a later visitor: the server has history, the empty-state card is gone
        later.goto(live.url + "/")
        later.wait_for_function("() => firstToken.state.hello && firstToken.state.order.length > 0")
        later.evaluate("firstToken.refresh()")
        assert later.is_hidden("#start")
        box = later.locator("#prompt").bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= 0.45 * height, box
        later.fill("#prompt", "And what is a batch?")
        later.press("#prompt", "Enter")
        later.wait_for_function("() => [...firstToken.state.reqs.values()].some(r => r.source === 'page' && "
                                "r.arrival >= firstToken.state.connectT)", timeout=10_000)
        ctx2.close()
    finally:
        ctx.close()


FIT = """() => { const s = firstToken.state, v = firstToken.view, L = firstToken.ui.layouts.timeline;
  // a finished request lasts until its last token arrived here (ft-window.js): what the window fits
  const r = s.reqs.get(s.order[s.order.length - 1]);
  const end = r.end === null ? s.latestT : Math.max(r.end, ...r.arrivals.filter(a => a !== null));
  return {span: v.span, fitted: !!v.fitted, dur: end - r.arrival, left: L.f.left, right: L.f.right,
          arrival: r.arrival, end, px: L.f.x(end) - L.f.x(r.arrival), pw: L.f.pw, label: document.getElementById('span-label').textContent,
          title: document.getElementById('d-title').textContent, rows: L.labels.map(l => l.full), id: r.id}; }"""


def test_a_lone_request_fills_the_window_and_load_gives_the_live_one_back(live, browser):
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        ask(page)
        page.evaluate("firstToken.refresh()")
        f = page.evaluate(FIT)
        assert f["fitted"] and "fitted" in f["label"], f
        assert f["left"] <= f["arrival"] and f["end"] <= f["right"], f            # all of it in view
        # it fills the plot, or the window is at its narrowest (the tiny model answers in ~0.1 s)
        assert f["px"] >= 0.9 * f["pw"] or f["span"] <= 0.26, f
        assert f["span"] < 20 / 10, f                                              # not the 20-s window's sliver
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "solo-first-request-1366x768.png"))
        # a reloaded page: the request panel's newest request is on the timeline beside it
        page.reload()
        page.wait_for_function("() => firstToken.state.hello && firstToken.state.order.length > 0")
        page.wait_for_function("() => (firstToken.refresh(), document.getElementById('d-title').textContent"
                               ".includes('(newest)'))")   # the history in: its newest request selected
        f2 = page.evaluate(FIT)
        assert f2["title"].startswith(f2["id"] + " ") and "(newest)" in f2["title"], f2
        assert f2["id"] in f2["rows"] and f2["left"] <= f2["arrival"] and f2["end"] <= f2["right"], f2
        # load starts: the live 20-s window again
        page.evaluate("firstToken.send({type: 'load', on: true})")
        page.wait_for_function("() => firstToken.state.settings.load === true")
        page.evaluate("firstToken.refresh()")
        f3 = page.evaluate(FIT)
        assert not f3["fitted"] and f3["span"] == 20 and f3["label"] == "20 s", f3
        page.evaluate("firstToken.send({type: 'load', on: false})")
        assert page.errors == []
    finally:
        ctx.close()


def test_a_lessons_requests_stay_in_the_window_after_they_end(live, browser):
    """The queueing lesson's twelve requests end a few seconds in; a minute later (the window
    placed at that engine time) the window still holds all of them and the lesson's start."""
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.click("#presets .preset[data-preset='queueing']")
        page.wait_for_function("() => { const s = firstToken.state; return s.order.length >= 12 && "
                               "[...s.reqs.values()].every(r => r.end !== null); }", timeout=60_000)
        w = page.evaluate("""([win, teach]) => { const s = firstToken.state, v = {...firstToken.view, paused: false};
            const lesson = teach.lessonSpan(s), ends = [...s.reqs.values()].map(r => r.end);
            win.place(v, s, Math.max(...ends) + 60, lesson);
            return {left: v.right - v.span, right: v.right, t: lesson.t, first: Math.min(...[...s.reqs.values()].map(r => r.arrival)),
                    last: Math.max(...ends), fitted: v.fitted && v.fitted.ids.length, n: s.order.length}; }""",
                          [page_module(page, "window"), page_module(page, "teach")])
        assert w["fitted"] == w["n"] >= 12, w
        assert w["left"] <= w["t"] <= w["first"] and w["last"] <= w["right"], w
        assert w["right"] - w["left"] < 2 * (w["last"] - w["t"]) + 1, w   # fitted, not a window of the minute since
        assert page.errors == []
    finally:
        ctx.close()


@pytest.fixture
def cold(tiny):
    """The tiny model's app whose reload lasts until the test lets it end (`cold.loaded`, set;
    `cold.loading`, set while it runs): the cold-start lesson's requests come after it, so the
    page has no request while the model loads."""
    import threading
    from engine import EngineConfig
    loading, loaded = threading.Event(), threading.Event()

    def loader():
        loading.set()
        loaded.wait(60)   # until the test has seen the page during the load (a liveness bound)
        return tiny
    app = LiveApp(tiny, EngineConfig(slots=4, kv_tokens=4096, max_context=512), loader=loader)
    app.loading, app.loaded = loading, loaded
    yield app
    loaded.set()
    app.stop()


@pytest.mark.parametrize("present", [False, True], ids=["solo", "presenter"])
def test_the_empty_state_card_leaves_a_cold_starts_timeline_alone(cold, browser, present):
    """Step 12 at 1280x800: during the reload the empty-state card ("Nothing has run yet…")
    covered the outlined timeline where the loading band is drawn."""
    ctx, page = open_page(browser, cold.url + ("/?present=1" if present else "/"), 1280, 800)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.evaluate("firstToken.refresh()")
        assert page.is_visible("#start")   # a fresh page: the invitation
        tour_mod = page_module(page, "tour")
        n = page.evaluate("t => t.STEPS.findIndex(x => x.key === 'cold')", tour_mod)
        page.evaluate("([t, i]) => t.start(firstToken.state, firstToken.ui, i)", [tour_mod, n])
        # while the model loads no request has come: the card stays away, the timeline is seen
        title = page.evaluate("firstToken.state.hello.presets.find(p => p.name === 'cold-start').title")
        page.wait_for_function("t => document.getElementById('lesson-title').textContent === t", arg=title)
        wait_until(cold.loading.is_set, 30, "the reload begun")   # into the load
        assert page.evaluate("firstToken.state.order.length") == 0
        page.evaluate("firstToken.refresh()")
        assert page.is_hidden("#start")
        r = check(page)
        timeline = [x for x in r["spots"] if "timeline-wrap" in x["what"]]
        assert timeline and timeline[0]["seenPx"] >= SEEN_PX, r["spots"]
        cold.loaded.set()
        assert page.errors == []
    finally:
        ctx.close()
