"""The page on every screen people use, in Chromium (the in-process app on the tiny model):
laptops (1024x768 to 1366x768), a projector (1920x1080, and at 150 % zoom), 2560x1440, a
phone (390x844), presenter mode, an /embed at 640x400, and an exported replay opened from
file://. On each, tests/page/layout_check.js reads the page's own boxes: every visible strip and
chart keeps its least height, no text box overlaps another, none is clipped, key text is at
least 12 CSS px (18 on screen in presenter mode), and the console stays clean. Thirty
classroom students each keep a readable, named row on the presenter's timeline."""
from pathlib import Path

import pytest

from engine.teach import record
from engine.core.request import GenerateRequest
from helpers import ARTIFACTS, collect, wait_until
from server import export
from test_classroom import room  # noqa: F401  (a fixture: the classroom app, its engine gated)

CHECK = (Path(__file__).parent / "layout_check.js").read_text()
TIMELINE_MIN = 220   # CSS px on a laptop (an embed's small frame: 150)
STRIP_MIN = 60       # the KV, blocks and queue strips
CHART_MIN = 150      # plotly charts

# (name, CSS width, CSS height, device scale factor); 1920x1080 at 150 % zoom is a 1280x720
# CSS viewport drawn at 1.5 device pixels per CSS pixel.
SCREENS = [("1024x768", 1024, 768, 1), ("1280x800", 1280, 800, 1), ("1366x768", 1366, 768, 1),
           ("1920x1080", 1920, 1080, 1), ("1920x1080-zoom150", 1280, 720, 1.5), ("2560x1440", 2560, 1440, 1),
           ("phone-390x844", 390, 844, 3)]


def open_page(browser, url, width, height, scale=1):
    ctx = browser.new_context(viewport={"width": width, "height": height}, device_scale_factor=scale)
    page = ctx.new_page()
    page.errors = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    return ctx, page


def layout(page):
    page.evaluate("firstToken.refresh()")
    return page.evaluate(CHECK)


def assert_readable(page, name, timeline_min=TIMELINE_MIN):
    """Every check of the module docstring on the page as it is now; a screenshot either way."""
    ARTIFACTS.mkdir(exist_ok=True)
    r = layout(page)   # (it refreshes every view first: the shot shows what was checked)
    page.screenshot(path=str(ARTIFACTS / f"layout-{name}.png"), full_page=True)
    heights = {s["id"]: s["h"] for s in r["strips"] if s["id"]}
    assert heights.get("timeline", 0) >= timeline_min, (name, heights)
    for strip in ("kv", "blocks", "queue"):
        if strip in heights:
            assert heights[strip] >= STRIP_MIN, (name, strip, heights)
    for chart in ("chart-stages", "chart-steps"):
        if chart in heights:
            assert heights[chart] >= CHART_MIN, (name, chart, heights)
    assert r["overlaps"] == [], (name, r["overlaps"][:6])
    assert r["clipped"] == [], (name, r["clipped"][:6])
    assert r["small"] == [], (name, r["small"][:6])
    labels = r["labels"]["timeline"]
    assert all(lab["px"] >= 12 for lab in labels), (name, labels[:3])
    assert page.errors == [], (name, page.errors)
    return r


@pytest.fixture
def busy(live):
    """The tiny app with some history: requests finished (charts, accounting) and two running."""
    live.driver.update_settings({"max_new_tokens": 8})
    sub = live.driver.events.subscribe(replay=False)
    for _ in range(5):
        live.driver.submit(GenerateRequest(prompt="We hold these truths to be self-evident", max_new_tokens=8))
    collect(sub, lambda evs: sum(ev["type"] == "finished" for ev in evs) == 5, timeout=60)
    return live


@pytest.mark.parametrize("name,width,height,scale", SCREENS, ids=[s[0] for s in SCREENS])
def test_every_strip_and_label_is_readable_on_every_screen(busy, browser, name, width, height, scale):
    ctx, page = open_page(browser, busy.url + "/", width, height, scale)
    try:
        page.wait_for_function("() => firstToken.state.finishedCount >= 5", timeout=20_000)
        assert_readable(page, name)
        if width >= 1024:   # presenter mode is for projectors and laptops
            page.keyboard.press("p")
            page.wait_for_function("document.body.classList.contains('present')")
            r = assert_readable(page, f"{name}-present")
            assert r["present"]
    finally:
        ctx.close()


