"""`python -m bench.disagg`: colocated vs disaggregated on the same seeded load, in one run.

Both are the app as users start it, driven through its OpenAI API by the same client:

    colocated       `python app.py --threads 2`: one engine, both cores' threads, prompts and
                    decodes in the same forwards (chunked prefill, the mixed policy)
    disaggregated   `python app.py --disaggregate`: a prefill instance and a decode instance,
                    one model thread each (1 + 1 on two cores), the prompts' keys and values
                    copied between them through shared memory (engine/disagg/)

The load: `streams` requests (short prompts, long answers) decode while long prompts arrive as
a seeded Poisson process, so a prompt's prefill meets the streams' decodes; the same prompts,
arrival times and lengths on both sides. Both apps are started once and run interleaved, round
after round (the first side alternating), each run from a reset engine with prefix caching off;
each figure is the median over rounds.

Reported per point and side: the streams' inter-token latency p50 and p99 (every gap between a
stream's tokens, as a client sees them), the long prompts' TTFT p50, output tokens/s, and goodput:
requests per second that met both a TTFT objective and a tight per-token one (a request's mean
gap between tokens). The sweep over prompt length and arrival rate shows where disaggregation
stops paying on two cores (the crossover). Results: bench/results-disagg.json; docs/performance.md.
"""
import argparse
import random
import statistics
import threading
import time

from bench import machine
from bench.contenders import prompts
from bench.launch import ROOT, App, bench_tokenizer
from bench.serve import Events, percentile, settle, stream, write_results

SIDES = {"colocated": ("--threads", "2"), "disaggregated": ("--disaggregate",)}


def one_run(app, events, streams, longs, rate, seed, stream_new, long_new):
    """The streams start together; the long prompts arrive at seeded Poisson times. Each
    request's `stream` result, by kind, and the wall seconds."""
    events.send({"type": "reset"})
    settle(events, {"prefix_caching": False})
    model, out, lock = app.health["model"], {"stream": [], "long": []}, threading.Lock()

    def one(kind, text, n):
        r = stream(app.url, model, text, n)
        with lock:
            out[kind].append(r)

    t0, threads = time.perf_counter(), []
    for text, _ in streams:
        threads.append(threading.Thread(target=one, args=("stream", text, stream_new)))
        threads[-1].start()
    rng, at = random.Random(seed), 0.25
    for text, _ in longs:
        at += rng.expovariate(rate)
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        threads.append(threading.Thread(target=one, args=("long", text, long_new)))
        threads[-1].start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def figures(out, wall, ttft_s, tpot_s):
    """What the table reports of one run."""
    gaps = [b - a for _, _, times, _ in out["stream"] for a, b in zip(times, times[1:])]
    everyone = out["stream"] + out["long"]

    def met(sent, times):
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        return bool(times) and times[0] - sent <= ttft_s and tpot <= tpot_s
    return {"itl_p50": percentile(gaps, 50), "itl_p99": percentile(gaps, 99),
            "ttft_p50": percentile([t[0] - sent for _, sent, t, _ in out["long"] if t], 50),
            "tokens_per_s": sum(u["completion_tokens"] for *_, u in everyone) / wall,
            "goodput": sum(met(sent, t) for _, sent, t, _ in everyone) / wall, "wall_s": wall}


def median_of(runs):
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.disagg", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=4, help="requests decoding throughout (32-token prompts)")
    ap.add_argument("--stream-new", type=int, default=160, help="tokens each stream writes")
    ap.add_argument("--longs", type=int, default=6, help="long prompts arriving while they decode")
    ap.add_argument("--long-new", type=int, default=16)
    ap.add_argument("--prompts", default="64,256,768", help="the long prompts' lengths swept (tokens)")
    ap.add_argument("--rates", default="0.5,2", help="their arrival rates swept (per second)")
    ap.add_argument("--ttft-ms", type=float, default=2000.0, help="goodput's TTFT objective")
    ap.add_argument("--tpot-ms", type=float, default=50.0, help="goodput's tight per-token objective")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-disagg.json"))
    args = ap.parse_args(argv)
    tok = bench_tokenizer()
    lengths, rates = [int(x) for x in args.prompts.split(",")], [float(x) for x in args.rates.split(",")]
    apps = {side: App(*flags) for side, flags in SIDES.items()}
    events = {side: Events(app.ws_url) for side, app in apps.items()}
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine.processor(),
              "load": {k: getattr(args, k) for k in ("streams", "stream_new", "longs", "long_new", "rounds",
                                                     "ttft_ms", "tpot_ms")},
              "points": []}
    try:
        streams = prompts(tok, args.streams, 32)
        for n in lengths:
            longs = prompts(tok, args.longs, n)
            for rate in rates:
                runs = {side: [] for side in SIDES}
                for r in range(args.rounds):
                    order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
                    for side in order:
                        print(f"  .. {n}-token prompts at {rate}/s, round {r + 1}: {side}", flush=True)
                        out, wall = one_run(apps[side], events[side], streams, longs, rate, seed=r,
                                            stream_new=args.stream_new, long_new=args.long_new)
                        runs[side].append(figures(out, wall, args.ttft_ms / 1e3, args.tpot_ms / 1e3))
                result["points"].append({"prompt_tokens": n, "rate": rate,
                                         **{side: median_of(v) for side, v in runs.items()}})
    finally:
        for side in SIDES:
            events[side].close()
            apps[side].stop()
    write_results(result, report(result), args.out)


def report(r):
    ms = lambda v: "—" if v is None else f"{1e3 * v:.0f}"  # noqa: E731
    load = r["load"]
    lines = [f"{machine.describe()}; {load['streams']} streams (32-token prompts -> {load['stream_new']} tokens) "
             f"while {load['longs']} long prompts (-> {load['long_new']} tokens) arrive; medians of "
             f"{load['rounds']} interleaved rounds; goodput: TTFT <= {load['ttft_ms']:.0f} ms and mean gap "
             f"<= {load['tpot_ms']:.0f} ms",
             f"{'prompt':>6s} {'rate/s':>6s}  {'side':13s} {'ITL p50 ms':>10s} {'p99':>5s} {'TTFT p50 ms':>11s} "
             f"{'tok/s':>6s} {'goodput/s':>9s}"]
    for p in r["points"]:
        for side in SIDES:
            x = p[side]
            lines.append(f"{p['prompt_tokens']:6d} {p['rate']:6.1f}  {side:13s} {ms(x['itl_p50']):>10s} "
                         f"{ms(x['itl_p99']):>5s} {ms(x['ttft_p50']):>11s} {x['tokens_per_s']:6.1f} "
                         f"{x['goodput']:9.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
