"""Teaching presets and the decode-cost sweep, through the driver and the websocket control
messages, on the tiny model (the page's presets panel and tour are tested in Chromium)."""
import json

import pytest

from engine import Engine, EngineConfig, SettingError
from engine.timing import measure
from engine.teach import presets
from engine.settings import validate
from engine import events as ev
from helpers import collect, frames, schema_validator


pytestmark = pytest.mark.driver(kv_tokens=2048)   # the `driver` fixture's store (the sweeps measure it whole)


def of(events, kind):
    return [e for e in events if e["type"] == kind]


def test_every_preset_is_valid_on_a_small_and_a_full_engine(tiny):
    for config in (EngineConfig(slots=4, kv_tokens=2048, max_context=512), EngineConfig()):
        specs = Engine(tiny, config).specs
        for p in presets.PRESETS.values():
            full = p.full_settings(specs)
            assert validate(specs, full) == full, p.name
            assert set(full) == set(specs)
            assert p.explain.count(".") >= 2 and p.watch, p.name


def test_a_preset_resets_sets_everything_announces_and_bursts_on_time(driver):
    sub = driver.events.subscribe(replay=False)
    driver.update_settings({"temperature": 0.7, "load": True, "rate": 0.2})   # undone by the preset
    driver.apply_preset("queueing")
    events = collect(sub, lambda ev: len(of(ev, "request")) >= 12 and of(ev, "stats")
                     and of(ev, "stats")[-1]["queue"] > 0)
    kinds = [e["type"] for e in events]
    assert kinds.index("reset") < kinds.index("preset")
    settings = [e for e in of(events, "settings") if "schedule" in e["changed"]][0]["settings"]
    assert settings["slots"] == 2 and settings["temperature"] == 0.0 and settings["load"] is False
    (announced,) = of(events, "preset")
    assert announced["name"] == "queueing" and announced["explain"] == presets.PRESETS["queueing"].explain
    requests = of(events, "request")
    assert all(r["source"] == "load" and r["prompt_tokens"] == 128 for r in requests)
    # one at once, eleven a second later (engine time: not before), all eleven in one engine turn
    assert requests[1]["t"] - requests[0]["t"] >= 0.9
    assert not [s for s in of(events, "step") if requests[1]["t"] < s["start"] < requests[-1]["t"]]


def test_reset_cancels_a_presets_bursts_to_come(driver):
    sub = driver.events.subscribe(replay=False)
    driver.apply_preset("queueing")
    events = collect(sub, lambda ev: of(ev, "request"))   # the first burst is in; the next is 1 s on, the reset a turn
    driver.reset()
    # Two `stats` past the next burst's time (engine time): the second's turn began after it, and
    # the burst would have come at that turn's start.
    events += collect(sub, lambda ev: len([e for e in of(ev, "stats") if e["t"] > of(events, "preset")[0]["t"] + 1])
                      >= 2)
    resets = [i for i, e in enumerate(events) if e["type"] == "reset"]
    assert len(resets) == 2
    assert not of(events[resets[-1]:], "request")


def test_shared_prefix_preset_hits_the_prefix_cache(driver):
    sub = driver.events.subscribe(replay=False)
    driver.apply_preset("shared-prefix")
    events = collect(sub, lambda ev: len(of(ev, "admitted")) >= 6)
    first, *rest = of(events, "admitted")
    assert first["cached_tokens"] == 0
    # the 448 shared tokens are 28 full blocks; the seam may cost the last one
    assert all(a["cached_tokens"] >= 27 * 16 for a in rest)


def test_unknown_preset_is_a_clear_error(driver):
    with pytest.raises(SettingError, match="unknown preset 'nope'.*queueing"):
        driver.apply_preset("nope")
    with pytest.raises(SettingError):
        driver.apply_preset(None)


def test_preset_over_the_websocket_and_an_unknown_one_changes_nothing(live):
    from simple_websocket import Client
    ws = Client.connect(live.ws_url)
    try:
        hello = json.loads(ws.receive(5))[0]
        assert [p["name"] for p in hello["presets"]] == list(presets.PRESETS)
        ws.send(json.dumps({"type": "preset", "name": "long-documentx"}))
        ws.send(json.dumps({"type": "preset", "name": "kv-cache-off"}))
        seen = frames(ws, 30, until=lambda ev: of(ev, "preset"))
    finally:
        ws.close()
    errors = of(seen, "error")
    assert errors[0]["field"] == "name" and "long-documentx" in errors[0]["message"]
    assert of(seen, "reset") and of(seen, "preset")[0]["name"] == "kv-cache-off"
    assert live.driver.settings.now.scheduling.kv_cache is False


