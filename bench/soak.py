"""`python -m bench.soak --minutes 10`: the app as users start it, under steady load for a long
while, to show that memory stays flat and nothing fails. Not run in CI (it takes minutes).

One page client (a websocket) turns the load generator on and reads every event, as an open
page would; API clients loop over non-streaming chat completions, streaming completions and
streams they abandon half-way (each must be cancelled in the engine). Every 10 s the app's
resident memory and /healthz latency are sampled. At the end the load stops, the engine must
drain to idle, and a summary is printed and written to test-artifacts/soak.json:

    rss_mb          at start (model loaded, idle), after the first minute (warmed up), at the
                    end (idle again) and at its peak
    rss_mb_per_minute  at each whole minute
    growth_mb_per_min  over the first and the second half of the run after the first minute:
                    a second half near zero is memory levelling off
    served          API requests answered, load-generator requests finished, abandoned streams
    errors          API answers other than 200/429, exceptions, `error` events, requests that
                    finished with reason `error`
    healthz_ms      p50 / max while loaded

Extra arguments after `--` go to app.py (e.g. `-- --threads 1`).
"""
import argparse
import itertools
from collections import Counter
import json
from pathlib import Path
import socket
import statistics
import threading
import time

import psutil
import requests
from simple_websocket import Client

from bench.launch import ROOT, App

SAMPLE_EVERY_S = 10


