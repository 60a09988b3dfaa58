"""Prefill/decode disaggregation on the page (protocol 13), in Chromium: a disaggregated trace replayed
as a one-file export (file://, the page's own replay) and through the live page's file picker draws a
lane of forwards per instance with its steps, each request's KV transfer on its row and between the
lanes, its bytes and time in the request panel and the tooltip, the `transfer` stage in its TTFT
stages, and the tour's step; the layout checker passes at 1366x768 and 1920x1080, in presenter mode
too. A colocated trace draws none of it.

The disaggregated trace is crafted (tests/page/disagg_trace.py) until the engine side lands; the lead
replaces it there with a recording of a live two-process run."""
import json
import re

import jsonschema
import pytest

from disagg_trace import disaggregated_trace
from helpers import ARTIFACTS, ROOT, SCHEMA
from server import export
from test_layout_browser import assert_readable, open_page
from test_presenter_tour_browser import BOXES, SETTLE_MS, check_step

SCREENS = [("1366x768", 1366, 768), ("1920x1080", 1920, 1080)]


def validate(trace):
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(trace)


def exported(tmp_path, trace, name="disagg"):
    path = tmp_path / f"{name}.html"
    path.write_text(export.render(trace, name))
    return path.as_uri()


def to_end(page, span=6.0):
    """The whole trace ingested, the view paused on its last `span` seconds, everything drawn."""
    page.wait_for_function("() => window.firstToken && firstToken.replay.player.mode === 'trace' && firstToken.state.hello")
    page.evaluate("""span => { firstToken.replay.seek(Infinity); firstToken.replay.pause();
      const v = firstToken.view; v.paused = true; v.span = span; v.right = firstToken.state.latestT + 0.2;
      firstToken.refresh(); }""", span)


# A canvas pixel (CSS px) as [r, g, b], and a palette colour as the same.
PIXEL = """([id, x, y]) => { const c = document.getElementById(id), k = c.width / c.getBoundingClientRect().width;
  return Array.from(c.getContext('2d').getImageData(Math.round(x * k), Math.round(y * k), 1, 1).data).slice(0, 3); }"""
COLOUR = """name => { const v = getComputedStyle(document.documentElement).getPropertyValue('--c-' + name).trim();
  const n = parseInt(v.slice(1), 16); return [n >> 16, (n >> 8) & 255, n & 255]; }"""


def lane_pixel(page, instance, kind):
    """The colour drawn in an instance's lane at the middle of its longest forward of `kind` in view."""
    return page.evaluate("""([inst, kind, PIXEL]) => {
      const L = firstToken.ui.layouts.timeline, f = L.f, lane = L.stepLanes[inst];
      const st = firstToken.state.steps.filter(s => s.kind === kind && (s.instance || 'decode') === inst && s.start >= f.left && s.end <= f.right)
        .sort((a, b) => (b.end - b.start) - (a.end - a.start))[0];
      const x = f.x((st.start + st.end) / 2), y = lane.y + lane.h - 2;   // the lane's foot: decode tokens, or a prefill's prompt
      return new Function('return ' + PIXEL)()(['timeline', x, y]);
    }""", [instance, kind, PIXEL])


@pytest.mark.parametrize("name,width,height", SCREENS, ids=[s[0] for s in SCREENS])
def test_a_disaggregated_trace_draws_both_instances_and_the_transfer(browser, tmp_path, name, width, height):
    trace = disaggregated_trace()
    validate(trace)
    ctx, page = open_page(browser, exported(tmp_path, trace), width, height)
    try:
        to_end(page)
        drawn = page.evaluate("firstToken.layout()")
        # two lanes of forwards, each with its instance's steps drawn in it
        lanes = drawn["stepLanes"]
        assert lanes and lanes["prefill"]["y"] + lanes["prefill"]["h"] < lanes["decode"]["y"], lanes
        colour = lambda c: page.evaluate(COLOUR, c)   # noqa: E731
        assert lane_pixel(page, "prefill", "prefill") == colour("prefill")
        assert lane_pixel(page, "decode", "decode") in (colour("decode"), colour("decode-alt"))
        # the transfers: on their requests' rows and between the lanes, at least a few px wide
        transfers = drawn["transfers"]
        assert {t["id"] for t in transfers} >= {"r4", "r5", "r6"}, transfers
        assert all(t["x1"] - t["x0"] >= 4 for t in transfers)
        assert {t["id"] for t in drawn["transferLinks"]} == {t["id"] for t in transfers}
        t = next(x for x in transfers if x["id"] == "r5")
        box = page.locator("#timeline").bounding_box()
        assert page.evaluate(PIXEL, ["timeline", (t["x0"] + t["x1"]) / 2, t["y"] + 3]) == colour("transfer")
        # its bytes and time in a tooltip over it
        page.mouse.move(box["x"] + (t["x0"] + t["x1"]) / 2, box["y"] + t["y"] + 3)
        page.wait_for_function("() => !document.getElementById('tip').hidden")
        tip = page.text_content("#tip")
        assert re.match(r"KV transfer 23\.6 MB \(512 tokens, 32 blocks\) prefill → decode instance in 12 ms", tip), tip
        page.mouse.move(0, 0)
        # ... and in the request panel: its two instances, the transfer, the `transfer` stage
        page.evaluate("firstToken.select('r5'); firstToken.refresh()")
        sched = page.text_content("#d-sched")
        assert "prefill instance: slot 0, then decode instance: slot" in sched and "KV transfer 23.6 MB" in sched, sched
        acc = page.inner_text("#d-accounting")
        assert page.locator("#d-accounting .seg.transfer").count() == 1 and "KV transfer 12 ms" in acc, acc
        assert "KV transfer" in page.evaluate("document.getElementById('chart-stages').data.map(t => t.name)")
        # each instance's slots and blocks, labelled; the legend names the instances
        assert page.is_visible("#pslots-box") and page.text_content("#slots-title") == "Decode instance slots"
        assert page.text_content("#blocks-info").startswith("prefill instance ")
        assert page.is_visible("#tl-disagg")
        # the `disaggregation` lesson's line (the trace's preset event) measures the transfers
        assert "6 KV transfers: median 23.6 MB in 12 ms" in page.text_content("#lesson-live")
        ARTIFACTS.mkdir(exist_ok=True)
        assert_readable(page, f"disagg-{name}")
        page.keyboard.press("p")
        page.wait_for_function("document.body.classList.contains('present')")
        assert assert_readable(page, f"disagg-{name}-present")["present"]
    finally:
        ctx.close()