def test_measure_sweeps_decode_cost_and_gives_every_block_back(driver):
    sub = driver.events.subscribe(replay=False)
    # as the queueing lesson leaves it: two slots for serving and a small budget; the sweep still runs to
    # the engine's most slots (4) on the whole store, and puts the budget back after
    driver.update_settings({"slots": 2, "cache_tokens": 256})
    driver.measure()
    events = collect(sub, lambda ev: any(e["type"] == "measure" and e["status"] != "running" for e in ev), 120)
    running, *progress, done = of(events, "measure")
    assert running["status"] == "running" and done["status"] == "done", done["message"]
    assert running["batches"] == [1, 2, 4] and running["contexts"] == [128]
    # a page draws the sweep as it goes: one event per point, each with what is timed so far
    # 3 decode points, 4 KV lengths, 4 prefill lengths (64..512: the context is 512)
    assert [p["points_done"] for p in progress] == list(range(1, 12)) and {p["points_total"] for p in progress} == {11}
    assert [len(p["decode"]) for p in progress] == [1, 2, 3] + [3] * 8 and progress[3]["kv"] == done["kv"][:1]
    assert [len(p["prefill"]) for p in progress] == [0] * 7 + [1, 2, 3, 4]
    assert all(p["status"] == "running" and p["eta_s"] >= 0 for p in progress) and progress[-1]["eta_s"] == 0
    points = {(p["batch"], p["context"]) for p in done["decode"]}
    assert points == {(1, 128), (2, 128), (4, 128)}
    assert all(0 < p["floor_s"] < p["step_s"] for p in done["decode"])
    assert [k["tokens"] for k in done["kv"]] == [33, 65, 129, 257]
    assert all(k["cached_s"] > 0 and k["recompute_s"] > 0 for k in done["kv"])
    # the roofline's prediction beside each measured point (an estimate: at least the memory floor)
    assert all(p["predicted_s"] >= p["floor_s"] * 0.99 and p["bound"] in ("memory", "compute") for p in done["decode"])
    assert [p["tokens"] for p in done["prefill"]] == [64, 128, 256, 512]
    assert all(p["step_s"] > 0 and p["predicted_s"] > 0 for p in done["prefill"])
    assert done["prefill"][-1]["predicted_s"] > done["prefill"][0]["predicted_s"]
    assert done["seconds"] > 0 and done["skipped"] == []
    check = schema_validator()
    for e in (running, *progress, done):
        check.validate(e)
    eng = driver.engine
    assert eng.blocks.used == 0 and len(eng.blocks.pool.free) == eng.blocks.capacity
    assert eng.blocks.pool.block_budget == 256 // eng.blocks.pool.block_size
    assert driver.settings.now.scheduling.slots == 2


def test_measure_skips_what_the_free_blocks_cannot_hold_and_says_which(tiny):
    """128 blocks of 16: four 513-position sequences need 132 (skipped, with the counts); a lowered
    budget does not shrink the sweep (it measures the machine), requests in flight do."""
    eng = Engine(tiny, EngineConfig(slots=4, kv_tokens=2048, max_context=1024))
    eng.apply_settings({"cache_tokens": 256})
    (done,) = measure.run(eng)
    assert done.status == "done"
    assert {(p["batch"], p["context"]) for p in done.decode} == {(1, 128), (2, 128), (4, 128), (1, 512), (2, 512)}
    assert done.skipped == [{"sweep": "decode", "batch": 4, "tokens": 512, "blocks_needed": 132, "blocks_free": 128}]
    assert eng.blocks.used == 0
    schema_validator().validate(done.to_dict())


def test_a_seeded_burst_repeats_its_prompts_and_presets_repeat_theirs(driver):
    sub = driver.events.subscribe(replay=False)

    def previews(action, n=3):
        sub.get(0)
        action()
        events = collect(sub, lambda ev: len(of(ev, "request")) >= n)
        return [r["preview"] for r in of(events, "request")[:n]]

    a = previews(lambda: driver.burst(3, seed=7))
    b = previews(lambda: driver.burst(3, seed=7))
    c = previews(lambda: driver.burst(3, seed=8))
    assert a == b and a != c and len(set(a)) == 3
    twice = [previews(lambda: driver.apply_preset("queueing"), 12) for _ in range(2)]
    assert twice[0] == twice[1] and len(set(twice[0])) == 12


