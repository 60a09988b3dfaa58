"""What lies between the engine and a client, made real on demand: a buffering proxy and an
injected network delay (settings `buffer_ms`, `buffer_bytes`, `net_latency_ms`, `net_jitter_ms`;
all 0, off, by default).

The article's other suspects: a token can be produced on time and still reach its reader late
(a slow network) or in clumps (a proxy or framework that buffers responses). Here both act on
the way out, after the engine has timed everything, so the engine's own figures do not change
while what the client sees does:

* the proxy holds what passes through it and lets it all go at once every `buffer_ms`
  milliseconds (counted from the first thing held), or as soon as it holds `buffer_bytes`
  bytes, or when the response ends, as nginx's `proxy_buffering` or a framework's buffered
  response does;
* the network then adds `net_latency_ms` plus a uniform 0..`net_jitter_ms` to each piece,
  keeping their order (a later piece never overtakes an earlier one).

Every page's event stream (server/live.py; the page's own control replies, clock sync
included, are not delayed, so its clock stays right) and every API and phone stream
(`DelayedHandle`, around a request's handle) goes through its own `Delivery`. The network
delay is injected (labelled so wherever it is drawn); the buffering is a real buffer.
"""
from collections import deque
import random
import time

from engine.events import Finished, Rejected, Token


class Delivery:
    """One client's proxy buffer and network line; `now` is any monotonic clock in seconds."""

    def __init__(self, settings, rng=None):
        self.settings = settings          # the backend's settings (settings.Live: read at every push)
        self.rng = rng or random.Random()
        self.held, self.held_bytes, self.held_since = [], 0, None
        self.line = deque()               # (due, item) on the way, in order
        self.last_due = 0.0

    def active(self):
        return self.settings.now.delivery.configured() or bool(self.held or self.line)

    def push(self, items, now, sizes, end=False):
        """`items` (with their sizes in bytes) leave the engine at `now`; `end`: the response is
        over, so the proxy lets everything go."""
        for item, size in zip(items, sizes):
            if self.held_since is None:
                self.held_since = now
            self.held.append(item)
            self.held_bytes += size
        self._flush_if_due(now, end)

    def take(self, now):
        """What has reached the client by `now`, in order."""
        self._flush_if_due(now)
        out = []
        while self.line and self.line[0][0] <= now:
            out.append(self.line.popleft()[1])
        return out

    def wait_s(self, now):
        """Seconds until something more reaches the client (None: nothing is on its way)."""
        times = [self.line[0][0]] if self.line else []
        buffer_ms = self.settings.now.delivery.buffer_ms
        if self.held and buffer_ms:
            times.append(self.held_since + buffer_ms / 1000)
        return max(0.0, min(times) - now) if times else None

    def _flush_if_due(self, now, end=False):
        if not self.held:
            return
        s = self.settings.now.delivery
        by_time = s.buffer_ms and now >= self.held_since + s.buffer_ms / 1000
        by_size = s.buffer_bytes and self.held_bytes >= s.buffer_bytes
        if end or by_time or by_size or not (s.buffer_ms or s.buffer_bytes):   # no proxy: straight on
            for item in self.held:
                delay = s.net_latency_ms / 1000 + self.rng.uniform(0, s.net_jitter_ms / 1000)
                self.last_due = max(self.last_due, now + delay)
                self.line.append((self.last_due, item))
            self.held, self.held_bytes, self.held_since = [], 0, None


def event_bytes(event):
    """What a typed event adds to a response: its text (a token's, as the client gets it)."""
    if isinstance(event, Token):
        return len((event.client() or "").encode())
    return 0


class DelayedHandle:
    """A request's handle (engine/core/request.py) whose events reach the caller through a Delivery:
    `next(timeout)` gives the next event once it is due, or None when none is by `timeout`."""

    def __init__(self, handle, settings, clock=time.monotonic):
        self.handle, self.id, self.clock = handle, handle.id, clock
        self.delivery = Delivery(settings)
        self.ready = deque()
        self.ended = False

    def next(self, timeout=None):
        deadline = None if timeout is None else self.clock() + timeout
        while not self.ready:
            now = self.clock()
            self.ready.extend(self.delivery.take(now))
            if self.ready:
                break
            waits = [x for x in (self.delivery.wait_s(now), None if deadline is None else deadline - now)
                     if x is not None]
            if deadline is not None and deadline <= now:
                return None
            if self.handle.ended:       # all of it is on its way already (or was read)
                if not waits:
                    return None
                time.sleep(min(waits))
                continue
            event = self.handle.next(min(waits) if waits else None)
            if event is not None:
                self.delivery.push([event], self.clock(), [event_bytes(event)],
                                   end=isinstance(event, (Finished, Rejected)))
        event = self.ready.popleft()
        self.ended = isinstance(event, (Finished, Rejected))
        return event


def wrap(handle, settings):
    """`handle` itself while delivery is off (no cost), else a DelayedHandle."""
    if not settings.now.delivery.configured():
        return handle
    return DelayedHandle(handle, settings)
