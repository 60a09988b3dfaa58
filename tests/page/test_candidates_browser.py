"""A token's candidates on the page (issue 42), in Chromium on the in-process tiny app: the page
asks for them (`view`), the sampling lesson's five rows come from the engine's events, hovering a
token in the request's text or on its timeline row shows its five candidates as bars with the
chosen one marked and its probabilities as the event gave them, and the tokens the model gave
under 30 % are marked in the text and on the rows; the lesson's figure counts the top bars taken
as the events say. A classroom phone marks its own answer's uncertain tokens."""
import re

import pytest

from helpers import ask_on_phone, collect, page_module, wait_until
from test_classroom import room  # noqa: F401  (a fixture)
from test_slo_roofline_browser import events, page_at

UNSURE = 0.3   # static/features/ft-candidates.js


@pytest.fixture
def page(browser, live):
    with page_at(browser, live.url + "/") as p:
        yield p


def lesson(page, live):
    """The sampling lesson applied from the page (as its Lessons button does: the page asks for
    candidates first); the engine's events once its five requests finished and the page has them."""
    with events(live) as sub:
        page.evaluate("t => t.apply(firstToken.state, 'sampling')", page_module(page, "teach"))
        evs = collect(sub, lambda got: sum(e["type"] == "finished" for e in got) >= 5, timeout=60)
    page.wait_for_function("() => firstToken.state.finishedCount >= 5", timeout=20_000)
    rows = {e["id"]: e["label"] for e in evs if e["type"] == "request"}
    tokens = {rid: [e for e in evs if e["type"] == "token" and e["id"] == rid] for rid in rows}
    return rows, tokens


def pct(x):
    """ft-candidates.js pct (JavaScript's toFixed rounds the double's exact value half up: 4.25 -> 4.3)."""
    from decimal import ROUND_HALF_UP, Decimal
    return "< 0.1 %" if 0 < x < 0.001 else f"{Decimal(100 * x).quantize(Decimal('0.1'), ROUND_HALF_UP)} %"


