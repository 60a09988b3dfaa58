"""Prefill/decode disaggregation on the page (protocol 13), in Chromium: a disaggregated trace replayed
as a one-file export (file://, the page's own replay) and through the live page's file picker draws a
lane of forwards per instance with its steps, each request's KV transfer on its row and between the
lanes, its bytes and time in the request panel and the tooltip, the `transfer` stage in its TTFT
stages, and the tour's step; the layout checker passes at 1366x768 and 1920x1080, in presenter mode
too. A colocated trace draws none of it.

The disaggregated trace is examples/disaggregation.json: the `disaggregation` preset recorded from
the bundled model through the two engine processes (`make examples-record`); the expected figures
are read from its own `kv_transfer` events. One test drives a live page on the tiny model's two
processes."""
import json
import re

import jsonschema
import pytest

from helpers import ARTIFACTS, ROOT, SCHEMA, settled
from server import export
from test_disagg_app import disagg  # noqa: F401  (a fixture: the app over the tiny model's two engine processes)
from test_layout_browser import assert_readable, open_page
from test_presenter_tour_browser import BOXES, check_step

SCREENS = [("1366x768", 1366, 768), ("1920x1080", 1920, 1080)]


def recorded():
    """The shipped disaggregated example and its largest transfer (a long prompt's)."""
    trace = json.loads((ROOT / "examples" / "disaggregation.json").read_text())
    moves = [e for e in trace if e["type"] == "kv_transfer"]
    return trace, moves, max(moves, key=lambda e: e["bytes"])


def mb(n):
    return f"{n / 1e6:.1f} MB"


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
    """The colour drawn in an instance's lane at the middle of its longest forward of `kind`, the
    view zoomed onto it (a real decode forward is a few px wide at the whole run's scale)."""
    return page.evaluate("""([inst, kind, PIXEL]) => {
      const st = firstToken.state.steps.filter(s => s.kind === kind && (s.instance || 'decode') === inst)
        .sort((a, b) => (b.end - b.start) - (a.end - a.start))[0];
      const v = firstToken.view; v.span = 20 * (st.end - st.start); v.right = st.end + v.span / 2; firstToken.refresh();
      const L = firstToken.ui.layouts.timeline, f = L.f, lane = L.stepLanes[inst];
      const x = f.x((st.start + st.end) / 2), y = lane.y + lane.h - 2;   // the lane's foot: decode tokens, or a prefill's prompt
      return new Function('return ' + PIXEL)()(['timeline', x, y]);
    }""", [instance, kind, PIXEL])


