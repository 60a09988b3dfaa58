"""Observe mode's view of the server's own figures: its /metrics (and /slots, and its version
endpoint) read every SCRAPE_EVERY_S through the profile that fits (observe/profiles.py).

`Scraper.scrape` runs in the watcher's thread (observe/watch.py) and never raises for
anything a server sends: an unreadable /metrics is "not readable" (`view` is None), a series that is missing
or garbled is None, a counter that goes backwards gives no rate for that interval. `view`
is what `stats.server` carries, with the scrape's own time, so the page can say how old a
gauge is (a 0.5 s scrape is not a per-step truth).
"""
import http.client
import threading

from server import inputs
from server.errors import ApiError
from . import profiles

SCRAPE_EVERY_S = 0.5     # the server's /metrics (and /slots), for `stats.server`
INFO_RETRY_S = 10.0      # a version endpoint that failed is asked again this much later
FAILURES = (OSError, http.client.HTTPException, ValueError, UnicodeError, ApiError)


class Scraper:
    def __init__(self, clock):
        self.clock = clock
        self.profile = None
        self.version = None
        self.readable = False
        self._rates = profiles.Rates()
        self._info_at = 0.0          # when to ask the version endpoint (again)
        self._last = None            # the latest successful scrape's view, without its age
        self._lock = threading.Lock()

    def scrape(self, get, ours):
        """One scrape. `get(path) -> (status, body bytes)` may raise; `ours` maps our
        in-flight request ids to (prompt, seed) as sent (for llama.cpp's slots)."""
        t = self.clock.now()
        try:
            status, raw = get("/metrics")
            samples = profiles.parse(raw.decode("utf-8", "replace")) if status == 200 else None
        except FAILURES:
            samples = None
        if samples is None:
            with self._lock:
                self.readable, self._last = False, None
            return
        profile = profiles.detect(samples)
        if profile is not self.profile:           # first scrape, or another server behind the URL
            self.profile, self.version, self._info_at = profile, None, t
            self._rates.reset()
        if profile is not None and self.version is None and t >= self._info_at:
            self.version = profiles.label_version(profile, samples) or self._info(get, profile)
            self._info_at = t + INFO_RETRY_S
        rates, ratios = self._rates.update(t, profiles.read_counters(profile, samples))
        slots = None
        if profile is not None and profile.slots:
            slots = profiles.slot_view(self._json(get, profile.slots), ours)
        with self._lock:
            period = t - self._last["t"] if self._last else None
            self.readable = True
            self._last = {"t": t, "period_s": period, "profile": profile.kind if profile else None,
                          "title": profile.title if profile else None, "version": self.version,
                          "gauges": profiles.read_gauges(profile, samples), "rates": rates, "ratios": ratios,
                          "slots": slots}

    def view(self, now):
        """`stats.server`: the latest scrape with its age, or None when /metrics is not readable."""
        with self._lock:
            last = self._last
        if last is None:
            return None
        return {"profile": last["profile"], "title": last["title"], "version": last["version"],
                "scraped_t": last["t"], "age_s": max(0.0, now - last["t"]),
                "period_s": last["period_s"], "every_s": SCRAPE_EVERY_S, "gauges": dict(last["gauges"]),
                "rates": dict(last["rates"]), "ratios": dict(last["ratios"]),
                "slots": None if last["slots"] is None else [dict(s) for s in last["slots"]]}

    def describe(self):
        """`hello.server`: which server this is and what it exposes, or None before it is known."""
        p = self.profile
        if p is None:
            return None
        return {"kind": p.kind, "title": p.title, "version": self.version, "every_s": SCRAPE_EVERY_S,
                "slots": p.slots is not None, "exposed": profiles.exposed(p)}

    def _info(self, get, profile):
        for path, key in profile.info:
            body = self._json(get, path)
            value = body.get(key) if isinstance(body, dict) else None
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value)[:60]
        return None

    @staticmethod
    def _json(get, path):
        try:
            status, raw = get(path)
            return inputs.loads(raw) if status == 200 else None
        except FAILURES:
            return None
