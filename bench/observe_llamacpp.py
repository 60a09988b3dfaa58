"""Observe a real llama.cpp server built here, and check the picture against the server.

    python -m bench.observe_llamacpp [--capture] [--shot PATH] [--out PATH] [--trace PATH]

Starts `llama-server` (bench/reference.py; built once) on 127.0.0.1 with `--metrics --slots
-np 4 -t 1`, then First Token in observe mode on it (`python app.py --observe URL`), sends a
burst of requests through the observer's websocket (more than its four slots, so some wait),
and meanwhile reads the server's `/metrics` and `/slots` itself every 0.2 s. For every
`stats` event the observer published, the gauges it drew are written next to what the
server reported in the direct read nearest to the observer's own scrape (`--out`, JSON),
with the time between the two reads. `--shot` saves a Chromium screenshot (1366x768) of the
observer's page while the server is busy; `--capture` writes the texts read directly
(/metrics twice, /slots, /props) into tests/data/metrics/ as llamacpp-capture-*; `--trace`
writes the observer's events as a trace (`[hello, ...events]`, docs/protocol.md) that the
page replays.
"""
import argparse
import json
from pathlib import Path
import threading
import time
import urllib.request

from bench.launch import CHROMIUM, CHROMIUM_ARGS, App
from bench import reference
from bench.vs_reference import ReferenceServer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "metrics"
BURST = 8            # twice the slots
MAX_NEW = 96


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def gauges_of(text):
    from observe import profiles
    s = profiles.parse(text)
    p = profiles.detect(s)
    return profiles.read_gauges(p, s), profiles.read_counters(p, s)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.observe_llamacpp", description=__doc__.split("\n")[0])
    ap.add_argument("--capture", action="store_true", help="write the texts read into tests/data/metrics/")
    ap.add_argument("--shot", default=str(ROOT / "test-artifacts" / "observe-llamacpp.png"))
    ap.add_argument("--out", default=str(ROOT / "test-artifacts" / "observe-llamacpp.json"))
    ap.add_argument("--trace", help="write the observer's events here as a trace (hello first)")
    ap.add_argument("--smoke", action="store_true", help="two short requests, a screenshot soon after (a check)")
    a = ap.parse_args(argv)
    burst, max_new, mid_s = (2, 4, 1.0) if a.smoke else (BURST, MAX_NEW, 6.0)
    reference.build()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    # started as vs_reference starts it: again with --no-repack where its repacking path crashes
    server = ReferenceServer(threads=1, slots=4)
    url, cmd = server.url, reference.serve_cmd(server.port) + server.extra
    app = None
    try:
        props = json.loads(get(url + "/props"))
        app = App("--observe", url + "/v1", log=Path(a.out).with_suffix(".observer.log"))
        direct, stop = [], threading.Event()

        def read_directly():
            while not stop.is_set():
                t0 = time.time()
                try:
                    text = get(url + "/metrics").decode()
                    slots = json.loads(get(url + "/slots"))
                except OSError:
                    continue
                direct.append({"unix": (t0 + time.time()) / 2, "text": text, "slots": slots})
                stop.wait(0.2)
        reader = threading.Thread(target=read_directly, daemon=True)
        reader.start()
        from simple_websocket import Client
        conn = Client.connect(app.ws_url)
        (hello, *history) = json.loads(conn.receive(timeout=10))
        conn.send(json.dumps({"type": "set", "settings": {"max_new_tokens": max_new, "prompt_tokens": 64}}))
        time.sleep(0.5)
        shot = {}

        def screenshot():
            from playwright.sync_api import sync_playwright
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = b.new_page(viewport={"width": 1366, "height": 768})
                page.goto(app.url + "/")
                page.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
                time.sleep(1.0)
                conn.send(json.dumps({"type": "burst", "n": burst}))
                time.sleep(mid_s)    # mid-run: slots full, some deferred, tokens streaming
                Path(a.shot).parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=a.shot)
                shot["unix"] = time.time()
                page.wait_for_function("n => firstToken.state.order.length >= n && [...firstToken.state.reqs.values()]"
                                       ".every(r => r.end !== null)", arg=burst, timeout=300_000, polling=500)
                page.screenshot(path=str(Path(a.shot).with_name(Path(a.shot).stem + "-end.png")))
                b.close()
        events, done = [], threading.Event()

        def listen():
            while not done.is_set():
                raw = conn.receive(timeout=0.2)
                if raw:
                    events.extend(json.loads(raw))
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        screenshot()
        time.sleep(1.5)      # a scrape after the last finish
        done.set()
        listener.join(5)
        stop.set()
        reader.join(5)
        conn.close()
        hello_now = json.loads(get(app.url + "/healthz"))
    finally:
        if app is not None:
            app.stop()
        server.stop()
    # The observer's clock -> unix: hello.server_time is unix seconds at hello.t.
    to_unix = lambda t: hello["server_time"] + (t - hello["t"])   # noqa: E731
    rows = []
    for e in events:
        if e["type"] != "stats" or not e["server"]:
            continue
        scraped = to_unix(e["server"]["scraped_t"])
        near = min(direct, key=lambda d: abs(d["unix"] - scraped))
        g, _ = gauges_of(near["text"])
        rows.append({"t": round(to_unix(e["t"]) - to_unix(hello["t"]), 2), "age_s": round(e["server"]["age_s"], 3),
                     "period_s": e["server"]["period_s"] and round(e["server"]["period_s"], 3),
                     "observer": {k: e["server"]["gauges"][k] for k in ("running", "waiting", "batch_size")},
                     "observer_rates": {k: e["server"]["rates"][k] and round(e["server"]["rates"][k], 1)
                                        for k in ("prompt_tokens_per_s", "generated_tokens_per_s")},
                     "observer_slots": [(s["id"], s["busy"], s["request"]) for s in e["server"]["slots"] or []],
                     "server": {k: g[k] for k in ("running", "waiting", "batch_size")},
                     "server_busy_slots": [s["id"] for s in near["slots"] if s.get("is_processing")],
                     "reads_apart_s": round(abs(near["unix"] - scraped), 3)})
    finished = [e for e in events if e["type"] == "finished"]
    summary = {"server": {"build_info": props.get("build_info"), "total_slots": props.get("total_slots"),
                          "command": " ".join(cmd)},
               "hello_server": hello.get("server"), "healthz_after": hello_now,
               "screenshot": a.shot, "screenshot_unix": shot.get("unix"),
               "requests": len([e for e in events if e["type"] == "request"]), "finished": len(finished),
               "ttft_s": sorted(round(f["ttft"], 3) for f in finished if f["ttft"] is not None),
               "rows": rows}
    Path(a.out).write_text(json.dumps(summary, indent=1))
    if a.trace:
        trace = [hello] + [e for e in history + events if e["type"] != "sync"]
        Path(a.trace).write_text(json.dumps(trace, separators=(",", ":")))
        print(f"wrote {a.trace}: {len(trace)} events")
    matched = sum(r["observer"] == r["server"] for r in rows)
    print(f"{len(rows)} stats events with server figures; gauges equal to the nearest direct read in {matched}")
    print(f"wrote {a.out}, {a.shot}")
    if a.capture:
        capture(direct, props)
    return 0