def test_embed_in_a_small_frame_keeps_its_strips(busy, browser):
    ctx, page = open_page(browser, busy.url + "/embed?panels=timeline,kv", 640, 400)
    try:
        page.wait_for_function("() => firstToken.state.finishedCount >= 5", timeout=20_000)
        r = assert_readable(page, "embed-640x400", timeline_min=150)
        assert "kv" in {s["id"] for s in r["strips"]}
        # every strip the URL asked for is inside the frame, with nothing to scroll to
        fold = page.evaluate("""() => ({scroll: document.scrollingElement.scrollHeight, h: innerHeight,
          bottoms: ['timeline', 'kv'].map(id => document.getElementById(id).getBoundingClientRect().bottom)})""")
        assert fold["scroll"] <= fold["h"] and max(fold["bottoms"]) <= fold["h"], fold
    finally:
        ctx.close()


@pytest.mark.parametrize("kv", [True, False], ids=["by-batch", "by-length"])
def test_a_slow_steps_four_digit_ticks_stand_clear_of_the_axis_title(busy, browser, kv):
    """Steps of a second and more (a busy machine's): the steps chart's y ticks read "1000", four
    digits, beside its "ms per step" title on a phone, in either kind of the chart (the KV cache off
    plots against sequence length). The page's measured steps, stretched to 1.6 s here."""
    ctx, page = open_page(browser, busy.url + "/", 390, 844, 3)
    try:
        page.wait_for_function("() => firstToken.state.points.length > 0", timeout=20_000)
        page.evaluate("""kv => { const s = firstToken.state, top = Math.max(...s.points.map((p) => p.ms));
            s.points.forEach((p) => { p.ms *= 1600 / top; p.kv = kv || p !== s.points[0]; }); s.version++; }""", kv)
        name = f"slow-steps-{'batch' if kv else 'length'}-390x844"
        r = assert_readable(page, name)
        page.locator("#chart-steps").screenshot(path=str(ARTIFACTS / f"layout-{name}-chart.png"))
        assert r["strips"] and page.text_content("#steps-title").endswith("batch size" if kv else "sequence length")
        ticks = page.evaluate("[...document.querySelectorAll('#chart-steps .ytick text')].map((t) => t.textContent)")
        assert any(len(t) >= 4 and t.isdigit() for t in ticks), ticks
    finally:
        ctx.close()


@pytest.mark.parametrize("name,width,height,scale", [("export-1280x800", 1280, 800, 1),
                                                     ("export-phone-390x844", 390, 844, 3)])
def test_an_exported_replay_is_readable_from_file(live, browser, tmp_path, name, width, height, scale):
    trace = record.record(live.driver, 1.5, preset="queueing", drain=True)
    path = tmp_path / "page.html"
    path.write_text(export.render(trace, "tiny"))
    ctx, page = open_page(browser, path.as_uri(), width, height, scale)
    try:
        page.wait_for_function("() => window.firstToken && firstToken.replay.player.mode === 'trace'")
        page.evaluate("firstToken.replay.setSpeed(4)")
        page.wait_for_function("() => !firstToken.replay.player.playing", timeout=30_000)
        r = assert_readable(page, name)
        # a phone sees every panel of the export, not only the timeline
        ids = {s["id"] for s in r["strips"]}
        assert {"timeline", "kv", "queue", "chart-stages"} <= ids, ids
        # and its replay controls on the first screen, before the strips
        page.evaluate("window.scrollTo(0, 0)")
        for control in ("#rp-play", "#rp-scrub", "#rp-speed"):
            box = page.locator(control).bounding_box()
            assert box and box["y"] + box["height"] <= height, (control, box)
    finally:
        ctx.close()