def test_a_preset_with_overrides_is_one_side_of_a_comparison(driver):
    """Static vs continuous batching: the same seeded waves of short and long requests, with only
    the schedule changed; the preset event says what was overridden and how many requests come."""
    sub = driver.events.subscribe(replay=False)
    runs = {}
    for schedule in ("static", "mixed"):
        sub.get(0)
        driver.apply_preset("continuous-batching", {"schedule": schedule})
        events = collect(sub, lambda ev: len(of(ev, "finished")) >= 12, 60)
        (announced,) = of(events, "preset")
        assert announced["overrides"] == {"schedule": schedule} and announced["requests"] == 12
        assert driver.settings.now.scheduling.schedule == schedule and driver.settings.now.scheduling.slots == 4
        runs[schedule] = events
    previews = {k: [r["preview"] for r in of(ev, "request")] for k, ev in runs.items()}
    assert previews["static"] == previews["mixed"]
    assert sorted(r["max_new_tokens"] for r in of(runs["mixed"], "request")) == sorted([16, 96, 16, 64, 16, 32] * 2)
    # static: nobody of the second wave is admitted until the whole first batch has finished
    first_wave = {r["id"] for r in of(runs["static"], "request")[:4]}
    done = max(f["t"] for f in of(runs["static"], "finished") if f["id"] in first_wave)
    later = [a for a in of(runs["static"], "admitted") if a["id"] not in first_wave]
    assert min(a["t"] for a in later) >= done
    with pytest.raises(SettingError, match="slots"):
        driver.apply_preset("idle", {"slots": 99})


def test_a_preset_applied_twice_tells_the_same_story(driver):
    """Run 2 of a lesson must not find run 1's prompts in the prefix cache: the preset resets,
    and a reset empties the prefix cache (it said "1008 of 1024 tokens reused" the second time)."""
    sub = driver.events.subscribe(replay=False)
    runs = []
    for _ in range(2):
        driver.apply_preset("queueing", {"prefix_caching": True, "max_new_tokens": 4})
        events = collect(sub, lambda ev: len(of(ev, "finished")) >= 12, timeout=60)
        runs.append(events)
    for events in runs:
        (reset,) = of(events, "reset")
        assert reset["cached_blocks"] == 0
    cached = [[a["cached_tokens"] for a in of(events, "admitted")] for events in runs]
    assert cached[0] == cached[1] and cached[0][0] == 0 and len(cached[0]) == 12
    prompts = [[t["ids"] for t in of(events, "tokenized")] for events in runs]
    assert prompts[0] == prompts[1]   # the same seeded prompts: a warm cache would have hit them


def test_speculative_presets_send_the_same_copy_task_and_compare_on_vs_off(driver):
    """`speculative` (one user) and `speculative-busy` (eight) ask the model to copy the same
    seeded paragraphs as chat requests; with speculation on the steps carry guesses, off they
    do not, and the outputs are the same either way (greedy)."""
    sub = driver.events.subscribe(replay=False)
    outputs = {}
    for name, n in (("speculative", 1), ("speculative-busy", 8)):
        for spec in ("ngram", "off"):
            sub.get(0)
            driver.apply_preset(name, {"speculation": spec, "max_new_tokens": 24})
            events = collect(sub, lambda ev: len(of(ev, "finished")) >= n, 120)
            requests = of(events, "request")
            assert len(requests) == n and all("Copy the following text exactly" in r["preview"] for r in requests)
            steps = of(events, "step")
            assert any(s["spec"] for s in steps) == (spec == "ngram")
            tokens = {}
            for t in of(events, "token"):
                tokens.setdefault(t["id"], []).append(t["token_id"])
            outputs[name, spec] = [tokens[r["id"]] for r in requests]
    assert outputs["speculative", "ngram"] == outputs["speculative", "off"]
    assert outputs["speculative-busy", "ngram"] == outputs["speculative-busy", "off"]
    assert outputs["speculative", "off"][0] == outputs["speculative-busy", "off"][0]   # the same first prompt


