"""What observe mode knows of the server besides its answers, refreshed on a thread of its
own: whether its /v1/models answers (for /healthz) and the model it names (the one every
request asks for), every PROBE_EVERY_S; and its own figures from /metrics, every
SCRAPE_EVERY_S (observe/scrape.py)."""
import threading
import time

from .scrape import SCRAPE_EVERY_S, Scraper

PROBE_EVERY_S = 2.0


class Watch:
    def __init__(self, target, clock, flights):
        self.target, self.flights = target, flights
        self.scraper = Scraper(clock)
        self.model = None
        self.max_context = None
        self.reachable = False

    def start(self, stop):
        """Watch on a thread until the `stop` event is set."""
        threading.Thread(target=self._loop, args=(stop,), name="observe-scraper", daemon=True).start()

    def _loop(self, stop):
        next_probe = 0.0
        while not stop.is_set():
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_EVERY_S
                self.probe()
            if self.reachable:
                self.scraper.scrape(self.target.get, self.flights.sent())
            stop.wait(SCRAPE_EVERY_S)

    def probe(self):
        """Ask /v1/models: reachable while it answers, once it has named a model (kept after)."""
        first = self.target.first_model()
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            self.model, self.max_context = first["id"], first.get("max_model_len")
        self.reachable = self.model is not None and first is not None