def capture(direct, props):
    """The direct reads as test fixtures: the busiest /metrics, the next one whose counters
    moved (within 3 s: a rate to check), the /slots read with the first, and /props."""
    def load(d):                    # most running, then most waiting: slots full and a queue
        g = gauges_of(d["text"])[0]
        return g["running"] or 0, g["waiting"] or 0
    busy = max(direct, key=load)
    moved = lambda d: gauges_of(d["text"])[1] != gauges_of(busy["text"])[1]   # noqa: E731
    later = next((d for d in direct if 0 < d["unix"] - busy["unix"] <= 3 and moved(d)), None)
    build = props.get("build_info")
    head = (f"# Captured here from a real llama.cpp server ({build}, built from the llama-cpp-python sdist by "
            "bench/reference.py),\n# started as `llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --metrics --slots "
            "-np 4 -t 1`, under load from First Token's observe mode (python -m bench.observe_llamacpp --capture).\n")
    (DATA / "llamacpp-capture-a.txt").write_text(head + "# read at t=0\n" + busy["text"])
    if later:
        dt = later["unix"] - busy["unix"]
        (DATA / "llamacpp-capture-b.txt").write_text(head + f"# read {dt:.3f} s after capture-a\n" + later["text"])
    note = f"captured here from llama.cpp {build}'s GET /slots with capture-a's /metrics (bench/observe_llamacpp.py)"
    (DATA / "llamacpp-slots-captured.json").write_text(json.dumps({"_source": note, "slots": busy["slots"]}, indent=1))
    (DATA / "llamacpp-props.json").write_text(json.dumps(
        {"_source": f"captured here from llama.cpp {build}'s GET /props", **{k: props[k] for k in props
                                                                              if k in ("build_info", "total_slots")}},
        indent=1))
    print("wrote tests/data/metrics/llamacpp-capture-*.txt, llamacpp-slots-captured.json, llamacpp-props.json")


if __name__ == "__main__":
    raise SystemExit(main())
