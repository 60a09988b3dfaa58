"""A new page's catch-up (engine/catchup.py): bounded in bytes whatever the engine has been through,
with the context its window needs (open requests, the lesson, the measure sheet), in publication
order; and on the tiny model under load, hello plus the catch-up a page receives stays under 100 kB
where the whole history was sent before."""
import json

from engine.broadcast import Broadcaster, Wire, encode
from engine.catchup import CONTEXT_BYTES, WINDOW_BYTES, CatchUp
from engine.events import Finished, Preset, Request, Reset, Token
from helpers import wait_until

FINISHED = dict(reason="length", source="load", prompt_tokens=8, output_tokens=4, e2e=1.0)


def token(t, rid, i):
    top = [[j, f"tok{j}", 0.1, 0.1] for j in range(5)]
    return Token(t=t, id=rid, index=i, token_id=7, text=" word", first=i == 0, sampled=None, sample_s=None,
                 p=0.5, top=top)


def published(events):
    catch = CatchUp(recent=2000)
    wires = [Wire(e.to_dict()) for e in events]
    for w in wires:
        catch.add(w)
    return catch, wires


def hour_of_events():
    """An engine's hour, as events: a request a second, a few tokens each."""
    t = 0.0
    for n in range(3600):
        rid = f"r{n}"
        yield Request(t=t, id=rid, source="load", prompt_tokens=8, max_new_tokens=4, preview="a prompt " * 8)
        for i in range(4):
            yield token(t + 0.1 * (i + 1), rid, i)
        yield Finished(t=t + 0.5, id=rid, **FINISHED)
        t += 1.0


def test_the_catch_up_is_bounded_in_bytes_and_ends_with_the_newest_events():
    catch, wires = published(hour_of_events())
    out = catch.events()
    assert sum(len(w.json) for w in out) <= WINDOW_BYTES + CONTEXT_BYTES
    assert out[-1] is wires[-1] and len(out) > 50      # the newest events, as many as fit
    order = {id(w): i for i, w in enumerate(wires)}
    assert [order[id(w)] for w in out] == sorted(order[id(w)] for w in out)   # publication order
    # every request the window names has its `request` event, though it began before the window
    named = {w["id"] for w in out if w["type"] == "token"}
    assert named <= {w["id"] for w in out if w["type"] == "request"}


def test_open_requests_and_the_lesson_come_however_old():
    waiting = Request(t=0.0, id="old", source="page", prompt_tokens=8, max_new_tokens=4, preview="still waiting")
    done = Request(t=0.1, id="gone", source="page", prompt_tokens=8, max_new_tokens=4, preview="finished long ago")
    preset = Preset(t=0.2, name="queueing", title="Queueing", explain="", watch="", overrides={}, requests=0)
    catch, wires = published([waiting, done, preset, Finished(t=0.3, id="gone", **FINISHED), *hour_of_events()])
    out = catch.events()
    assert wires[0] in out and wires[2] in out    # the open request's row and the lesson
    assert wires[1] not in out and wires[3] not in out    # an ended request outside the window: not needed
    assert out.index(wires[0]) < out.index(wires[2])


def test_a_reset_starts_the_catch_up():
    before = [Request(t=0.0, id="a", source="page", prompt_tokens=8, max_new_tokens=4, preview="x"), token(0.1, "a", 0)]
    catch, wires = published([*before, Reset(t=1.0, cached_blocks=0), token(1.1, "b", 0)])
    assert [w["type"] for w in catch.events()] == ["reset", "token"]   # nothing the page clears at the reset


def test_a_page_connecting_to_a_busy_engine_receives_under_100_kB(live):
    """The tiny engine under load until its recent history is full (its size after an hour too:
    the history is a ring), with a request that waits: hello and the catch-up together (what a
    page receives before it is live) stay under 100 kB, the window ends with the newest events,
    and the catch-up is a small part of the history it replaced."""
    events = live.driver.events
    live.driver.update_settings({"load": True, "rate": 16.0, "prompt_tokens": 16, "max_new_tokens": 8})
    try:
        wait_until(lambda: len(events._catch_up._recent) == events._catch_up._recent.maxlen, 120,
                   "the recent history full")
    finally:
        live.driver.update_settings({"load": False})
    hello = json.dumps(live.driver.hello().to_dict(), separators=(",", ":"))
    sub = events.subscribe()
    try:
        caught = sub.get(timeout=0)
    finally:
        events.unsubscribe(sub)
    history = encode(list(events._catch_up._recent))
    sent = len(hello) + len(encode(caught))
    print(f"hello {len(hello)} B + catch-up {len(encode(caught))} B ({len(caught)} events) = {sent} B; "
          f"the whole history: {len(history)} B")
    assert sent <= 100_000 and len(encode(caught)) < len(history)
