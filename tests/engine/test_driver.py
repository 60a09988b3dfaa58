"""The driver: the engine thread, its inbox, the load thread, and what happens when the
engine itself fails (tiny random model; these tests use the real threads)."""
import time

import pytest

from engine import SettingError
from engine.events import Finished, Rejected, Token
from engine.core.request import GenerateRequest
from helpers import collect, engine_driver, wait_idle


def drain(handle, timeout=60):
    events = list(handle.events(timeout=timeout))
    return [e.token_id for e in events if isinstance(e, Token)], events[-1]


def test_submit_streams_tokens_then_finished(driver):
    ids, last = drain(driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=5, stream=True)))
    assert isinstance(last, Finished) and last.output_tokens == len(ids) and 1 <= len(ids) <= 5


def next_index(events, kind):
    """The index just past the first event of type `kind` (len(events) without one)."""
    return next((i + 1 for i, e in enumerate(events) if e["type"] == kind), len(events))


def test_engine_thread_time_between_forwards_is_measured(driver):
    """/healthz carries the engine thread's time between forwards and the CPU time it ran: all
    of it is outside the forwards (the runner's own sums), none of it while idle."""
    sub = driver.events.subscribe(replay=False)
    t0 = time.perf_counter()
    drain(driver.submit(GenerateRequest(prompt="We hold these truths", max_new_tokens=20, stream=True)))
    wait_idle(driver)
    # The engine thread's last turn ends after the scheduler empties: a `stats` from a later
    # (idle) turn says that turn's sums are in.
    collect(sub, lambda evs: any(e["type"] == "stats" for e in evs[next_index(evs, "finished"):]))
    elapsed = time.perf_counter() - t0
    first = driver.health()[0]["engine_thread"]
    assert 0 < first["between_forwards_cpu_s"] <= first["between_forwards_s"] * 1.05 + 1e-3
    assert first["between_forwards_s"] + driver.engine.runner.wall_s < elapsed
    collect(sub, lambda evs: sum(e["type"] == "stats" for e in evs) >= 2)   # idle turns: no forward
    assert driver.health()[0]["engine_thread"] == first


@pytest.mark.parametrize("bad,field", [
    ({"slots": 0}, "slots"), ({"slots": "4"}, "slots"), ({"slots": 2.5}, "slots"), ({"nope": 1}, "nope"),
    ({"rate": float("nan")}, "rate"), ({"kv_cache": 1}, "kv_cache"), ({"schedule": "fifo"}, "schedule"),
    ({"rate": 1.0, "slots": 99}, "slots"), ({}, "settings"), ([], "settings")])
def test_bad_settings_change_nothing(tiny, bad, field):
    d = engine_driver(tiny, kv_tokens=1024, max_context=256, start=False)
    before = d.settings.now
    with pytest.raises(SettingError) as e:
        d.update_settings(bad)
    assert e.value.field == field
    assert d._inbox.empty() and d.settings.now == before


def test_settings_event_broadcast_and_load_generator(driver):
    sub = driver.events.subscribe(replay=False)
    driver.update_settings({"prompt_tokens": 48, "max_new_tokens": 2, "rate": 16.0, "load": True})
    evs = collect(sub, lambda evs: sum(e["type"] == "request" for e in evs) >= 4)   # ~0.25 s at 16/s
    driver.update_settings({"load": False})
    wait_idle(driver)
    evs += sub.get(1)
    assert any(e["type"] == "settings" and "rate" in e["changed"] for e in evs)
    reqs = [e for e in evs if e["type"] == "request"]
    assert 4 <= len(reqs) <= 40                    # and the generator stopped when told
    assert all(e["source"] == "load" and e["prompt_tokens"] == 48 for e in reqs)
    assert driver.engine.blocks.used == 0


def test_burst_and_reset(driver):
    driver.update_settings({"max_new_tokens": 200})
    sub = driver.events.subscribe(replay=False)
    driver.burst(10)
    evs = collect(sub, lambda evs: any(e["type"] == "token" for e in evs))   # reset mid-run: some are generating
    driver.reset()
    wait_idle(driver)
    evs += sub.get(1)
    fins = [e for e in evs if e["type"] == "finished"]
    assert len(fins) == 10 and all(e["reason"] in ("cancelled", "length", "stop") for e in fins)
    assert any(e["type"] == "reset" for e in evs)
    assert driver.engine.blocks.used == 0 and driver.engine.in_flight == 0


def test_a_fault_outside_the_forward_fails_everything_and_says_so(driver, monkeypatch):
    """An exception in the engine's own bookkeeping (here: the scheduler) is not a forward's
    failure: the driver fails every request in flight, tells every subscriber, turns /healthz
    to 503 naming the fault, and refuses new requests at once instead of letting them hang."""
    sub = driver.events.subscribe(replay=False)
    handle = driver.submit(GenerateRequest(prompt="Four score and seven years ago", max_new_tokens=400, ignore_eos=True, stream=True))
    assert isinstance(handle.next(timeout=30), Token)

    def broken(*a, **kw):
        raise KeyError("injected bookkeeping fault")
    monkeypatch.setattr(driver.engine.scheduler, "schedule", broken)
    _, last = drain(handle)
    assert isinstance(last, Finished) and last.reason == "error" and "injected bookkeeping fault" in last.error
    body, status = driver.health()
    assert status == 503 and body["status"] == "error" and "injected bookkeeping fault" in body["message"]
    fatal = [e for e in sub.get(1) if e["type"] == "error" and e["fatal"]]
    assert fatal and "injected bookkeeping fault" in fatal[0]["message"]
    late = driver.submit(GenerateRequest(prompt="anyone there?", max_new_tokens=3, stream=True))
    (rejected,) = late.events(timeout=5)
    assert isinstance(rejected, Rejected) and rejected.code == "engine_error"
