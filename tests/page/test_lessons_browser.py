"""Lessons that tell the same story every time, in Chromium on the in-process tiny app: every
comparison's two runs start from an empty prefix cache and the page checks it; /embed runs its
?preset= and keeps its own parameters across a reload; in a classroom the presenter is asked
before a lesson cancels students' questions."""
import pytest

from engine.core.request import GenerateRequest
from helpers import ARTIFACTS, page_module, preset_arrives, record_sent, sent_since
from test_classroom import room  # noqa: F401  (a fixture: the classroom app, its engine gated)
from test_layout_browser import open_page


@pytest.mark.slow
def test_every_comparison_runs_both_sides_from_an_empty_cache(live, browser):
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.click("#btn-compare")
        compare = page_module(page, "compare")
        # the comparisons this server offers (the weights one needs both copies: tests/page/test_weights_browser.py)
        for which in page.evaluate("() => [...document.getElementById('c-which').options].map(o => o.value)"):
            page.select_option("#c-which", which)
            page.click("#c-run")
            # drawn while it records: the status counts requests done, the A timeline has rows
            page.wait_for_function("() => /requests done/.test(document.getElementById('c-status').textContent)",
                                   timeout=30_000)
            page.wait_for_function("c => c.runs !== null && !document.getElementById('c-run').disabled", arg=compare,
                                   timeout=240_000)
            runs = page.evaluate("""c => { const r = c.runs; const first = (k) =>
                [...r[k].s.reqs.values()].map(q => q.admits.length ? q.admits[0].cachedTokens : null);
                return {cold: [r.a.emptyCache, r.b.emptyCache], a: first('a'), b: first('b'),
                        status: document.getElementById('c-status').textContent,
                        same: document.getElementById('sheet-compare').dataset.same}; }""", compare)
            assert runs["cold"] == [True, True], (which, runs)
            assert runs["a"] == runs["b"], (which, runs)   # what each request found cached: the same both times
            assert runs["a"][0] == 0
            assert "both from an empty prefix cache" in runs["status"] and runs["same"] == "true"
        assert page.errors == []
    finally:
        ctx.close()


def test_a_comparison_can_be_cancelled(live, browser):
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.click("#btn-compare")
        page.select_option("#c-which", "batching")
        page.click("#c-run")
        page.wait_for_function("() => !document.getElementById('c-cancel').hidden")
        # clicked where it is now, in one go: a CI run's pointer click found the sheet mid-reflow
        # (its status line growing) and, retried, the button gone; the status says why if it is
        ended = page.evaluate("""() => { const b = document.getElementById('c-cancel');
                                         if (b.hidden) return document.getElementById('c-status').textContent;
                                         b.click(); return null; }""")
        assert ended is None, ended
        page.wait_for_function("() => /Cancelled/.test(document.getElementById('c-status').textContent)", timeout=10_000)
        assert page.is_hidden("#c-cancel") and page.is_enabled("#c-run")
        assert page.evaluate("c => c.runs", page_module(page, "compare")) is None
    finally:
        ctx.close()


def test_embed_runs_its_preset_and_keeps_its_parameters_on_reload(live, browser):
    url = live.url + "/embed?preset=queueing&live=1&theme=light&compact=1&panels=timeline,kv"   # live: not its recording
    ctx, page = open_page(browser, url, 640, 400)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        # the queueing preset's lesson, settings and requests (the server's history can hold an
        # earlier test's slots=2 and requests before this page's preset event arrives)
        page.wait_for_function("() => document.getElementById('lesson-title').textContent === "
                               "'The same prompt behind many others'", timeout=20_000)
        page.wait_for_function("() => firstToken.state.settings.slots === 2 && firstToken.state.order.length > 0",
                               timeout=20_000)
        # the preset changed settings, and the address bar says so: the embed's own parameters stay
        page.wait_for_function("() => location.search.includes('slots=2')")
        search = page.evaluate("location.search")
        for kept in ("preset=queueing", "live=1", "theme=light", "compact=1", "panels=timeline%2Ckv"):
            assert kept in search, search
        page.reload()
        page.wait_for_function("() => firstToken.state.hello")
        assert page.evaluate("document.documentElement.dataset.theme") == "light"
        assert page.evaluate("document.body.classList.contains('compact')") and page.is_visible("#kv")
        page.wait_for_function("() => firstToken.state.reqs.size > 0 && [...firstToken.state.reqs.values()]"
                               ".some(r => r.arrival >= firstToken.state.connectT)", timeout=20_000)   # it ran again
        assert page.errors == []
    finally:
        ctx.close()


def test_a_live_embed_without_a_preset_says_what_it_waits_for(live, browser):
    ctx, page = open_page(browser, live.url + "/embed", 640, 400)
    try:
        page.wait_for_function("() => firstToken.state.hello && !document.getElementById('start').hidden")
        assert "nothing is running there yet" in page.text_content("#start")
        live.driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=2))
        page.wait_for_function("() => document.getElementById('start').hidden", timeout=10_000)
    finally:
        ctx.close()


