"""What a page that connects is sent after `hello`, before live events: enough to draw the present,
bounded in bytes whatever the engine has been through.

It used to be the last 2,000 events, ~0.9 MB a page after a busy hour: a thousand pages opening
sent over a gigabyte, and held the server's threads while they did. Now it is

* the newest events, as many as fit in `WINDOW_BYTES` of JSON (from the last `reset` at most, as
  the page clears its run there): the recent steps, tokens, stats and settings;
* before them, the context that window needs, newest first within `CONTEXT_BYTES`: the `request`
  event of every request still open (waiting or running: its row on the timeline, however long
  it has waited) and of each request the window names, the last `preset` (the lesson being
  shown) and the last finished `measure` of each weights format (the measure sheet), which no
  window of recent events is sure to hold.

Events are sent as published (the same objects), in publication order; a request whose other
early events (tokenized, admitted, its first tokens) are left out draws from what came (the page
keeps such a request as `partial`). The sizes counted are the events' JSON with tokens'
candidates, the larger of the two texts a page may be sent.
"""
from collections import OrderedDict, deque

WINDOW_BYTES = 48 * 1024
CONTEXT_BYTES = 32 * 1024
KEPT_REQUESTS = 2048   # `request` events kept of open requests (more than the engine's queue and slots hold),
                       # and as many of ended ones (for the window's requests)
ENDS = ("finished", "rejected")


def _sticky_key(wire):
    """The kind of context event `wire` is the latest of (a `preset`, a done `measure` per weights
    format), or None."""
    if wire["type"] == "preset":
        return ("preset",)
    if wire["type"] == "measure" and wire.get("status") == "done":
        return ("measure", wire.get("weights"))
    return None


def _bounded_put(kept, key, value):
    kept[key] = value
    if len(kept) > KEPT_REQUESTS:
        kept.popitem(last=False)


class CatchUp:
    """The events published so far, kept as a new page's catch-up needs them (the caller locks)."""

    def __init__(self, recent=2000, window_bytes=WINDOW_BYTES, context_bytes=CONTEXT_BYTES):
        self._recent = deque(maxlen=recent)
        # context, each (its place in publication order, the event)
        self._sticky = {}                   # _sticky_key -> the latest such event
        self._open = OrderedDict()    # request id -> its `request` event, of requests not yet finished or rejected
        self._ended = OrderedDict()   # ... of those that ended, oldest first
        self._published = 0
        self.window_bytes, self.context_bytes = window_bytes, context_bytes

    def add(self, wire):
        """Keep a published event (a broadcast.Wire: a dict with its JSON text)."""
        self._recent.append(wire)
        self._published += 1
        kind = wire["type"]
        key = _sticky_key(wire)
        if key is not None:
            self._sticky[key] = (self._published, wire)
        elif kind == "request":
            _bounded_put(self._open, wire["id"], (self._published, wire))
        elif kind in ENDS and wire.get("id") in self._open:
            _bounded_put(self._ended, wire["id"], self._open.pop(wire["id"]))
        elif kind == "reset":   # the page clears its requests here: none before it is context
            self._open.clear()
            self._ended.clear()

    def last(self):
        """The newest event published, or None."""
        return self._recent[-1] if self._recent else None

    def events(self):
        """The catch-up: context, then the window, in publication order."""
        window, size = [], 0
        for wire in reversed(self._recent):
            size += len(wire.json)
            if size > self.window_bytes:
                break
            window.append(wire)
            if wire["type"] == "reset":
                break
        window.reverse()
        inside = {id(w) for w in window}   # a suffix of the events: all context is older than it
        named = {w.get("id") for w in window}
        wanted = [*self._sticky.values(), *self._open.values(),
                  *(kept for rid, kept in self._ended.items() if rid in named)]
        context, size = [], 0
        for seq, wire in sorted((k for k in wanted if id(k[1]) not in inside), key=lambda k: k[0], reverse=True):
            size += len(wire.json)
            if size > self.context_bytes:
                break
            context.append((seq, wire))
        return [wire for _, wire in sorted(context, key=lambda k: k[0])] + window
