"""Rolling figures for the `stats` event: throughput, latency percentiles, and goodput
(finished requests per second that met both service-level objectives, DistServe's measure)."""
from collections import deque

GOODPUT_WINDOW_S = 30.0   # goodput and attainment over the last this-many seconds (requests are rarer than tokens)


def percentiles(values, qs=(50, 90, 99)):
    if not values:
        return {f"p{q}": None for q in qs}
    s = sorted(values)
    return {f"p{q}": s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] for q in qs}


class RollingStats:
    def __init__(self, window_s=5.0, keep=500, started=0.0):
        """`started`: when counting began (engine clock), so goodput early on is over the time so far."""
        self.window_s = window_s
        self.started = started
        self.token_times = deque()
        self.ttft = deque(maxlen=keep)
        self.itl = deque(maxlen=keep * 8)
        self.finished = 0
        self.judged = deque()   # (finish time, met both SLOs) of the last GOODPUT_WINDOW_S
        self.slo_met = self.slo_judged = 0   # since counting began

    def token(self, t):
        self.token_times.append(t)

    def gap(self, seconds):
        self.itl.append(seconds)

    def first_token(self, ttft):
        """A request's first token reached its client: its TTFT counts from now on, while it is
        still decoding (a long answer must not keep the headline at "no data")."""
        self.ttft.append(ttft)

    def slo(self, t, met):
        """A completed request judged against the SLOs at `t`."""
        self.judged.append((t, met))
        self.slo_judged += 1
        self.slo_met += met

    def goodput(self, now):
        """(requests/s that met both SLOs, fraction of judged requests that did) over the window,
        (None, None) before any request was judged."""
        while self.judged and self.judged[0][0] < now - GOODPUT_WINDOW_S:
            self.judged.popleft()
        if not self.slo_judged:
            return None, None
        met = sum(m for _, m in self.judged)
        span = min(GOODPUT_WINDOW_S, now - self.started)
        return (met / span if span > 0 else None), (met / len(self.judged) if self.judged else None)

    def tokens_per_s(self, now):
        while self.token_times and self.token_times[0] < now - self.window_s:
            self.token_times.popleft()
        return len(self.token_times) / self.window_s

    def snapshot(self, now):
        goodput, attainment = self.goodput(now)
        return {"tokens_per_s": self.tokens_per_s(now), "ttft": percentiles(self.ttft),
                "itl": percentiles(self.itl), "finished": self.finished, "goodput": goodput,
                "slo_attainment": attainment, "slo_met": self.slo_met, "slo_judged": self.slo_judged}