def test_the_tour_has_a_disaggregation_step_only_when_disaggregated(browser, tmp_path):
    ctx, page = open_page(browser, exported(tmp_path, disaggregated_trace()) + "?present=1", 1366, 768)
    try:
        to_end(page)
        tour = page.evaluate_handle("import('ft/tour')")
        keys = page.evaluate("t => t.stepsFor(firstToken.state).map(s => s.key)", tour)
        assert "disaggregation" in keys and "disaggregation" not in page.evaluate("t => t.STEPS.map(s => s.key)", tour)
        assert keys.index("disaggregation") == keys.index("slow") + 1
        page.evaluate("([t, i]) => t.start(firstToken.state, firstToken.ui, i)", [tour, keys.index("disaggregation")])
        page.evaluate("firstToken.refresh()")
        assert page.text_content("#lesson-title") == "Prompts on one instance, streams on another"
        text = page.text_content("#lesson-text")
        assert "prefill instance" in text and "23.6 MB" in text and "waiting: others' prefill" in text, text
        assert page.text_content("#tour-pos") == f"{keys.index('disaggregation') + 1} / {len(keys)}"
        # the lesson and the parts it points at in the window together, as every tour step's (presenter mode)
        page.wait_for_timeout(SETTLE_MS)   # its parts are scrolled to (ft-tour.js SETTLE_MS); no event ends it
        page.evaluate("firstToken.refresh()")
        check_step(page.evaluate(BOXES), "disaggregation step")
        page.screenshot(path=str(ARTIFACTS / "disagg-tour-present-1366x768.png"))
        assert page.errors == []
    finally:
        ctx.close()


def test_the_live_pages_replay_draws_a_disaggregated_trace_as_the_export_does(live, browser, tmp_path):
    """Loaded with the live page's file picker (its replay), the same state and the same drawing."""
    path = tmp_path / "disagg.json"
    path.write_text(json.dumps(disaggregated_trace()))
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.set_input_files("#trace-file", str(path))
        page.wait_for_function("() => firstToken.replay.player.mode === 'trace' && firstToken.state.instances")
        to_end(page)
        drawn = page.evaluate("firstToken.layout()")
        assert drawn["stepLanes"] and len(drawn["transfers"]) >= 3
        assert page.evaluate("firstToken.state.transfers.length") == 6
        assert page.evaluate("[...firstToken.state.reqs.values()].every(r => r.stages && r.stages.transfer > 0)")
        assert page.errors == []
    finally:
        ctx.close()


def test_a_colocated_trace_draws_no_instance(browser, tmp_path):
    trace = json.loads((ROOT / "examples" / "queueing.json").read_text())
    ctx, page = open_page(browser, exported(tmp_path, trace, "colocated"), 1366, 768)
    try:
        to_end(page, 20)
        drawn = page.evaluate("firstToken.layout()")
        assert drawn["stepLanes"] is None and drawn["transfers"] == [] and drawn["transferLinks"] == []
        assert not page.is_visible("#tl-disagg") and not page.is_visible("#pslots-box")
        assert page.text_content("#slots-title") == "Batch slots"
        assert page.locator("#d-accounting .seg.transfer").count() == 0
        assert "KV transfer" not in page.evaluate("document.getElementById('chart-stages').data.map(t => t.name)")
        assert page.errors == []   # (its layout on every screen: test_layout_browser.py)
    finally:
        ctx.close()