def test_thirty_students_keep_named_rows_on_the_projected_timeline(room, browser):
    """Each student's name on its own timeline row in presenter mode at 1920x1080, in type a
    room can read, by the page's own layout data (what it drew, at what size)."""
    names = [f"Student {i:02d}" for i in range(1, 31)]
    ctx, page = open_page(browser, room.url + f"/?key={room.classroom.key}&present=1", 1920, 1080)
    try:
        page.wait_for_function("() => firstToken.state.hello && document.body.classList.contains('present')")
        room.gate.clear()   # every request waits: thirty rows at once, as when a class asks together
        for name in names:
            room.driver.submit(GenerateRequest(prompt=f"{name} asks what a token is", source="join", label=name, max_new_tokens=4))
        page.wait_for_function("() => firstToken.state.order.length >= 30", timeout=20_000)
        # the strip grows to its rows' height on the next frames
        wait_until(lambda: set(names) <= {lab["full"] for lab in layout(page)["labels"]["timeline"]}, 30,
                   "every student's row drawn")
        r = layout(page)
        drawn = {lab["full"]: lab for lab in r["labels"]["timeline"]}
        assert set(names) <= set(drawn), sorted(set(names) - set(drawn))
        for name in names:
            lab = drawn[name]
            assert lab["text"] == name                     # not cut to an ellipsis
            assert lab["px"] * 1.4 >= 18                   # presenter mode's zoom: 18 px on screen
        rows = sorted(drawn[n]["top"] for n in names)
        assert all(b - a >= drawn[names[0]]["px"] for a, b in zip(rows, rows[1:]))   # rows do not overprint
        # the waiting chips name them too (slots hold none while the gate is shut)
        chips = page.evaluate("[...document.querySelectorAll('#waiting .rchip')].map(c => c.textContent)")
        assert set(names) <= set(chips)
        # one count everywhere, though the held engine sends no stats: the header, the queue strip's
        # heading and the chips all read the thirty waiting rows the timeline draws
        assert page.text_content("#h-waiting") == "30" and page.text_content("#queue-info").startswith("30 waiting")
        page.screenshot(path=str(ARTIFACTS / "layout-classroom-30-present.png"), full_page=True)
        room.gate.set()
        page.wait_for_function("() => firstToken.state.finishedCount >= 30", timeout=60_000)
        page.evaluate("firstToken.refresh()")
        bars = page.evaluate("[...document.querySelectorAll('#chart-stages .ytick text')].map(t => t.textContent)")
        assert len(bars) == 16 and set(bars) <= set(names)   # the TTFT chart names its students too
        assert page.text_content("#h-waiting") == "0"
    finally:
        room.gate.set()
        ctx.close()


def test_older_rows_and_the_kv_limits_are_said_where_they_fit(live, browser):
    """More requests than a 640x400 embed's timeline has rows for: the count of those left out
    takes the top row's place, above every drawn row (it was written over the first row's bar),
    "+1 older row" for one; on a phone the KV strip's note about the limits above its scale fits
    its plot ("capacity 16.4k tok: above this" was cut)."""
    live.driver.update_settings({"max_new_tokens": 4})
    sub = live.driver.events.subscribe(replay=False)
    for _ in range(14):
        live.driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=4))
    collect(sub, lambda evs: sum(ev["type"] == "finished" for ev in evs) == 14, timeout=60)
    sub.close()
    ctx, page = open_page(browser, live.url + "/embed?panels=timeline,kv", 640, 400)
    try:
        page.wait_for_function("() => firstToken.state.finishedCount >= 14", timeout=20_000)
        page.evaluate("firstToken.view.paused = true; firstToken.view.span = 60; firstToken.refresh()")
        got = page.evaluate("firstToken.layout()")
        older, labels = got["older"], got["timeline"]
        assert older and older["hidden"] >= 1, got
        assert older["rowsTop"] > older["top"] and all(lab["top"] >= older["rowsTop"] - 1 for lab in labels), (older, labels[:2])
        assert len(labels) + older["hidden"] == 14
    finally:
        ctx.close()
    ctx, page = open_page(browser, live.url + "/", 390, 844, 3)
    try:
        page.wait_for_function("() => firstToken.state.hello && firstToken.state.last", timeout=20_000)
        page.evaluate("firstToken.refresh()")
        note = page.evaluate("firstToken.layout().kvNote")
        assert note and note["w"] <= note["room"], note
        assert page.errors == []
    finally:
        ctx.close()


def test_a_tapped_rows_read_out_goes_away_on_a_phone(busy, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=3, has_touch=True, is_mobile=True)
    page = ctx.new_page()
    try:
        page.goto(busy.url + "/")
        page.wait_for_function("() => firstToken.state.finishedCount >= 5", timeout=20_000)
        page.evaluate("firstToken.view.paused = true; firstToken.refresh()")
        row = page.evaluate("(() => { const l = firstToken.ui.layouts.timeline, c = document.getElementById('timeline')"
                            ".getBoundingClientRect(); return {x: c.left + l.f.gutter + l.f.pw / 2,"
                            " y: c.top + l.top + l.rowH * (l.lanes.length - 0.5)}; })()")
        page.touchscreen.tap(row["x"], row["y"])
        page.wait_for_function("() => !document.getElementById('tip').hidden", timeout=3_000)
        page.wait_for_function("() => document.getElementById('tip').hidden", timeout=5_000)   # gone by itself
    finally:
        ctx.close()
