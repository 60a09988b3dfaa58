"""A cold start on demand: the model loaded again while the engine runs (engine/model/reload.py), the
`load` stage of the requests that waited for it, the `cold-start` preset, /healthz and /metrics
(tiny random model; the "load" sleeps a known time so the stage can be checked against it); and
the first forward of each new shape in the process, marked in its `step` event."""
import time

import pytest

from engine import Engine, EngineConfig, SettingError
from engine.model import reload, runner
from engine import events as ev
from engine.core.request import GenerateRequest
from engine.settings import validate
from helpers import collect, engine_driver, tiny_bundle
from server.metrics import EngineMetrics
from stepping import Run

LOAD_S = 0.3


def slow_loader():
    time.sleep(LOAD_S)          # a load that takes a known time (the real one reads the disk cache)
    return tiny_bundle()


pytestmark = pytest.mark.driver(loader=slow_loader, start=False)   # the `driver` fixture: started by the test


def finished(events):
    return {e["id"]: e for e in events if e["type"] == "finished"}


def test_requests_that_waited_for_the_load_carry_it_as_their_load_stage(driver):
    sub = driver.events.subscribe(replay=False)
    waiting = driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=4))
    driver.reload()
    driver.start()              # the request and the reload were queued first: it waits for the load
    events = collect(sub, lambda evs: waiting.id in finished(evs))
    (load,) = [e for e in events if e["type"] == "model_load"]
    assert load["reason"] == "reload" and load["seconds"] >= LOAD_S and load["end"] - load["start"] == load["seconds"]
    first = finished(events)[waiting.id]
    assert first["stages"]["load"] == pytest.approx(load["seconds"], abs=1e-9)
    assert sum(first["stages"].values()) == pytest.approx(first["ttft"], abs=1e-9)   # still adds up
    assert first["stages"]["queue"] >= 0

    later = driver.submit(GenerateRequest(prompt="He has refused his Assent", max_new_tokens=4))
    events = collect(sub, lambda evs: later.id in finished(evs))
    assert finished(events)[later.id]["stages"]["load"] == 0.0      # after the load: nothing to wait for
    health, status = driver.health()
    assert status == 200 and health["load_s"] == round(load["seconds"], 3)
    eng = driver.engine
    assert eng.blocks.used == 0 and eng.scheduler.slots == [None] * eng.scheduler.max_slots


def test_the_cold_start_preset_reloads_as_its_first_requests_arrive(driver):
    driver.start()
    sub = driver.events.subscribe(replay=False)
    driver.apply_preset("cold-start")
    events = collect(sub, lambda evs: len(finished(evs)) >= 3, timeout=60)
    (load,) = [e for e in events if e["type"] == "model_load"]
    done = sorted(finished(events).values(), key=lambda e: e["t"])
    assert [e["stages"]["load"] == pytest.approx(load["seconds"], abs=1e-9) for e in done[:2]] == [True, True]
    assert done[2]["stages"]["load"] == 0.0 and done[2]["ttft"] < done[0]["ttft"]


def test_an_engine_built_in_memory_cannot_reload_and_nothing_changes(tiny):
    d = engine_driver(tiny, slots=2, kv_tokens=512, max_context=256, start=False)
    with pytest.raises(SettingError) as e:
        d.reload()
    assert e.value.field == "reload" and d._inbox.empty()


def test_metrics_report_the_last_load():
    m = EngineMetrics("m", cache_blocks=10)
    m.on_event(ev.ModelLoad(t=5.0, start=2.0, end=5.0, seconds=3.0, from_cache=True, reason="reload"))
    value = lambda name: m.registry.get_sample_value(name, {"model_name": "m"})  # noqa: E731
    assert value("first_token:model_load_seconds") == 3.0 and value("first_token:model_loads_total") == 1


def test_a_reload_that_cannot_happen_or_fails_is_said_and_serving_carries_on(tiny):
    def broken():
        raise OSError("the disk cache is gone")
    for loader, said in ((None, "not loaded from disk"), (broken, "the disk cache is gone")):
        d = engine_driver(tiny, slots=2, kv_tokens=512, max_context=256, loader=loader)
        try:
            sub = d.events.subscribe(replay=False)
            d.apply_preset("cold-start")
            events = collect(sub, lambda evs: len(finished(evs)) >= 3)
            errors = [e for e in events if e["type"] == "error"]
            assert len(errors) == 1 and said in errors[0]["message"] and not errors[0]["fatal"]
            assert not [e for e in events if e["type"] == "model_load"] and d.failure is None
            assert all(e["reason"] == "length" or e["reason"] == "stop" for e in finished(events).values())
        finally:
            d.shutdown()


def test_the_first_forward_of_each_new_shape_is_marked_and_a_reload_keeps_them(tiny):
    """A forward's shape is its token rows and its logit rows (engine/model/runner.py): requests of
    known prompt lengths and output counts, one at a time and two together, make known shapes;
    exactly the first forward of each is marked. A reload keeps them (the kernels set up live in
    the process, measured): only a shape never run is new after it."""
    runner.SHAPES.clear()   # as in a fresh process: this one's other tests ran the tiny model's shapes
    engine = Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, max_context=512))
    engine.apply_settings(validate(engine.specs, {"prefix_caching": False}))   # every prompt token computed
    text = "When in the Course of human events, it becomes necessary for one people " * 2

    def steps(*requests):
        """(tokens, first_shape) of each forward that serves `requests` ((prompt tokens, new tokens),
        added together) to the end."""
        run = Run(engine)
        for n, new in requests:
            rid = run.add(text, prompt_tokens=n, max_new_tokens=new, ignore_eos=True)
            assert [e.n for e in run.of(ev.Tokenized, rid)] == [n]
        run.until_idle()
        return [(e.tokens, e.first_shape) for e in run.of(ev.Step)]

    assert steps((20, 3)) == [(20, True), (1, True), (1, False)]           # a prefill, then decodes of one row
    assert steps((20, 2)) == [(20, False), (1, False)]                      # the same shapes again
    assert steps((12, 3), (12, 3)) == [(24, True), (2, True), (2, False)]   # both prompts in one forward
    assert steps((24, 1)) == [(24, True)]            # 24 token rows again, but one logit row where that had two
    reload.run(engine, lambda: tiny)                 # the model loaded again: a new runner, the same process
    assert steps((20, 2), (12, 1)) == [(32, True), (1, False)]
    assert steps((20, 2)) == [(20, False), (1, False)]
