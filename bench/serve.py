"""`python -m bench.serve`: the app as users start it, driven through its OpenAI API.

A load generator in this file streams `/v1/chat/completions` requests (greedy, `ignore_eos`,
so every request produces exactly its `max_tokens`) and measures what a load tool measures:
output tokens/s, time to first token, and each request's inter-token latency (the mean gap
between its tokens, as load tools define it). The app's own websocket events give the
forwards: their median duration, how busy the engine was, and the stall factor (mean gap
between a request's tokens / median forward time: 1 means a token every forward).

    L1            8 in flight, 128-token prompts -> 32 new tokens, 32 requests, under each
                  scheduling policy (mixed, prefill-first, static), same prompts
    L2            16 in flight, 32-token prompts -> 128 new tokens, 32 requests
    open loop     the L1 requests arriving as a Poisson process (2 per second), not in a closed loop
    continuous    16 requests at once through 4 batch slots, output lengths 8..128, mixed vs
                  static: static waits for a batch's longest request, continuous refills a slot at once
    prefix        8 chat requests sharing a ~500-token system prompt, one at a time:
                  the later ones' TTFT and prefill vs the first's, prefix caching on vs off

`--quick` runs smaller versions (for a smoke check). Results: bench/results-serve.json.
"""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.request

from simple_websocket import Client

from bench.contenders import prompts
from bench.launch import ROOT, App, bench_tokenizer, healthz
from engine.teach.loadgen import CORPUS


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else None


def stream(url, model, text, max_tokens, **extra):
    """One streaming chat completion of `text` (the user's message), greedy, EOS ignored:
    (request id, send time, [arrival time of each chunk with text], usage)."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, **extra}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    sent, times, usage, rid = time.perf_counter(), [], None, None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            msg = json.loads(line[6:])
            rid = rid or msg["id"].split("-", 1)[1]
            usage = msg.get("usage") or usage
            if msg["choices"] and msg["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    return rid, sent, times, usage


class Events:
    """The app's websocket events during a run (steps and prefills), on a thread of its own."""

    def __init__(self, ws_url):
        self.conn = Client.connect(ws_url)
        self.events, self.done, self.hello = [], threading.Event(), None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.done.is_set():
            raw = self.conn.receive(timeout=0.2)
            for e in json.loads(raw) if raw else []:
                if e["type"] == "hello":
                    self.hello = e
                elif e["type"] in ("step", "prefill", "settings"):
                    self.events.append(e)

    def send(self, msg):
        self.conn.send(json.dumps(msg))

    def take(self):
        out, self.events = self.events, []
        return out

    def close(self):
        self.done.set()
        self.thread.join()
        self.conn.close()