@pytest.mark.parametrize("name,width,height", SCREENS, ids=[s[0] for s in SCREENS])
def test_a_disaggregated_trace_draws_both_instances_and_the_transfer(browser, tmp_path, name, width, height):
    trace, moves, big = recorded()
    validate(trace)
    ctx, page = open_page(browser, exported(tmp_path, trace), width, height)
    try:
        to_end(page, trace[-1]["t"] + 1)   # the whole run in view
        drawn = page.evaluate("firstToken.layout()")
        # two lanes of forwards, each with its instance's steps drawn in it
        lanes = drawn["stepLanes"]
        assert lanes and lanes["prefill"]["y"] + lanes["prefill"]["h"] < lanes["decode"]["y"], lanes
        colour = lambda c: page.evaluate(COLOUR, c)   # noqa: E731
        assert lane_pixel(page, "prefill", "prefill") == colour("prefill")
        assert lane_pixel(page, "decode", "decode") in (colour("decode"), colour("decode-alt"))
        to_end(page, trace[-1]["t"] + 1)
        # the transfers: on their requests' rows and between the lanes, at least a few px wide
        transfers = drawn["transfers"]
        assert {t["id"] for t in transfers} == {m["id"] for m in moves}, transfers
        assert all(t["x1"] - t["x0"] >= 4 for t in transfers)
        assert {t["id"] for t in drawn["transferLinks"]} == {t["id"] for t in transfers}
        t = next(x for x in transfers if x["id"] == big["id"])
        box = page.locator("#timeline").bounding_box()
        assert page.evaluate(PIXEL, ["timeline", (t["x0"] + t["x1"]) / 2, t["y"] + 3]) == colour("transfer")
        # its bytes and time in a tooltip over it
        page.mouse.move(box["x"] + (t["x0"] + t["x1"]) / 2, box["y"] + t["y"] + 3)
        page.wait_for_function("() => !document.getElementById('tip').hidden")
        tip = page.text_content("#tip")
        head = f"KV transfer {mb(big['bytes'])} ({big['tokens']} tokens, {len(big['src_blocks'])} blocks) prefill → decode instance in "
        assert tip.startswith(head), tip
        ms = float(re.match(r"([\d.]+) ms", tip[len(head):]).group(1))
        assert abs(ms - 1e3 * (big["end"] - big["start"])) < 1, tip
        page.mouse.move(0, 0)
        # ... and in the request panel: its two instances, the transfer, the `transfer` stage
        page.evaluate("id => { firstToken.select(id); firstToken.refresh(); }", big["id"])
        sched = page.text_content("#d-sched")
        assert re.search(r"prefill instance: slot \d+, then decode instance: slot \d+", sched), sched
        assert f"KV transfer {mb(big['bytes'])}" in sched, sched
        assert page.locator("#d-accounting .seg.transfer").count() == 1
        assert "KV transfer" in page.evaluate("document.getElementById('chart-stages').data.map(t => t.name)")
        # each instance's slots and blocks, labelled; the legend names the instances
        assert page.is_visible("#pslots-box") and page.text_content("#slots-title") == "Decode instance slots"
        assert page.text_content("#blocks-info").startswith("prefill instance ")
        assert page.is_visible("#tl-disagg")
        # the `disaggregation` lesson's line (the trace's preset event) measures the transfers
        median = sorted(m["bytes"] for m in moves)[len(moves) // 2]
        assert f"{len(moves)} KV transfers: median {mb(median)} in" in page.text_content("#lesson-live")
        ARTIFACTS.mkdir(exist_ok=True)
        assert_readable(page, f"disagg-{name}")
        page.keyboard.press("p")
        page.wait_for_function("document.body.classList.contains('present')")
        assert assert_readable(page, f"disagg-{name}-present")["present"]
    finally:
        ctx.close()


def test_the_tour_has_a_disaggregation_step_only_when_disaggregated(browser, tmp_path):
    ctx, page = open_page(browser, exported(tmp_path, recorded()[0]) + "?present=1", 1366, 768)
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
        assert "prefill instance" in text and " MB" in text and "waiting: others' prefill" in text, text
        assert page.text_content("#tour-pos") == f"{keys.index('disaggregation') + 1} / {len(keys)}"
        # the lesson and the parts it points at in the window together, as every tour step's (presenter mode)
        settled(page)   # a replay sends no preset: its parts kept in view, the page stands still
        page.evaluate("firstToken.refresh()")
        check_step(page.evaluate(BOXES), "disaggregation step")
        page.screenshot(path=str(ARTIFACTS / "disagg-tour-present-1366x768.png"))
        assert page.errors == []
    finally:
        ctx.close()


def test_the_live_pages_replay_draws_a_disaggregated_trace_as_the_export_does(live, browser, tmp_path):
    """Loaded with the live page's file picker (its replay), the same state and the same drawing."""
    path = tmp_path / "disagg.json"
    trace, moves, _ = recorded()
    path.write_text(json.dumps(trace))
    ctx, page = open_page(browser, live.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello")
        page.set_input_files("#trace-file", str(path))
        page.wait_for_function("() => firstToken.replay.player.mode === 'trace' && firstToken.state.instances")
        to_end(page, trace[-1]["t"] + 1)
        drawn = page.evaluate("firstToken.layout()")
        assert drawn["stepLanes"] and {t["id"] for t in drawn["transfers"]} == {m["id"] for m in moves}
        assert page.evaluate("firstToken.state.transfers.length") == len(moves)
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
        assert_readable(page, "colocated-export-1366x768")
        assert page.errors == []
    finally:
        ctx.close()


def test_a_live_page_on_two_engine_processes(disagg, browser):
    """The page on a live disaggregated app (the tiny model's prefill and decode processes): a burst's
    requests are prefilled in the prefill lane, copied, decoded in the decode lane, and each finished
    one's `transfer` stage is its `kv_transfer`'s measured time; the layout holds at 1366x768."""
    ctx, page = open_page(browser, disagg.url + "/", 1366, 768)
    try:
        page.wait_for_function("() => firstToken.state.hello && firstToken.state.instances")
        page.evaluate("firstToken.send({type: 'burst', n: 3, seed: 1})")
        page.wait_for_function("""() => { const s = firstToken.state, done = [...s.reqs.values()].filter(r => r.stages);
          return done.length === 3 && s.transfers.length === 3; }""", timeout=60_000)
        state = page.evaluate("""() => { const s = firstToken.state;
          return {lanes: [...new Set(s.steps.map(x => x.instance))].sort(),
                  moves: Object.fromEntries(s.transfers.map(x => [x.id, x.end - x.start])),
                  stages: Object.fromEntries([...s.reqs.values()].map(r => [r.id, r.stages.transfer]))}; }""")
        assert state["lanes"] == ["decode", "prefill"]
        assert state["stages"].keys() == state["moves"].keys()
        assert all(abs(state["stages"][i] - state["moves"][i]) < 1e-6 and state["moves"][i] > 0 for i in state["moves"])
        page.evaluate("() => { const v = firstToken.view; v.paused = true; v.span = firstToken.state.latestT + 0.5;"
                      " v.right = firstToken.state.latestT + 0.2; firstToken.refresh(); }")
        drawn = page.evaluate("firstToken.layout()")
        assert drawn["stepLanes"] and {t["id"] for t in drawn["transfers"]} == set(state["moves"])
        assert_readable(page, "disagg-live-1366x768")
        assert page.errors == []
    finally:
        ctx.close()