def test_hovering_a_token_shows_its_candidates_and_uncertain_ones_are_marked(page, live):
    # a page asks for candidates only while it uses them (the budget of bytes a viewer gets)
    assert not live.driver.events.candidates_shown() and not page.is_checked("#cand-on")
    rows, tokens = lesson(page, live)
    assert live.driver.events.candidates_shown() and page.is_checked("#cand-on")
    assert sorted(rows.values()) == sorted(["greedy", "T 0.7", "T 1", "T 1.5", "top-p 0.5"])
    greedy = next(rid for rid, name in rows.items() if name == "greedy")
    page.evaluate("id => firstToken.select(id)", greedy)
    page.evaluate("firstToken.refresh()")
    mine = tokens[greedy]
    spans = page.locator("#d-text .tok-out")
    assert spans.count() == len(mine) and [spans.nth(i).text_content() for i in range(len(mine))] == [e["text"] for e in mine]
    marked = page.evaluate("() => [...document.querySelectorAll('#d-text .tok-out')].map((e) => e.classList.contains('unsure'))")
    assert marked == [e["p_raw"] < UNSURE for e in mine]
    low = sum(marked)
    assert page.text_content("#d-odds").startswith(f"{low} of {len(mine)} tokens uncertain")
    # the text: hover a token, its bars
    k = next((i for i, e in enumerate(mine) if e["text"].strip()), 0)
    spans.nth(k).hover()
    pop = page.locator("#cand-pop")
    pop.wait_for(state="visible")
    assert pop.get_attribute("hidden") is None
    ev = mine[k]
    assert pop.locator(".cand").get_attribute("data-index") == str(k)
    assert pop.locator(".cand-row").count() == 5 and pop.locator(".cand-row.chosen").count() == 1
    first = pop.locator(".cand-row").first
    assert "chosen" in first.get_attribute("class")              # greedy took the top bar
    assert [pop.locator(".cand-text").nth(i).text_content() for i in range(5)] == \
        [c[1].replace(" ", "·").replace("\n", "⏎") or "∅" for c in ev["top"]]
    assert first.locator(".cand-pct").text_content() == f"{pct(ev['top'][0][3])} → {pct(ev['top'][0][2])}"
    widths = pop.evaluate("p => [...p.querySelectorAll('.cand-bar i.own')].map((e) => parseFloat(e.style.width))")
    assert widths == pytest.approx([100 * c[3] for c in ev["top"]], abs=0.01)
    assert f"chosen with {pct(ev['p'])} as drawn · the model's own {pct(ev['p_raw'])}" in pop.text_content()
    page.mouse.move(5, 5)
    # the timeline: a sampled row's token tick under the pointer, its bars
    hot = next(rid for rid, name in rows.items() if name == "T 1.5")
    page.evaluate("() => { document.getElementById('btn-pause').click(); }")
    j = len(tokens[hot]) // 2
    # scrolled there first, and two frames on: a scroll hides the read-outs (and forgets the pointer)
    page.evaluate("() => new Promise((done) => { document.getElementById('timeline').scrollIntoView({block: 'center'}); "
                  "requestAnimationFrame(() => requestAnimationFrame(done)); })")
    spot = page.evaluate("""([id, j]) => {
        const r = firstToken.state.reqs.get(id), v = firstToken.view, t = r.tokens;
        // zoomed on token j so its nearest neighbour is ~40 px away: a loaded machine's tokens come in
        // bursts, and a whole row in view can put two ticks within a few pixels of each other
        const gap = Math.min(...[t[j] - t[j - 1], t[j + 1] - t[j]].filter((g) => g > 0));
        v.span = Math.max(1e-4, gap * firstToken.ui.layouts.timeline.f.pw / 40); v.right = t[j] + v.span / 2;
        firstToken.refresh();
        const L = firstToken.ui.layouts.timeline;
        const row = L.lanes.findIndex((lane) => lane.reqs.includes(r));
        const box = document.getElementById('timeline').getBoundingClientRect();
        return {x: box.left + L.f.x(r.tokens[j]), y: box.top + L.top + (row + 0.5) * L.rowH, row}; }""", [hot, j])
    assert spot["row"] >= 0
    page.mouse.move(spot["x"], spot["y"])
    page.wait_for_function("([id, j]) => { const c = document.querySelector('#cand-pop .cand'); return c && "
                           "!document.getElementById('cand-pop').hidden && c.dataset.req === id && c.dataset.index === String(j); }",
                           arg=[hot, j], timeout=10_000)
    ev = tokens[hot][j]
    drawn = pop.evaluate("p => [...p.querySelectorAll('.cand-bar i.drawn')].map((e) => parseFloat(e.style.width))")
    expected = [100 * c[2] for c in ev["top"]]
    if ev["token_id"] not in [c[0] for c in ev["top"]]:
        expected.append(100 * ev["p"])                            # the chosen one, listed after the five
    assert drawn == pytest.approx(expected, abs=0.01)
    assert pop.locator(".cand-row.chosen .cand-text").text_content() == (ev["text"].replace(" ", "·") or "∅")
    page.mouse.move(5, 5)
    page.wait_for_function("() => document.getElementById('cand-pop').hidden")
    page.evaluate("() => { firstToken.view.span = 20; document.getElementById('btn-pause').click(); }")   # live again
    # the rows' marks: every uncertain token in view, none other
    marks = page.evaluate("() => { firstToken.refresh(); return firstToken.layout().unsure.map((m) => [m.id, m.index]); }")
    want = {(rid, i) for rid in rows for i, e in enumerate(tokens[rid]) if e["p_raw"] < UNSURE}
    assert set(map(tuple, marks)) == want
    # the lesson's figure: the top bar taken, by row, as the events say
    banner = page.evaluate("() => { firstToken.refresh(); return document.getElementById('lesson-live').textContent; }")
    took = {name: sum(e["top"][0][0] == e["token_id"] for e in tokens[rid]) for rid, name in rows.items()}
    assert f"greedy {took['greedy']}/{took['greedy']}" in banner and took["greedy"] == len(mine)
    assert f"T 1.5 {took['T 1.5']}/{len(tokens[hot])}" in banner
    assert re.search(r"first sample [\d.]+ (ms|s) of TTFT", banner)


def test_the_checkbox_asks_for_candidates_and_another_lesson_gives_them_back(page, live):
    """Off at first (a page gets the lean stream), the checkbox turns them on and off for this page;
    the sampling lesson turns them on and the next lesson off again, unless the reader chose. A
    preset event still on its way from the lesson before (a busy machine's stream runs behind) does
    not switch the view back to that lesson's; another page's lesson after this page's does."""
    assert not live.driver.events.candidates_shown()
    assert "tick “candidates”" in page.evaluate("m => m.requestLine({odds: [], tokenIds: []})", page_module(page, "candidates"))
    page.check("#cand-on")
    wait_until(live.driver.events.candidates_shown, 10, "the checkbox's view")
    page.uncheck("#cand-on")
    wait_until(lambda: not live.driver.events.candidates_shown(), 10, "the view taken back")
    page.reload()   # a new page: no choice yet
    page.wait_for_function("() => firstToken.state.hello")
    teach = page_module(page, "teach")
    page.evaluate("t => t.apply(firstToken.state, 'sampling')", teach)
    wait_until(live.driver.events.candidates_shown, 10, "the lesson's view")
    page.evaluate("t => t.apply(firstToken.state, 'idle')", teach)
    wait_until(lambda: not live.driver.events.candidates_shown(), 10, "the next lesson's view")
    page.wait_for_function("t => t.active && t.active.name === 'idle'", arg=teach, timeout=20_000)
    assert not page.is_checked("#cand-on") and not live.driver.events.candidates_shown()
    # The same, with the events held back as a slow stream would: this page starts "idle" while the
    # "sampling" preset event is still to come, then the "idle" one, then another page's "sampling".
    # (The stand-in `send` tells the server nothing.)
    checked = page.evaluate("""m => {
        const on = () => document.getElementById("cand-on").checked, react = m.reactions(() => true, () => true);
        m.lessonStarts("idle", () => true);
        const seen = [on()];
        for (const name of ["sampling", "idle", "sampling"]) { react.preset({name}); seen.push(on()); }
        return seen;
    }""", page_module(page, "candidates"))
    assert checked == [False, False, False, True]