def client_load(url, model, batch, max_tokens, in_flight=None, rate=None):
    """Closed loop (`in_flight` requests at a time until every prompt has been sent), or open
    loop (each request sent at its Poisson arrival time at `rate` per second, whatever is running).
    Any OpenAI-compatible server: (each request's `stream` result, wall seconds)."""
    results, lock, todo = [], threading.Lock(), list(enumerate(batch))
    t0 = time.perf_counter()

    def one(i, text):
        n = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
        results.append(stream(url, model, text, n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i, (text, _) = todo.pop(0)
            one(i, text)

    if rate:
        rng, at, threads = random.Random(0), 0.0, []
        for i, (text, _) in todo:
            at += rng.expovariate(rate)
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            threads.append(threading.Thread(target=one, args=(i, text)))
            threads[-1].start()
    else:
        threads = [threading.Thread(target=worker) for _ in range(in_flight)]
        for t in threads:
            t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def run_load(app, events, batch, max_tokens, in_flight=None, rate=None):
    """`client_load` against the app, with the engine's own view: its forwards (websocket events)
    and its engine thread's time between forwards (/healthz)."""
    events.take()
    before = engine_thread(app)
    results, wall = client_load(app.url, app.health["model"], batch, max_tokens, in_flight, rate)
    time.sleep(0.3)             # the last events reach the websocket
    out = summarise(results, events.take(), wall)
    after = engine_thread(app)
    between = after["between_forwards_s"] - before["between_forwards_s"]
    cpu = after["between_forwards_cpu_s"] - before["between_forwards_cpu_s"]
    out["between_s"], out["waiting_share"] = between, (1 - cpu / between) if between > 0 else None
    return out


def engine_thread(app):
    """The engine thread's time between forwards so far, and the CPU time it ran (/healthz):
    what it did not run of that time, it waited for the GIL or a core."""
    status, body = healthz(app.url)
    return body["engine_thread"]


def summarise_client(results, wall):
    """What a load tool reports: output tokens/s, TTFT and each request's mean inter-token latency."""
    itl = [(t[-1] - t[0]) / (len(t) - 1) for _, _, t, _ in results if len(t) > 1]
    ttft = [t[0] - sent for _, sent, t, _ in results if t]
    out_tokens = sum(u["completion_tokens"] for *_, u in results)
    return {"requests": len(results), "wall_s": wall, "output_tokens": out_tokens, "tokens_per_s": out_tokens / wall,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99), "itl": itl}


def summarise(results, evs, wall):
    steps = [e for e in evs if e["type"] == "step"]
    forwards = [e["end"] - e["start"] for e in steps]
    # engine-thread time from one forward's end to the next one's start: sampling, detokenising,
    # events, scheduling (and waiting for work, when there is none)
    between = [b["start"] - a["end"] for a, b in zip(steps, steps[1:])]
    client = summarise_client(results, wall)
    itl = client.pop("itl")
    median_forward = statistics.median(forwards) if forwards else None
    return {**client,
            "median_forward_s": median_forward, "busy": sum(forwards) / wall if forwards else None,
            "between_p50_s": percentile(between, 50), "between_p99_s": percentile(between, 99),
            "stall_factor": statistics.mean(itl) / median_forward if itl and median_forward else None,
            "steps": {k: sum(1 for e in steps if e["kind"] == k) for k in ("prefill", "decode", "mixed")}}


def settle(events, settings):
    """Apply settings through the websocket and wait for the server's `settings` echo."""
    events.take()
    events.send({"type": "set", "settings": settings})
    deadline = time.time() + 10
    while time.time() < deadline and not any(e["type"] == "settings" for e in events.events):
        time.sleep(0.05)


def prefix_run(app, events, system, questions, caching):
    settle(events, {"prefix_caching": caching})
    rows = []
    for q in questions:
        rid, sent, times, usage = stream(app.url, app.health["model"], system + q, 4)
        time.sleep(0.3)
        prefill = sum(e["end"] - e["start"] for e in events.events if e["type"] == "prefill" and e["id"] == rid)
        rows.append({"ttft": times[0] - sent, "prefill_s": prefill, "prompt_tokens": usage["prompt_tokens"],
                     "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]})
    first, later = rows[0], rows[1:]
    return {"caching": caching, "first": first, "later_ttft_p50": statistics.median(r["ttft"] for r in later),
            "later_prefill_p50": statistics.median(r["prefill_s"] for r in later),
            "later_cached_p50": statistics.median(r["cached_tokens"] for r in later), "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs (~3 min)")
    ap.add_argument("--smoke", action="store_true", help="the smallest runs (a check of the bench, not a figure)")
    ap.add_argument("--out", default=None, help="JSON results (default bench/results-serve.json, "
                                                "or bench/results-reference.json with --reference)")
    ap.add_argument("--reference", action="store_true",
                    help="against llama.cpp's llama-server on the same GGUF (built once; bench/vs_reference.py)")
    ap.add_argument("--threads", type=int, default=2, help="--reference: threads for each server")
    ap.add_argument("--rounds", type=int, default=2, help="--reference: interleaved rounds (figures are medians)")
    args = ap.parse_args(argv)
    if args.reference:
        return _reference(args)
    n_l1, n_cont = (2, 2) if args.smoke else (8, 8) if args.quick else (32, 16)
    app = App()
    tok = bench_tokenizer()
    events = Events(app.ws_url)
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": args.quick, "L1": {}}
    try:
        batch = prompts(tok, n_l1, 128)
        for policy in ("mixed", "prefill-first", "static"):
            # the same prompts in every run: without prefix caching, so each run computes them
            settle(events, {"schedule": policy, "prefix_caching": False})
            print(f"  .. L1 under {policy}", flush=True)
            result["L1"][policy] = run_load(app, events, batch, 32, in_flight=8)
        settle(events, {"schedule": "mixed"})
        print("  .. L2", flush=True)
        result["L2"] = run_load(app, events, prompts(tok, n_l1, 32), 128, in_flight=16)
        print("  .. L1 requests as Poisson arrivals", flush=True)
        result["open_loop"] = run_load(app, events, batch, 32, rate=2.0)
        lengths = [8 + (120 * i) // (n_cont - 1) for i in range(n_cont)]
        cont_batch = prompts(tok, n_cont, 64)
        result["continuous"] = {}
        for policy in ("mixed", "static"):
            settle(events, {"schedule": policy, "slots": 4})
            print(f"  .. {n_cont} requests at once, mixed lengths, 4 slots, under {policy}", flush=True)
            result["continuous"][policy] = run_load(app, events, cont_batch, lengths, in_flight=n_cont)
        settle(events, {"schedule": "mixed", "slots": events.hello["max_slots"]})
        # from the corpus' end, which no earlier prompt here came from (no accidental prefix hits)
        system = tok.decode(tok(CORPUS.read_text()[-6000:], add_special_tokens=False)["input_ids"][-500:])
        questions = [f"\n\nQuestion {i}: what happens next in the story?" for i in range(2 if args.smoke else 4 if args.quick else 8)]
        result["prefix"] = [prefix_run(app, events, system, questions, caching) for caching in (True, False)]
    finally:
        events.close()
        app.stop()
    write_results(result, report(result), args.out or str(ROOT / "bench" / "results-serve.json"))


def _reference(args):
    from bench import vs_reference

    def load(url, model, batch, new, in_flight):
        out = summarise_client(*client_load(url, model, batch, new, in_flight))
        out.pop("itl")
        return out
    def set_weights(app, fmt):
        events = Events(app.ws_url)
        try:
            settle(events, {"weights": fmt})
        finally:
            events.close()
    result = vs_reference.run(args, load, set_weights)
    write_results(result, vs_reference.report(result), args.out or str(ROOT / "bench" / "results-reference.json"))


def write_results(result, text, path):
    """Print a bench's report and write its figures (JSON) to `path`."""
    print(text)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwritten: {path}")


def report(r):
    ms = lambda v: "—" if v is None else f"{1e3 * v:.0f} ms"  # noqa: E731
    pct = lambda v: "—" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    lines = ["", "streaming /v1/chat/completions, greedy, ignore_eos; L1: 8 in flight, 128-token prompts -> 32 new; "
             "L2: 16 in flight, 32 -> 128; open: L1's requests as Poisson arrivals at 2/s",
             f"{'run':18s} {'tok/s':>6s} {'TTFT p50':>9s} {'p99':>9s} {'ITL p50':>9s} {'p99':>9s} "
             f"{'fwd p50':>8s} {'stall':>6s} {'busy':>5s} {'gap p50':>8s} {'wait':>5s}  steps (prefill/decode/mixed)"]
    rows = [(f"L1 {k}", v) for k, v in r["L1"].items()] + [("L2 mixed", r["L2"]), ("open mixed", r["open_loop"])]
    for name, x in rows + [(f"{k} x16", v) for k, v in r["continuous"].items()]:
        st = x["steps"]
        lines.append(f"{name:18s} {x['tokens_per_s']:6.1f} {ms(x['ttft_p50']):>9s} {ms(x['ttft_p99']):>9s} "
                     f"{ms(x['itl_p50']):>9s} {ms(x['itl_p99']):>9s} {ms(x['median_forward_s']):>8s} "
                     f"{x['stall_factor']:6.2f} {100 * x['busy']:4.0f}% {ms(x['between_p50_s']):>8s} "
                     f"{pct(x['waiting_share']):>5s}  "
                     f"{st['prefill']}/{st['decode']}/{st['mixed']}")
    lines.append("(x16: 16 requests at once through 4 slots, outputs of 8..128 tokens: continuous vs static batching; stall: mean "
                 "gap between a request's tokens / median forward; busy: share of wall time in forwards; gap: "
                 "engine time between one forward's end and the next one's start; wait: share of that engine-thread "
                 "time it was ready but not running (thread CPU time vs wall): the GIL, held by the web threads that "
                 "stream each token, or a busy core)")
    lines += ["", "shared ~500-token system prompt, requests one at a time:"]
    for p in r["prefix"]:
        f = p["first"]
        lines.append(f"  prefix caching {'on ' if p['caching'] else 'off'}: first TTFT {ms(f['ttft'])} (prefill "
                     f"{ms(f['prefill_s'])}); later TTFT p50 {ms(p['later_ttft_p50'])} (prefill "
                     f"{ms(p['later_prefill_p50'])}, {p['later_cached_p50']:.0f} of {f['prompt_tokens']} tokens reused)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
