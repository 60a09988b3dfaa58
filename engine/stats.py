"""Rolling figures for the `stats` event: throughput and latency percentiles."""
from collections import deque


def percentiles(values, qs=(50, 90, 99)):
    if not values:
        return {f"p{q}": None for q in qs}
    s = sorted(values)
    return {f"p{q}": s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] for q in qs}


class RollingStats:
    def __init__(self, window_s=5.0, keep=500):
        self.window_s = window_s
        self.token_times = deque()
        self.ttft = deque(maxlen=keep)
        self.itl = deque(maxlen=keep * 8)
        self.finished = 0

    def token(self, t):
        self.token_times.append(t)

    def gap(self, seconds):
        self.itl.append(seconds)

    def first_token(self, ttft):
        """A request's first token reached its client: its TTFT counts from now on, while it is
        still decoding (a long answer must not keep the headline at "no data")."""
        self.ttft.append(ttft)

    def tokens_per_s(self, now):
        while self.token_times and self.token_times[0] < now - self.window_s:
            self.token_times.popleft()
        return len(self.token_times) / self.window_s

    def snapshot(self, now):
        return {"tokens_per_s": self.tokens_per_s(now), "ttft": percentiles(self.ttft),
                "itl": percentiles(self.itl), "finished": self.finished}
