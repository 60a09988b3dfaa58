"""Recording a trace: `hello`, then every event a backend publishes for a while.

A trace is the JSON array `[hello, ...events]` that docs/events.schema.json describes (its
top-level schema); the page replays one through the same `FT.ingest` as a live stream.
`record()` subscribes before it takes `hello`, so nothing published in between is lost, then
applies a preset and/or settings (their `settings`/`preset` events are part of the trace)
and collects for `seconds`. With `drain`, it then turns the load generator off and keeps
recording until every request it saw has finished, so the trace ends with the engine idle.
`sync` events are replies to one page's clock probes, never part of a trace.

`python app.py record ...` (app.py) loads the model, builds an EngineDriver and calls this.
"""
import json
import time

from ..settings import SettingError

POLL_S = 0.1
DRAIN_LIMIT_S = 120.0   # a drain that has not ended by then stops anyway (a stuck run is still a trace)


def parse_sets(pairs):
    """`["rate=2", "load=true"]` -> {"rate": 2.0, "load": True}: JSON values where they parse
    (numbers, true/false), else the text (a choice such as schedule=static). The engine's
    `validate` then checks names, kinds and bounds; SettingError names a malformed pair."""
    out = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise SettingError("set", f"expected NAME=VALUE, got {pair!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[name] = value
    return out


def record(backend, seconds, settings=None, preset=None, drain=False, clock=time.monotonic):
    """The trace of `seconds` of `backend` (an EngineDriver), after applying `preset` (a name,
    `backend.apply_preset`) with `settings` over its own, or `settings` alone (both validate
    them as a whole before anything changes: SettingError and nothing recorded on a bad one)."""
    sub = backend.events.subscribe(replay=False)
    sub.candidates = True   # a trace keeps every token's candidates (the engine computes them while one is asked)
    try:
        hello = backend.hello().to_dict()
        events = []
        if preset is not None:
            backend.apply_preset(preset, settings or None)   # the settings over the preset's own
        elif settings:
            backend.update_settings(settings)
        end = clock() + seconds
        while clock() < end:
            events += sub.get(timeout=min(POLL_S, max(0.0, end - clock())))
        if drain:
            events += _drain(backend, sub, events, clock)
    finally:
        backend.events.unsubscribe(sub)
    return [hello] + [ev for ev in events if ev["type"] != "sync"]


def _drain(backend, sub, events, clock):
    """Load generator off, then events until every request seen has ended and a `stats`
    event says nothing runs or waits."""
    open_ids = set()
    for ev in events:
        _track(open_ids, ev)
    if backend.settings.now.load.load:
        backend.update_settings({"load": False})
    more, end = [], clock() + DRAIN_LIMIT_S
    while clock() < end:
        batch = sub.get(timeout=POLL_S)
        idle = False
        for ev in batch:
            _track(open_ids, ev)
            idle = ev["type"] == "stats" and ev["queue"] == 0 and ev["running"] == 0
        more += batch
        if idle and not open_ids and not backend.settings.now.load.load:
            break
    return more


def _track(open_ids, ev):
    if ev["type"] == "request":
        open_ids.add(ev["id"])
    elif ev["type"] in ("finished", "rejected"):
        open_ids.discard(ev["id"])
    elif ev["type"] == "reset":
        open_ids.clear()


def write(trace, path):
    """The trace as compact JSON (one event per line: diffable, and still one JSON array)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(ev, separators=(",", ":")) for ev in trace) + "\n]\n")
