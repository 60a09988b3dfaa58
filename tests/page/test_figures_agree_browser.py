"""Figures that agree with the picture at the same moment (issue 32), in Chromium through the
page's own modules: the cold-start lesson counts the requests waiting for the load now, as their
rows show it in the load colour, not only the finished ones."""
from helpers import page_module


def req(rid, arrival, **kw):
    return {"id": rid, "arrival": arrival, "stages": None, "prefills": [], "ttft": None, "rejected": None,
            "end": None, **kw}


def cold_start_figure(page, reqs, latest):
    """The cold-start lesson's figure and the requests the timeline paints as waiting for the load
    (drawLoadWaits' rule, loadWait > 0), on a state holding one measured 3.43 s load from t=10."""
    return page.evaluate("""([d, reqs, latest]) => {
        const s = {loads: [{start: 10, end: 13.43, seconds: 3.43, fromCache: true, reason: 'reload'}],
                   order: reqs.map(r => r.id), reqs: new Map(reqs.map(r => [r.id, r])), latestT: latest};
        return {text: d.proof['cold-start'](s, 10), painted: reqs.filter(r => d.loadWait(r, s) > 0).map(r => r.id)};
      }""", [page_module(page, "delivery"), reqs, latest])


def test_the_cold_start_count_includes_requests_waiting_for_the_load_now(live, browser):
    page = browser.new_page()
    try:
        page.goto(live.url + "/")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello")
        fmt = lambda v: page.evaluate("([u, v]) => u.fmtS(v)", [page_module(page, "util"), v])  # noqa: E731
        # r18 and r19 arrived during the load and wait for their first prefill: two rows in the load colour
        waiting = [req("r18", 10.5), req("r19", 11.0)]
        got = cold_start_figure(page, waiting, 13.6)
        assert got["painted"] == ["r18", "r19"]
        assert got["text"] == f"model load {fmt(3.43)} · 2 requests waited for it (2 still waiting)"
        # r18 finished (its load stage measured), r19 still waits, r20 came after the load: no load
        done = req("r18", 10.5, stages={"load": 2.93, "queue": 2.93}, ttft=3.1, end=13.9,
                   prefills=[{"start": 13.5, "end": 13.55}])
        later = req("r20", 14.0, stages={"load": 0, "queue": 0.01}, ttft=0.2, end=14.5,
                    prefills=[{"start": 14.01, "end": 14.05}])
        got = cold_start_figure(page, [done, req("r19", 11.0), later], 14.6)
        assert got["painted"] == ["r18", "r19"]
        assert got["text"] == (f"model load {fmt(3.43)} · 2 requests waited for it (1 still waiting) "
                               f"(TTFT {fmt(3.1)}, load stage {fmt(2.93)}) · later: TTFT {fmt(0.2)}, no load")
    finally:
        page.close()


def test_a_per_token_objective_under_the_engines_own_step_says_why_it_is_missed(live, browser):
    """The default objectives are a serving benchmark's: where this engine's own decode step is
    already longer than the per-token target, a missed request says so, with the measured step and
    the setting to change; where the target is well above the step, nothing is added."""
    page = browser.new_page()
    try:
        page.goto(live.url + "/")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello")
        fmt = lambda v: page.evaluate("([u, v]) => u.fmtS(v)", [page_module(page, "util"), v])  # noqa: E731
        points = [{"batch": 1, "ms": 150 + i, "kv": True, "guesses": 0} for i in range(5)] + \
                 [{"batch": 4, "ms": 190, "kv": True, "guesses": 0}, {"batch": 1, "ms": 10, "kv": False, "guesses": 0}]
        why = lambda target: page.evaluate(  # noqa: E731
            "([t, target, points]) => t.targetBelowEngine({slo: {tpot_met: false, tpot_target_s: target}}, points)",
            [page_module(page, "targets"), target, points])
        text = why(0.1)
        assert text.startswith(f"The per-token objective ({fmt(0.1)}) is tighter than this engine's own decode step: "
                               f"{fmt(0.152)} at batch 1 (median, measured here)")
        assert f"set the per-token objective to about {fmt(0.35)}" in text
        assert why(0.5) is None
    finally:
        page.close()


def test_a_busy_machine_is_named_against_the_engines_own_quiet_pace(live, browser):
    """Decode steps that take far longer than the same work took here when quiet (each timed
    against the roofline's estimate from the engine's start-up measurements) make the page say the
    machine is busy; at the quiet pace it says nothing."""
    page = browser.new_page()
    try:
        page.goto(live.url + "/")
        page.wait_for_function("() => window.firstToken && firstToken.state.hello")
        got = page.evaluate("""(busy) => {
            const s = firstToken.state;
            const pt = (t, ms, pred, batch) => ({batch, ms, predMs: pred, kv: true, t, len: 10, guesses: 0});
            s.points.length = 0;
            for (let i = 0; i < 24; i++) s.points.push(pt(i * 0.1, 10 * (1 + i % 2), 1 + i % 2, 1 + i % 2));   // quiet: 10x the estimate
            const quiet = busy.pace(s, 0, 2.4);
            for (let i = 0; i < 12; i++) s.points.push(pt(5 + i * 0.1, 60 * (1 + i % 2), 1 + i % 2, 1 + i % 2));  // 6x slower
            const slow = busy.pace(s, 5, 6.2);
            s.latestT = 6.2; busy.update(s);
            const note = document.getElementById('busy-note');
            return {quiet, slow, shown: !note.hidden, text: note.textContent};
          }""", page_module(page, "busy"))
        assert got["quiet"]["factor"] == 1 and not got["quiet"]["busy"]
        assert got["slow"]["busy"] and abs(got["slow"]["factor"] - 6) < 1e-9
        assert got["shown"] and got["text"].startswith("This machine is busy: the engine's decode steps take 6.0× as long")
    finally:
        page.close()
