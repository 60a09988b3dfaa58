"""The page by keyboard alone, in Chromium on the tiny model: the first Tab shows a skip link to
the prompt and the timeline; the guided tour started with Enter gives its banner the focus, so
"Next →" is one Tab away (it took 43), with a focus ring one can see; Escape ends the tour and
gives the focus back, and closes a sheet. A page opened while the model loads says so in its
header, then "live" once the model is in (the load's "ready 100%" stayed all session), and then
reaches every lesson and the tour by Tab."""
import pytest

from helpers import ARTIFACTS, Served, engine_driver, page_module

FOCUSED = "() => { const e = document.activeElement; return e ? (e.id || e.dataset.preset || e.tagName) : null; }"


def outline(page):
    """The focused element's outline as drawn: (style, width px)."""
    return page.evaluate("() => { const cs = getComputedStyle(document.activeElement); "
                         "return [cs.outlineStyle, parseFloat(cs.outlineWidth)]; }")


def test_the_tour_by_keyboard(live, browser):
    ARTIFACTS.mkdir(exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1366, "height": 768})
    try:
        page = ctx.new_page()
        page.goto(live.url + "/")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello && document.getElementById('btn-tour').offsetParent")
        page.keyboard.press("Tab")   # the first Tab: the skip link, shown
        assert page.evaluate(FOCUSED) == "A" and page.evaluate("getComputedStyle(document.activeElement).opacity") == "1"
        page.keyboard.press("Enter")
        assert page.evaluate(FOCUSED) == "centre"
        page.focus("#btn-tour")
        page.keyboard.press("Enter")
        tour = page_module(page, "tour")
        page.wait_for_function("t => t.index === 0", arg=tour)
        assert page.evaluate(FOCUSED) == "lesson" and page.is_visible("#tour-next")
        page.keyboard.press("Tab")   # "← Back" is disabled on step 1: Next is the banner's first stop
        assert page.evaluate(FOCUSED) == "tour-next"
        style, width = outline(page)
        assert style == "solid" and width >= 2   # the focus seen, not only there
        page.screenshot(path=str(ARTIFACTS / "keyboard-tour-next-1366x768.png"))
        page.keyboard.press("Enter")
        page.wait_for_function("t => t.index === 1", arg=tour)
        assert page.text_content("#tour-pos").startswith("2 / ") and page.evaluate(FOCUSED) == "tour-next"
        page.keyboard.press("Escape")
        page.wait_for_function("t => t.index === -1", arg=tour)
        # the step's controls go on the page's next tick (4 Hz: a busy CI run read them a moment before)
        page.wait_for_selector("#lesson-nav", state="hidden", timeout=5_000)
        assert page.evaluate(FOCUSED) == "btn-tour"
        # Escape closes a sheet
        page.focus("#btn-compare")
        page.keyboard.press("Enter")
        assert page.is_visible("#sheet-compare")
        page.keyboard.press("Escape")
        assert page.is_hidden("#sheet-compare")
    finally:
        ctx.close()


@pytest.fixture
def loading_app():
    """The app with no model yet, as `python app.py` serves it while the model loads: `.state`
    takes the backend when the test says so (`.load(driver)`)."""
    from server import create_app
    app = Served(create_app({"TESTING": True}))
    app.state = app.app.extensions["first_token"]
    app.state.set_progress("reading the weights", 0.4)
    yield app
    app.stop()


def test_a_page_opened_while_the_model_loads(loading_app, tiny, browser):
    ctx = browser.new_context(viewport={"width": 1366, "height": 768})
    driver = None
    try:
        page = ctx.new_page()
        page.goto(loading_app.url + "/")
        page.wait_for_function("document.getElementById('conn').textContent.startsWith('loading model: reading the weights')")
        loading_app.state.set_progress("ready", 1.0)
        page.wait_for_function("document.getElementById('conn').textContent.includes('100%')")
        driver = engine_driver(tiny)
        loading_app.state.set_backend(driver)
        page.wait_for_function("() => firstToken.state.hello && document.querySelectorAll('#presets .preset').length")
        page.wait_for_function("document.getElementById('conn').textContent === 'live'")
        # every lesson and the tour in the Tab order, from the top of the page round to it again
        presets = page.evaluate("[...document.querySelectorAll('#presets .preset')].map(b => b.dataset.preset)")
        reached = []
        for _ in range(300):
            page.keyboard.press("Tab")
            got = page.evaluate(FOCUSED)
            if reached and got == reached[0]:
                break
            reached.append(got)
        assert set(presets) | {"btn-tour"} <= set(reached), sorted(set(presets) - set(reached))
        # and one is started from the keyboard: Enter on its button
        page.focus(f"[data-preset='{presets[0]}']")
        page.keyboard.press("Enter")
        page.wait_for_function("name => document.querySelector(`[data-preset='${name}']`).classList.contains('on')",
                               arg=presets[0], timeout=30_000)
    finally:
        ctx.close()
        if driver:
            driver.shutdown()
