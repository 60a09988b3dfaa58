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
    if not page.evaluate("() => !!window.axe"):
        page.add_script_tag(content=AXE)
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
        page.wait_for_function("() => firstToken.state.finishedCount >= 3 && document.querySelector('#d-chips .tok')",
                               timeout=30_000)
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
