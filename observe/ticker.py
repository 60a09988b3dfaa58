"""Observe mode's clock thread: the load generator's arrivals, and a `stats` event every
STATS_EVERY_S. It never touches the network (each request is sent from a thread of its own,
observe/flights.py), so arrivals keep their times."""
import threading

from engine.events import Stats

STATS_EVERY_S = 0.5
# Who measured each figure of an observe-mode `stats` event (docs/protocol.md).
MEASURED_BY = {"queue": "server", "running": "server", "cache_usage": "server", "server": "server",
               "in_flight": "client", "tokens_per_s": "client", "ttft": "client", "itl": "client",
               "finished": "client"}


class Ticker:
    def __init__(self, observer):
        self.obs = observer
        self.wake = threading.Event()   # set: look again now (the settings changed, or stop)

    def start(self, stop):
        """Tick on a thread until the `stop` event is set (and `wake` with it)."""
        threading.Thread(target=self._loop, args=(stop,), name="observe-ticker", daemon=True).start()

    def _loop(self, stop):
        obs = self.obs
        next_stats = 0.0
        while not stop.is_set():
            now = obs.clock.now()
            load = obs.settings.now.load
            due, next_arrival = obs.load.due(now, load.load and obs.watch.reachable, load.rate)
            for _ in range(due):
                obs.send_load()
            if now >= next_stats:
                next_stats = now + STATS_EVERY_S
                obs.events.publish(stats_event(obs, now))
            wait = next_stats - now if next_arrival is None else min(next_stats, next_arrival) - now
            self.wake.wait(max(0.0, wait))
            self.wake.clear()


def stats_event(obs, now):
    """`stats`: the server's own figures (its latest scrape) beside the client's."""
    view = obs.watch.scraper.view(now)
    gauges = view["gauges"] if view else {}
    count = lambda v: None if v is None else int(v)   # noqa: E731 -- gauges are floats
    return Stats(t=now, queue=count(gauges.get("waiting")), running=count(gauges.get("running")),
                 in_flight=len(obs.flights), waiting_ids=[], slots=[], cache_blocks_used=None, cache_blocks=None,
                 cache_tokens=None, cache_usage=gauges.get("kv_usage"), server=view, measured_by=MEASURED_BY,
                 subscribers=obs.events.subscribers, **obs.flights.stats.snapshot(now))
