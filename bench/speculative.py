"""`python -m bench.speculative`: speculative decoding on and off, through the app's HTTP API.

Two workloads, each at 1 and at 8 requests in flight, with speculation off, `ngram` and
`suffix` (k = `spec_tokens`, default 4), on the same prompts (streaming chat completions,
greedy, `ignore_eos`: every request writes exactly its `max_tokens`):

    lookup   the model is asked to copy a ~100-token corpus paragraph (loadgen.TASKS["copy"]):
             most of what it writes is in its prompt, where the proposers find it
    chat     the serve bench's ordinary 128-token prompts (bench.contenders.prompts): a guess
             must come from text the model happens to repeat

The machine may be shared: the three settings run interleaved, in a rotated order, round
after round, and each figure is the median over rounds; compare the ratios. Before each run
the engine is reset (prefix cache and suffix tries empty) and prefix caching is off, so each
run computes its prompts. Acceptance comes from /metrics (vLLM's spec_decode counters):
rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts.
Results: bench/results-speculative.json.
"""
import argparse
import random
import statistics
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from bench.contenders import prompts
from bench.launch import ROOT, App, bench_tokenizer
from bench.serve import Events, run_load, settle, write_results
from engine.teach.loadgen import TASKS, LoadGenerator

SPECS = ("off", "ngram", "suffix")
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def spec_counters(url):
    """The three spec-decode counters from /metrics, by short name."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            out[family.name.rsplit("_num_", 1)[1]] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


def workloads(tok, n_one, n_many):
    """{name: (prompts at 1 in flight, prompts at 8)}: copy tasks of corpus paragraphs, and ordinary prompts."""
    gen, rng = LoadGenerator(tok), random.Random(3)
    copy = [(TASKS["copy"].format(text=gen.prompt(96, 0, rng)), None) for _ in range(n_many)]
    chat = prompts(tok, n_many, 128)
    return {"lookup": (copy[:n_one], copy), "chat": (chat[:n_one], chat)}


def one_run(app, events, batch, in_flight, spec, k, max_tokens):
    """One configuration's run from a reset engine: the serve bench's figures plus acceptance."""
    events.send({"type": "reset"})
    settle(events, {"speculation": spec, "spec_tokens": k, "prefix_caching": False})
    before = spec_counters(app.url)
    out = run_load(app, events, batch, max_tokens, in_flight=in_flight)
    after = spec_counters(app.url)
    d = {name: after[name] - before.get(name, 0.0) for name in after}
    out["drafts"], out["draft_tokens"], out["accepted"] = d["drafts"], d["draft_tokens"], d["accepted_tokens"]
    out["acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None
    out["mean_acceptance_length"] = 1 + d["accepted_tokens"] / d["drafts"] if d["drafts"] else None
    return out


def median_of(runs, key):
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def summarise(rounds):
    """{workload: {in_flight: {spec: medians over rounds, and tok/s relative to off in the same round}}}."""
    out = {}
    for (w, n), by_round in rounds.items():
        row = out.setdefault(w, {}).setdefault(str(n), {})
        for spec in SPECS:
            runs = [r[spec] for r in by_round]
            ratios = [r[spec]["tokens_per_s"] / r["off"]["tokens_per_s"] for r in by_round]
            row[spec] = {key: median_of(runs, key) for key in
                         ("tokens_per_s", "itl_p50", "itl_p99", "ttft_p50", "acceptance_rate",
                          "mean_acceptance_length", "median_forward_s")}
            row[spec]["vs_off"] = statistics.median(ratios)
            row[spec]["vs_off_rounds"] = ratios
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.speculative", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, fewer requests")
    ap.add_argument("--smoke", action="store_true", help="one round of the fewest requests and tokens (a check, not a figure)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, nargs=2, default=(4, 16), metavar=("AT_1", "AT_8"),
                    help="requests per run at 1 and at 8 in flight")
    ap.add_argument("--spec-tokens", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="the app's model threads (1: on a shared 2-core machine, two contending threads stall)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results-speculative.json"))
    args = ap.parse_args(argv)
    rounds_n, (n_one, n_many) = (1, (1, 2)) if args.smoke else (1, (2, 8)) if args.quick else (args.rounds, args.requests)
    if args.smoke:
        args.max_tokens = 8
    app = App("--threads", str(args.threads))
    tok = bench_tokenizer()
    events = Events(app.ws_url)
    loads, rounds = workloads(tok, n_one, n_many), {}
    try:
        for i in range(rounds_n):
            for w, (one, many) in loads.items():
                for n, batch in ((1, one), (8, many)):
                    runs = {}
                    for spec in SPECS[i % 3:] + SPECS[:i % 3]:     # rotated: no setting always runs first
                        print(f"  .. round {i + 1}: {w}, {n} in flight, speculation {spec}", flush=True)
                        runs[spec] = one_run(app, events, batch, n, spec, args.spec_tokens, args.max_tokens)
                    rounds.setdefault((w, n), []).append(runs)
        settle(events, {"speculation": "off", "prefix_caching": True})
    finally:
        events.close()
        app.stop()
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "quick": args.quick,
              "rounds": rounds_n, "spec_tokens": args.spec_tokens, "max_tokens": args.max_tokens, "threads": args.threads,
              "requests": {"1": n_one, "8": n_many}, "results": summarise(rounds),
              "raw": {f"{w}@{n}": r for (w, n), r in rounds.items()}}
    write_results(result, report(result), args.out)


def report(r):
    ms = lambda v: "—" if v is None else f"{1e3 * v:.0f} ms"  # noqa: E731
    num = lambda v, f: f"{'—':>{f[:-2].rstrip('.')}s}" if v is None else format(v, f)  # noqa: E731
    lines = ["", f"speculative decoding, k={r['spec_tokens']}, {r['max_tokens']} new tokens, greedy, ignore_eos; "
             f"median of {r['rounds']} interleaved rounds",
             f"{'workload':8s} {'in flight':>9s} {'spec':7s} {'tok/s':>6s} {'vs off':>7s} {'ITL p50':>8s} "
             f"{'p99':>7s} {'accept':>7s} {'mean len':>8s} {'fwd p50':>8s}"]
    for w, by_n in r["results"].items():
        for n, by_spec in by_n.items():
            for spec, x in by_spec.items():
                lines.append(f"{w:8s} {n:>9s} {spec:7s} {x['tokens_per_s']:6.1f} {x['vs_off']:6.2f}x "
                             f"{ms(x['itl_p50']):>8s} {ms(x['itl_p99']):>7s} {num(x['acceptance_rate'], '7.0%')} "
                             f"{num(x['mean_acceptance_length'], '8.2f')} {ms(x['median_forward_s']):>8s}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