class Soak:
    def __init__(self, app, args):
        self.app, self.args = app, args
        self.model = requests.get(app.url + "/v1/models").json()["data"][0]["id"]
        self.proc = psutil.Process(app.proc.pid)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = Counter()
        self.samples = []         # (seconds since start, rss bytes, healthz ms)

    def count(self, key, n=1):
        with self.lock:
            self.counts[key] += n

    # ------------------------------------------------------------ the page
    def page(self):
        conn = Client.connect(self.app.ws_url)
        conn.send(json.dumps({"type": "set", "settings": {
            "load": True, "rate": self.args.rate, "prompt_tokens": 64, "max_new_tokens": 32}}))
        try:
            while not self.stop.is_set():
                raw = conn.receive(timeout=0.5)
                for e in json.loads(raw) if raw else []:
                    self.on_event(e)
        finally:
            conn.send(json.dumps({"type": "set", "settings": {"load": False}}))
            conn.close()

    def on_event(self, e):
        if e["type"] == "finished":
            self.count(f"finished_{e['source']}_{e['reason']}")
            if e["reason"] == "error":
                self.count(f"error_finished_{e['source']}")
        elif e["type"] == "rejected":
            self.count(f"rejected_{e['code']}")
        elif e["type"] == "error":
            self.count("error_events")
        elif e["type"] == "dropped":
            self.count("page_dropped_events", e["count"])

    # ------------------------------------------------------------ API clients
    def api_client(self, k):
        kinds = ("chat", "stream", "chat", "stream", "abandon")
        with requests.Session() as s:
            for i in itertools.count():
                if self.stop.is_set():
                    return
                kind = kinds[(i + k) % len(kinds)]
                try:
                    self.answered(kind, getattr(self, kind)(s))
                except (requests.RequestException, OSError) as e:
                    self.count(f"error_exception_{type(e).__name__}")

    def answered(self, kind, status):
        """200, 429 (overloaded: refused at once, as designed) and a hang-up of our own are fine;
        anything else is an error."""
        self.count(f"api_{status}")
        if status not in (200, 429, "abandoned"):
            self.count(f"error_api_{kind}_{status}")

    def chat(self, s):
        r = s.post(self.app.url + "/v1/chat/completions", timeout=600, json={
            "model": self.model, "max_tokens": 24, "messages": [{"role": "user", "content": "Tell me about rivers."}]})
        return r.status_code

    def stream(self, s):
        r = s.post(self.app.url + "/v1/completions", stream=True, timeout=600, json={
            "model": self.model, "prompt": "The history of the printing press", "max_tokens": 24, "stream": True})
        if r.status_code != 200:
            return r.status_code
        lines = [x for x in r.iter_lines() if x.startswith(b"data: ")]
        complete = lines and lines[-1] == b"data: [DONE]" and not any(b'"error"' in x for x in lines)
        return 200 if complete else "broken_stream"

    def abandon(self, s):
        """A streaming client that reads two chunks and hangs up (its request must be cancelled)."""
        host, port = self.app.url.split("//")[1].split(":")
        body = json.dumps({"model": self.model, "prompt": "Once upon a time", "max_tokens": 200,
                           "ignore_eos": True, "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=600) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (host.encode(), port.encode(), len(body), body))
            got = b""
            while got.count(b"data: ") < 2:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
        return "abandoned"

    # ------------------------------------------------------------ the watch
    def rss(self):
        return self.proc.memory_info().rss

    def healthz_ms(self):
        t0 = time.perf_counter()
        body = requests.get(self.app.url + "/healthz", timeout=30).json()
        return (time.perf_counter() - t0) * 1000, body

    def run(self):
        start, rss0 = time.monotonic(), self.rss()
        threads = [threading.Thread(target=self.page, daemon=True)]
        threads += [threading.Thread(target=self.api_client, args=(k,), daemon=True) for k in range(self.args.clients)]
        for t in threads:
            t.start()
        end = start + self.args.minutes * 60
        while time.monotonic() < end:
            time.sleep(min(SAMPLE_EVERY_S, max(0.0, end - time.monotonic())))
            ms, _ = self.healthz_ms()
            self.samples.append((time.monotonic() - start, self.rss(), ms))
            print(f"{self.samples[-1][0]:6.0f} s  rss {self.samples[-1][1] / 2**20:7.1f} MB  healthz {ms:6.1f} ms  "
                  f"{dict(self.counts)}", flush=True)
        self.stop.set()
        for t in threads:
            t.join(60)
        idle_s = self.drain()
        return self.summary(rss0, idle_s)

    def drain(self, timeout=120):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            _, body = self.healthz_ms()
            if body.get("running") == 0 and body.get("waiting") == 0:
                return round(time.monotonic() - t0, 1)
            time.sleep(0.5)
        return None

    def summary(self, rss0, idle_s):
        rss = [s[1] for s in self.samples] + [self.rss()]
        warm = next((s[1] for s in self.samples if s[0] >= 60), rss[0])
        health = [s[2] for s in self.samples]
        c = self.counts
        minutes = range(1, int(self.samples[-1][0] // 60) + 1) if self.samples else ()
        per_minute = [next(b for t, b, _ in self.samples if t >= 60 * m) for m in minutes]

        def mb(b):
            return round(b / 2**20, 1)
        return {
            "minutes": self.args.minutes, "clients": self.args.clients, "load_rate": self.args.rate,
            "rss_mb": {"start": mb(rss0), "after_1_min": mb(warm), "end": mb(rss[-1]), "peak": mb(max(rss))},
            "rss_mb_per_minute": [mb(b) for b in per_minute],
            "growth_mb_per_min": growth(self.samples),
            "served": {"api_ok": c["api_200"], "api_429": c["api_429"], "api_abandoned": c["api_abandoned"],
                       "load_finished": sum(v for k, v in c.items() if k.startswith("finished_load_")),
                       "api_cancelled_in_engine": c["finished_api_cancelled"]},
            "errors": {k: v for k, v in c.items() if k.startswith("error_")},
            "healthz_ms": {"p50": round(statistics.median(health), 1), "max": round(max(health), 1)},
            "idle_after_s": idle_s, "counts": dict(c)}


def growth(samples):
    """RSS growth (MB a minute) over the first and second half of the samples after minute one."""
    warm = [(t, b) for t, b, _ in samples if t >= 60]
    if len(warm) < 4:
        return None
    mid = len(warm) // 2

    def rate(part):
        (t0, b0), (t1, b1) = part[0], part[-1]
        return round((b1 - b0) / 2**20 / ((t1 - t0) / 60), 2)
    return {"first_half": rate(warm[:mid + 1]), "second_half": rate(warm[mid:])}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to load the app (default 10)")
    p.add_argument("--clients", type=int, default=3, help="API client threads (default 3)")
    p.add_argument("--rate", type=float, default=1.0, help="load generator arrivals per second (default 1)")
    p.add_argument("--out", default=str(ROOT / "test-artifacts" / "soak.json"))
    p.add_argument("app_args", nargs="*", help="arguments for app.py, after --")
    args = p.parse_args(argv)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    app = App(*args.app_args, log=ROOT / "test-artifacts" / "soak-server.log")
    try:
        result = Soak(app, args).run()
    finally:
        app.stop()
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
