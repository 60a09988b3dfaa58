"""Fan-out of events to any number of subscribers, without ever waiting on one.

`publish(event)` serialises a typed event once (`Event.to_dict`, and its JSON text, kept on the
dict as `Wire.json` so a thousand websockets do not encode it a thousand times); the dict goes
into the catch-up a new subscriber starts with (engine/catchup.py: bounded in bytes) and into
every subscription's bounded buffer. When a buffer is full its oldest
events are dropped for that subscriber alone and counted, and the next batch it reads starts
with a `dropped` event saying how many. In-process listeners (metrics) get the typed event.

A token's candidates (`token.top`, protocol 14) are the one field a page may do without: five of
them nearly double a token event. Their JSON is made twice, with and without them (`Wire.lean`),
and each subscription says which it reads (`candidates`, set by the page's `view` message); the
dict itself, which traces and history keep, has them.
"""
from collections import deque
import json
import threading

from .catchup import CatchUp
from .events import Dropped


class Wire(dict):
    """An event's wire dict, with its JSON text (compact separators) made once, and `lean`, the
    text without a token's candidates (the same text for every other event)."""
    __slots__ = ("json", "lean")

    def __init__(self, fields):
        super().__init__(fields)
        self.json = json.dumps(fields, separators=(",", ":"))
        self.lean = self.json if fields.get("top") is None else json.dumps({**fields, "top": None}, separators=(",", ":"))


def encode(events, candidates=True):
    """A JSON array of these event dicts, reusing each Wire's text (without tokens' candidates
    unless `candidates`)."""
    return "[" + ",".join((e.json if candidates else e.lean) if isinstance(e, Wire)
                          else json.dumps(e, separators=(",", ":")) for e in events) + "]"


class Subscription:
    def __init__(self, maxlen, replay=(), wake=None):
        self._buf = deque(replay, maxlen=maxlen)
        self._cond = threading.Condition()
        self._wake = wake       # called when a push finds the buffer empty: lets a reader wait on several things
        self._unreported = 0   # dropped since the last read: the next batch starts with a `dropped` event
        self.closed = False
        self.candidates = False   # its reader shows tokens' candidates (a page's `view` message)

    def push(self, event):
        with self._cond:
            woke = not self._buf
            if len(self._buf) == self._buf.maxlen:
                self._unreported += 1
            self._buf.append(event)
            self._cond.notify()
        if woke and self._wake is not None:
            self._wake()

    def get(self, timeout=None):
        """Every pending event dict (possibly none after `timeout` seconds), oldest first."""
        with self._cond:
            if not self._buf and not self.closed:
                self._cond.wait(timeout)
            out = list(self._buf)
            self._buf.clear()
            if self._unreported:
                first_t = out[0]["t"] if out else 0.0
                out.insert(0, Dropped(t=first_t, count=self._unreported).to_dict())
                self._unreported = 0
            return out

    def close(self):
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class Broadcaster:
    def __init__(self, history=2000, per_client=5000):
        self._subs = set()
        self._listeners = []
        self._catch_up = CatchUp(history)
        self._per_client = per_client
        self._lock = threading.Lock()

    def subscribe(self, replay=True, wake=None):
        """A new subscription (starting with the catch-up unless `replay` is false); `wake()`, if
        given, is called in the publishing thread when an event reaches it with nothing else unread
        (so once per batch the reader takes): quick, never blocking."""
        with self._lock:
            sub = Subscription(self._per_client, self._catch_up.events() if replay else (), wake)
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub):
        with self._lock:
            self._subs.discard(sub)
        sub.close()

    def add_listener(self, fn):
        """`fn(event)` is called with each typed event in the publishing thread: quick, never blocking."""
        self._listeners.append(fn)

    def last(self):
        """The newest event published (its wire dict), or None."""
        with self._lock:
            return self._catch_up.last()

    @property
    def subscribers(self):
        return len(self._subs)

    def candidates_shown(self):
        """Whether any subscriber shows tokens' candidates (observe mode then asks for logprobs)."""
        with self._lock:
            return any(sub.candidates for sub in self._subs)

    def publish(self, event):
        wire = Wire(event.to_dict())
        with self._lock:
            self._catch_up.add(wire)
            subs = list(self._subs)
        for sub in subs:
            sub.push(wire)
        for fn in self._listeners:
            fn(event)
