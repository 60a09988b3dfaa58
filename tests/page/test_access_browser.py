"""The pages for a screen reader, in Chromium: axe-core (the copy that the pinned PyPI package
axe-playwright-python ships, MPL-2.0; requirements-dev.txt, so `make test` installs it on a fresh
machine with no CDN) run inside the page, the app's page after requests have run, a student's
join page with an answer, an /embed and an exported replay opened from file://, on a laptop and
a phone. None may have a critical or serious violation (a control without a name, text under
4.5:1 contrast, a scrolling region a keyboard cannot reach), nor the page-wide ones a screen
reader's user meets first: no <h1>, two landmarks of one name."""
from pathlib import Path

import axe_playwright_python
import pytest

from engine.core.request import GenerateRequest
from engine.teach import record
from helpers import ARTIFACTS, ask_on_phone, collect
from server import export
from test_classroom import room  # noqa: F401  (a fixture: the classroom app)

AXE = (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text()
PAGE_WIDE = {"page-has-heading-one", "landmark-unique", "landmark-one-main", "region"}
SIZES = [("1366x768", 1366, 768), ("phone-390x844", 390, 844)]


def violations(page):
    """axe-core's violations on the page as it is now that matter here: the critical and serious
    ones, and the page-wide ones (PAGE_WIDE), each as (rule, impact, the first nodes' selectors)."""
    # judged at rest: a toast fading in or out is text at part of its contrast for 0.3 s
    page.wait_for_function("() => document.getAnimations().every(a => a.playState !== 'running')", timeout=10_000)
    if not page.evaluate("() => !!window.axe"):
        page.evaluate(AXE)   # through the devtools protocol: the page's CSP refuses an added inline <script>
    got = page.evaluate("axe.run(document, {resultTypes: ['violations']})")["violations"]
    return [(v["id"], v["impact"], [n["target"] for n in v["nodes"][:6]]) for v in got
            if v["impact"] in ("critical", "serious") or v["id"] in PAGE_WIDE]


@pytest.fixture
def ran(room):
    """The classroom app after three requests finished (the request panel has tokens to show)."""
    sub = room.driver.events.subscribe(replay=False)
    for _ in range(3):
        room.driver.submit(GenerateRequest(prompt="We hold these truths to be self-evident", max_new_tokens=6))
    collect(sub, lambda evs: sum(ev["type"] == "finished" for ev in evs) == 3, timeout=60)
    sub.close()
    return room


@pytest.mark.parametrize("name,width,height", SIZES, ids=[s[0] for s in SIZES])
def test_no_serious_violation_on_any_page(ran, browser, tmp_path, name, width, height):
    trace = record.record(ran.driver, 1.0, preset="queueing", drain=True)
    exported = tmp_path / "page.html"
    exported.write_text(export.render(trace, "tiny"))
    ARTIFACTS.mkdir(exist_ok=True)
    found = {}
    ctx = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = ctx.new_page()
        page.goto(ran.url + "/")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
        # one request seen whole by this page (a new page's catch-up leaves out older requests'
        # tokenized events, so their chips are not there to check; how many older ends it holds
        # depends on how many events the recording made, more on a slow machine)
        before = page.evaluate("() => firstToken.state.finishedCount")
        ran.driver.submit(GenerateRequest(prompt="We hold these truths to be self-evident", max_new_tokens=6))
        page.wait_for_function("n => firstToken.state.finishedCount > n && document.querySelector('#d-chips .tok')",
                               arg=before, timeout=30_000)
        found["/"] = violations(page)
        page.goto(ran.url + "/embed?panels=timeline,kv,queue")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
        found["/embed"] = violations(page)
        page.goto(exported.as_uri())
        page.wait_for_function("() => window.firstToken && firstToken.replay.player.mode === 'trace'", timeout=30_000)
        found["export"] = violations(page)
        ask_on_phone(page, ran.url, "What is a token?")
        page.wait_for_function("document.getElementById('f-ttft-engine').textContent !== '—'", timeout=30_000)
        found["/join"] = violations(page)
        page.screenshot(path=str(ARTIFACTS / f"access-join-{name}.png"))
    finally:
        ctx.close()
    assert {where: v for where, v in found.items() if v} == {}


TAPPED = ["#presets .preset", "#btn-tour", "#btn-present", "#btn-send", "#btn-help", "#start-lesson", "#start-tour"]
SIZES_OF = """sels => sels.flatMap(sel => [...document.querySelectorAll(sel)].filter(e => e.getClientRects().length)
  .map(e => { const r = e.getBoundingClientRect(); return [sel, Math.round(r.width), Math.round(r.height)]; }))"""


def test_a_phones_controls_are_a_fingers_size(live, room, browser):
    """On a phone (390x844) the controls a reader or a student taps are at least 44 px tall (the
    lesson buttons were 24): the lessons, the tour, the prompt's Send, the help, the first screen's
    two invitations, and the join page's Join and Send."""
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=3, has_touch=True, is_mobile=True)
    try:
        page = ctx.new_page()
        page.goto(live.url + "/")   # (a classroom's page without the key is a viewer's: no Send, no invitation)
        page.wait_for_function("() => firstToken.state.hello && document.querySelectorAll('#presets .preset').length "
                               "&& !document.getElementById('start').hidden")
        sizes = page.evaluate(SIZES_OF, TAPPED)
        assert {"#presets .preset", "#btn-tour", "#btn-send", "#start-tour"} <= {sel for sel, _, _ in sizes}
        assert [x for x in sizes if x[2] < 44] == []
        page.goto(room.url + "/join?code=owl")
        page.wait_for_selector("#join-form:not([hidden])")
        assert page.locator("#join-form button").bounding_box()["height"] >= 44
        page.fill("#name", "Ada")
        page.click("#join-form button")
        page.wait_for_selector("#ask-form:not([hidden])")
        assert page.locator("#btn-ask").bounding_box()["height"] >= 44
    finally:
        ctx.close()