def test_a_phone_marks_its_own_answers_uncertain_tokens(room, browser):
    """/join at 390x844: the answer a span per token, exactly those the model gave under 30 %
    underlined (the engine's events say which), the count above, and a tap on one its probability."""
    from helpers import ARTIFACTS
    room.driver.update_settings({"max_new_tokens": 24, "temperature": 1.0})
    wait_until(lambda: room.driver.settings.now.sampling.max_new_tokens == 24, 30, "max_new_tokens applied")
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    try:
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        with events(room) as sub:
            ask_on_phone(page, room.url, "Write one sentence about the sea.")
            page.wait_for_function("document.getElementById('answer-state').textContent.includes('done')", timeout=60_000)
            evs = collect(sub, lambda got: any(e["type"] == "finished" for e in got))
        rid = next(e["id"] for e in evs if e["type"] == "request")
        mine = [e for e in evs if e["type"] == "token" and e["id"] == rid]
        marked = page.evaluate("() => [...document.querySelectorAll('#answer .tok-out')].map((e) => e.classList.contains('unsure'))")
        assert marked == [e["p_raw"] < UNSURE for e in mine]
        assert page.text_content("#answer-odds").startswith(f"{sum(marked)} of {len(mine)} tokens the model was unsure of")
        k = next(i for i, e in enumerate(mine) if e["text"].strip())
        page.locator("#answer .tok-out").nth(k).click()
        assert f"the model gave it {pct(mine[k]['p_raw'])}" in page.text_content("#answer-odds")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "join-uncertain-390x844.png"))
        assert errors == []
    finally:
        ctx.close()


def test_an_exported_sampling_lesson_shows_its_candidates_offline(browser, tmp_path):
    """examples/sampling.json (the lesson recorded from the bundled model, `make examples-record`)
    exported to one file and opened from file:// with every other request refused: its tokens'
    bars come from the trace (the greedy row's first candidate is each token itself), the text's
    marks are the trace's uncertain tokens."""
    import json
    from helpers import ROOT
    from server import export
    trace = json.loads((ROOT / "examples" / "sampling.json").read_text())
    path = tmp_path / "sampling.html"
    path.write_text(export.render(trace, "sampling"))
    url = path.as_uri()
    ctx = browser.new_context(viewport={"width": 1366, "height": 768})
    refused = []
    ctx.route("**/*", lambda route: route.continue_() if route.request.url == url else (refused.append(route.request.url), route.abort()))
    try:
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_function("() => window.firstToken && firstToken.replay.player.mode === 'trace'")
        page.evaluate("firstToken.replay.setSpeed(4)")
        page.wait_for_function("() => !firstToken.replay.player.playing", timeout=60_000)
        labels = {e["id"]: e["label"] for e in trace if e["type"] == "request"}
        greedy = next(rid for rid, name in labels.items() if name == "greedy")
        mine = [e for e in trace if e["type"] == "token" and e["id"] == greedy]
        page.evaluate("id => { firstToken.select(id); firstToken.refresh(); }", greedy)
        marked = page.evaluate("() => [...document.querySelectorAll('#d-text .tok-out')].map((e) => e.classList.contains('unsure'))")
        assert marked == [e["p_raw"] < UNSURE for e in mine] and any(marked)
        span = page.locator("#d-text .tok-out").nth(2)
        span.scroll_into_view_if_needed()
        span.hover()
        page.wait_for_function("() => !document.getElementById('cand-pop').hidden")
        rows = page.locator("#cand-pop .cand-row")
        assert rows.count() == 5 and "chosen" in rows.first.get_attribute("class")
        assert [page.locator("#cand-pop .cand-text").nth(i).text_content() for i in range(5)] == \
            [c[1].replace(" ", "·").replace("\n", "⏎") or "∅" for c in mine[2]["top"]]
        assert refused == [] and errors == []
    finally:
        ctx.close()
