"""The engine clock, and the broadcaster that hands events to any number of subscribers.

The engine never waits on a subscriber: each one has a bounded buffer; when it is full
the oldest events are dropped for that subscriber alone and counted, and the next batch
it reads starts with a `dropped` event saying how many.
"""
from collections import deque
import threading
import time


class Clock:
    """Seconds since the engine started, monotonic, plus the wall time of t=0."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self.wall0 = time.time()

    def now(self):
        return time.perf_counter() - self._t0


class Subscription:
    def __init__(self, maxlen, replay=()):
        self._buf = deque(replay, maxlen=maxlen)
        self._cond = threading.Condition()
        self.dropped = 0
        self._unreported = 0
        self.closed = False

    def push(self, event):
        with self._cond:
            if len(self._buf) == self._buf.maxlen:
                self.dropped += 1
                self._unreported += 1
            self._buf.append(event)
            self._cond.notify()

    def get(self, timeout=None):
        """Every pending event (possibly none after `timeout` seconds), oldest first."""
        with self._cond:
            if not self._buf and not self.closed:
                self._cond.wait(timeout)
            out = list(self._buf)
            self._buf.clear()
            if self._unreported:
                out.insert(0, {"type": "dropped", "t": out[0]["t"] if out else 0.0, "count": self._unreported})
                self._unreported = 0
            return out

    def close(self):
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class Broadcaster:
    """Fan-out of event dicts to subscriptions and cheap in-process listeners."""

    def __init__(self, history=2000, per_client=5000):
        self._subs = set()
        self._listeners = []
        self._history = deque(maxlen=history)
        self._per_client = per_client
        self._lock = threading.Lock()
        self.enabled = True   # off = instrumentation off (benchmark): nothing is built or sent

    def subscribe(self, replay=True):
        with self._lock:
            sub = Subscription(self._per_client, self._history if replay else ())
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub):
        with self._lock:
            self._subs.discard(sub)
        sub.close()

    def add_listener(self, fn):
        """`fn(event)` is called in the engine thread: it must be quick and never block."""
        self._listeners.append(fn)

    @property
    def subscribers(self):
        return len(self._subs)

    def publish(self, event):
        with self._lock:
            self._history.append(event)
            subs = list(self._subs)
        for sub in subs:
            sub.push(event)
        for fn in self._listeners:
            fn(event)

    def clear_history(self):
        with self._lock:
            self._history.clear()