def test_the_presenter_is_asked_before_a_lesson_cancels_students_questions(room, browser):
    ctx, page = open_page(browser, room.url + f"/?key={room.classroom.key}", 1366, 768)
    asked = []
    try:
        page.wait_for_function("() => document.body.dataset.role === 'presenter'")
        room.gate.clear()   # the student's question stays in flight
        room.driver.submit(GenerateRequest(prompt="what is a token?", source="join", label="Ada", max_new_tokens=4))
        page.wait_for_function("() => firstToken.state.order.length === 1")
        page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
        sent = record_sent(page)
        page.click("#presets .preset >> nth=0")
        assert sent_since(page, sent) == []   # the page sent no preset: nothing can reach the server
        assert asked and "Ada" in asked[0] and "cancels" in asked[0]
        assert page.evaluate("firstToken.state.reqs.values().next().value.end") is None   # not sent: nothing cancelled
        page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
        page.click("#presets .preset >> nth=0")
        room.gate.set()
        page.wait_for_function("() => firstToken.state.reqs.size === 0 || "
                               "[...firstToken.state.reqs.values()].every(r => r.source !== 'join')", timeout=10_000)
        assert len(asked) == 2
    finally:
        room.gate.set()
        ctx.close()


def test_the_tour_outlines_only_whole_strips_on_screen(live, browser):
    """At 1366x768 in presenter mode, every part each tour step outlines is entirely in view
    (the step scrolls it there), and no outlined canvas strip is one the step leaves empty."""
    ctx, page = open_page(browser, live.url + "/?present=1", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello && document.body.classList.contains('present')")
        tour = page_module(page, "tour")
        for i in range(page.evaluate("tour => tour.STEPS.length", tour)):
            # the step's preset arrives; the outlined parts are scrolled to and the page stands still
            preset_arrives(page, lambda: page.evaluate("([tour, i]) => tour.start(firstToken.state, firstToken.ui, i)",
                                                       [tour, i]),
                           page.evaluate("([tour, i]) => tour.STEPS[i].preset", [tour, i]))
            spots = page.evaluate("""() => [...document.querySelectorAll('.spot')].filter(e => e.getClientRects().length)
                .filter(e => !e.matches('h2, h3, .strip-head')).map(e => {
                  const r = e.getBoundingClientRect(); let inside = r.top >= -1 && r.bottom <= innerHeight + 1;
                  let by = inside ? null : 'the window ' + innerHeight;
                  for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
                    const cs = getComputedStyle(p);
                    if (cs.overflowY === 'visible') continue;
                    const c = p.getBoundingClientRect();
                    if (!(r.top >= c.top - 1 && r.bottom <= c.bottom + 1)) { inside = false; by = p.className + ' ' + c.top + '-' + c.bottom; }
                  }
                  return {what: e.id || e.className, inside, by, top: r.top, bottom: r.bottom, h: r.height, strip: e.matches('.canvas-wrap, .chart')}; })""")
            assert spots, i
            for spot in spots:
                assert spot["inside"] and (spot["h"] > 40 or not spot["strip"]), (i, spot)
            key = page.evaluate("([tour, i]) => tour.STEPS[i].key", [tour, i])
            if key == "kv":   # with the cache off the KV strip is empty: the step points at the step-time chart
                assert not page.evaluate("document.querySelector('.kv-wrap').classList.contains('spot')")
        assert page.errors == []
    finally:
        ctx.close()


def test_the_idle_lessons_banner_says_when_its_request_did_queue(room, browser):
    """The idle lesson claims its request never queues; on an engine held up (the classroom app's
    gate holds every step, as a busy machine's slow steps do) it did, and the banner says so with
    the measured queue and TTFT, as the page writes them, after the claim."""
    ctx, page = open_page(browser, room.url + f"/?key={room.classroom.key}", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello && document.querySelector(\"[data-preset='idle']\")")
        room.gate.clear()
        page.click("[data-preset='idle']")
        # held: the lesson's one request waits until it has queued a second by the engine's clock
        page.wait_for_function("() => { const r = [...firstToken.state.reqs.values()].find(q => q.source === 'load'), "
                               "c = firstToken.clock; return r && c.offset !== null && performance.now() / 1000 - c.offset - r.arrival >= 1; }",
                               timeout=30_000)
        room.gate.set()
        page.wait_for_function("() => firstToken.state.finishedCount >= 1", timeout=30_000)
        page.evaluate("firstToken.refresh()")
        r = page.evaluate("() => { const r = [...firstToken.state.reqs.values()].find(q => q.source === 'load'); "
                          "return {queue: r.stages.queue, ttft: r.ttft}; }")
        assert r["queue"] >= 0.1 * r["ttft"]   # (what the engine measured: the gate held it a second)
        util = page_module(page, "util")
        queue, ttft = page.evaluate("([u, r]) => [u.fmtS(r.queue), u.fmtS(r.ttft)]", [util, r])
        text = page.text_content("#lesson-text")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "lesson-idle-held-1366x768.png"))
        assert "It never queues" in text and f"On this run it did queue: {queue} of its {ttft} TTFT" in text, text
        assert page.errors == []
    finally:
        room.gate.set()
        ctx.close()
