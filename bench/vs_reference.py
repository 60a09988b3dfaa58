"""`python -m bench.serve --reference` (`make bench-reference`): First Token against llama.cpp's
`llama-server` on the same GGUF file, both driven by the same client, with the same prompts,
interleaved, in one run; the table gives ratios.

The reference is built once from the sources vendored in the `llama-cpp-python` sdist and cached
(bench/reference.py; ~25 min on 2 cores the first time). Both servers get the same threads
and at least as many slots as requests in flight, and both stay up for the whole run; each
load runs on one, then the other, `--rounds` times, so drift in the machine's load hits both
alike (figures are the median over rounds). Loads, streaming chat, greedy, `ignore_eos`:

    B1   1 in flight, 32-token prompts -> 128 new tokens, 4 requests (batch-1 decode: ITL)
    L1   8 in flight, 128-token prompts -> 32 new tokens, 32 requests
    L2   16 in flight, 32-token prompts -> 128 new tokens, 32 requests

`--quick`: at most two requests per slot in flight (a smoke check). Only loopback addresses are
used; both processes are stopped at the end.
"""
import json
import statistics
import subprocess
import time
import urllib.request

from bench import reference
from bench.contenders import prompts
from bench.launch import App, free_port

LOADS = {"B1": (1, 32, 128, 4), "L1": (8, 128, 32, 32), "L2": (16, 32, 128, 32)}   # in flight, prompt, new, requests
FIGURES = ("tokens_per_s", "ttft_p50", "itl_p50", "itl_p99")


class ReferenceServer:
    """llama-server on 127.0.0.1, started with `bench.reference.serve_cmd`."""

    def __init__(self, threads, slots, timeout=120):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(reference.serve_cmd(self.port, slots=slots, threads=threads),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def run(args, run_load):
    """The comparison; `run_load(url, model, batch, max_tokens, in_flight)` is bench.serve's client."""
    from transformers import AutoTokenizer
    from engine import model as model_mod
    tok = AutoTokenizer.from_pretrained(model_mod._gguf_cache_dir(model_mod.default_model_path()))
    binary = reference.build()
    slots = max(n for n, *_ in LOADS.values())
    ours = App("--threads", str(args.threads), "--slots", str(slots))
    ref = ReferenceServer(args.threads, slots)
    servers = {"first_token": (ours.url, ours.health["model"]), "llama_cpp": (ref.url, ref.model)}
    runs = {load: {name: [] for name in servers} for load in LOADS}
    try:
        for r in range(args.rounds):
            for load, (in_flight, prompt_tokens, new, n) in LOADS.items():
                batch = prompts(tok, min(n, in_flight * 2) if args.quick else n, prompt_tokens)
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    print(f"  .. round {r + 1}/{args.rounds}: {load} on {name}", flush=True)
                    url, model = servers[name]
                    runs[load][name].append(run_load(url, model, batch, new, in_flight))
    finally:
        ours.stop()
        ref.stop()
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": args.threads,
              "slots": slots, "rounds": args.rounds, "reference": str(binary),
              "reference_version": (binary.parent / "VERSION").read_text().strip(), "loads": {}}
    for load, by_server in runs.items():
        med = {name: {f: statistics.median(x[f] for x in rs) for f in FIGURES} for name, rs in by_server.items()}
        result["loads"][load] = {"median": med, "runs": by_server,
                                 "ratio": {f: med["first_token"][f] / med["llama_cpp"][f] for f in FIGURES}}
    return result


def report(r):
    ms = lambda v: f"{1e3 * v:.0f} ms"  # noqa: E731
    lines = ["", f"First Token vs llama.cpp's llama-server ({r['reference_version']}), same GGUF, {r['threads']} "
                 f"threads, {r['slots']} slots each, same client and prompts, interleaved, median of {r['rounds']} "
                 "rounds; ratio = First Token / llama.cpp (tok/s: higher is better; times: lower is better)",
             f"{'load':5s} {'server':12s} {'tok/s':>7s} {'TTFT p50':>9s} {'ITL p50':>9s} {'ITL p99':>9s}"]
    for load, x in r["loads"].items():
        for name, m in x["median"].items():
            lines.append(f"{load:5s} {name:12s} {m['tokens_per_s']:7.1f} {ms(m['ttft_p50']):>9s} "
                         f"{ms(m['itl_p50']):>9s} {ms(m['itl_p99']):>9s}")
        q = x["ratio"]
        lines.append(f"{load:5s} {'ratio':12s} {q['tokens_per_s']:6.2f}x {q['ttft_p50']:8.2f}x "
                     f"{q['itl_p50']:8.2f}x {q['itl_p99']:8.2f}x")
    return "\n".join(lines)