def test_the_sampling_lesson_asks_one_question_five_ways_and_repeats(driver):
    """The `sampling` preset: one chat question, five rows at once (greedy, T 0.7, T 1, T 1.5,
    top-p 0.5), each named by its label, every token with its odds; greedy always takes its first
    candidate, and run again (seeded) the lesson gives the same tokens."""
    def run():
        sub = driver.events.subscribe(replay=False)
        sub.candidates = True      # as a page showing candidates (the `view` message): the engine computes them
        driver.apply_preset("sampling")
        events = collect(sub, lambda ev: len(of(ev, "finished")) >= 5)
        driver.events.unsubscribe(sub)
        return events
    first, again = run(), run()
    requests = of(first, "request")
    assert [r["label"] for r in requests] == ["greedy", "T 0.7", "T 1", "T 1.5", "top-p 0.5"]
    assert len({r["preview"] for r in requests}) == 1 and requests[0]["preview"] == presets.SAMPLING_PROMPT
    label = {r["id"]: r["label"] for r in requests}
    tokens = {name: [e for e in of(first, "token") if label.get(e["id"]) == name] for name in label.values()}
    assert all(tokens[name] for name in tokens)
    assert all(t["top"][0][0] == t["token_id"] and t["p"] == 1 for t in tokens["greedy"])
    assert all(t["p"] == pytest.approx(t["p_raw"], abs=2e-3) for t in tokens["T 1"])     # temperature 1: the model's own
    # the top bar: 1.5 flattens it below the model's own, 0.7 and the top-p nucleus (renormalised) raise it
    assert all(t["top"][0][2] <= t["top"][0][3] + 1e-3 for t in tokens["T 1.5"])
    assert all(t["top"][0][2] >= t["top"][0][3] - 1e-3 for t in tokens["T 0.7"] + tokens["top-p 0.5"])
    label_again = {r["id"]: r["label"] for r in of(again, "request")}
    for name in label.values():
        assert [t["token_id"] for t in tokens[name]] == \
            [t["token_id"] for t in of(again, "token") if label_again.get(t["id"]) == name]


def test_the_engine_computes_the_odds_only_while_a_page_shows_candidates(driver):
    """Off while no subscriber shows candidates (they cost over 2 % of a batch-1 step on a CPU,
    bench/candidates.py): the tokens carry no odds; a request asking logprobs still gets its own."""
    from engine.core.request import GenerateRequest
    sub = driver.events.subscribe(replay=False)
    ids = [driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=3, logprobs=lp)).id for lp in (None, 2)]
    events = collect(sub, lambda ev: len(of(ev, "finished")) >= 2)
    tokens = {rid: [e for e in of(events, "token") if e["id"] == rid] for rid in ids}
    assert all(e["p_raw"] is None and e["top"] is None for e in tokens[ids[0]])
    assert all(0 < e["p_raw"] <= 1 and len(e["top"]) == 2 for e in tokens[ids[1]])
    sub.candidates = True
    rid = driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=3)).id
    events = collect(sub, lambda ev: any(e["type"] == "finished" and e["id"] == rid for e in ev))
    assert all(len(e["top"]) == 5 for e in of(events, "token") if e["id"] == rid)


def test_the_priority_lesson_the_urgent_question_overtakes_and_a_batch_job_is_recomputed(tiny):
    """The lesson's own requests, stepped by hand (its urgent question added once the jobs run):
    under the priority policy the question is admitted before the jobs still waiting, it is never
    preempted, and the jobs preempted for blocks come back and compute their tokens again; under
    fcfs the same question waits for every job that came before it."""
    from stepping import Run
    lesson = presets.PRESETS["priority"]
    admitted_before = {}
    for policy in ("priority", "fcfs"):
        engine = Engine(tiny, EngineConfig(slots=4, kv_tokens=2048, max_context=512))
        engine.apply_settings({**lesson.full_settings(engine.specs), "scheduling_policy": policy})
        run, new = Run(engine), engine.settings.now.sampling.max_new_tokens
        jobs, (question,) = lesson.actions[:-1], lesson.actions[-1:]
        for a in jobs:
            run.events += engine.add(engine.new_sequence(a.question(new)))
        while len(run.of(ev.Admitted)) < 4:
            run.step()
        urgent = engine.new_sequence(question.question(question.max_new_tokens))
        run.events += engine.add(urgent)
        run.until_idle()
        order = [e.id for e in run.of(ev.Admitted) if not e.resumed]
        waiting_jobs = [rid for rid in order[4:] if rid != urgent.id]
        admitted_before[policy] = order.index(urgent.id) < min(order.index(j) for j in waiting_jobs)
        preempted = {e.id for e in run.of(ev.Preempted)}
        if policy == "priority":
            assert preempted and urgent.id not in preempted
            for rid in preempted:   # each came back: admitted again, its tokens computed again
                assert [e for e in run.of(ev.Admitted, rid) if e.resumed]
                assert len(run.of(ev.Prefill, rid)) >= 2
        assert [f.reason for f in run.of(ev.Finished, urgent.id)] in (["stop"], ["length"])
    assert admitted_before == {"priority": True, "fcfs": False}
