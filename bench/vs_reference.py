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

First Token runs each load twice, once per `weights` setting of the same server process (the
file's 4-bit blocks, and the dequantised fp32 copy), set through its websocket before the load.
llama.cpp built with GGML_NATIVE=ON dies with SIGILL in its weight-repacking path on some CPUs
(the Xeon of this week): the server is then started again with `--no-repack`, and the results
say so. Where it exits between requests ("cleaning up before exit"), it is restarted and the
load run again (counted in the results). The processor is named in the results and the table.

`--quick`: at most two requests per slot in flight; `--smoke`: one short request a load (a check
of the bench, not a figure). Only loopback addresses are
used; both processes are stopped at the end.
"""
import json
import statistics
import subprocess
import time
import urllib.request

from bench import machine, reference
from bench.contenders import prompts
from bench.launch import App, free_port

LOADS = {"B1": (1, 32, 128, 4), "L1": (8, 128, 32, 32), "L2": (16, 32, 128, 32)}   # in flight, prompt, new, requests
FIGURES = ("tokens_per_s", "ttft_p50", "itl_p50", "itl_p99")


class ReferenceServer:
    """llama-server on 127.0.0.1, started with `bench.reference.serve_cmd` (and `--no-repack`
    where the repacking path dies with SIGILL); `ensure_up()` restarts it if it has exited."""

    def __init__(self, threads, slots, timeout=120):
        self.threads, self.slots, self.timeout = threads, slots, timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra, self.restarts = [], 0
        if not self._start():
            self.extra = ["--no-repack"]
            if not self._start():
                raise RuntimeError(f"llama-server did not start (exit {self.proc.returncode}), with or without --no-repack")

    def _start(self):
        self.proc = subprocess.Popen(reference.serve_cmd(self.port, slots=self.slots, threads=self.threads) + self.extra,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + self.timeout
        while time.time() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    self.model = json.loads(r.read())["data"][0]["id"]
                    return True
            except OSError:
                time.sleep(0.2)
        self.stop()
        return False

    def ensure_up(self):
        if self.proc.poll() is not None:
            self.restarts += 1
            if not self._start():
                raise RuntimeError("llama-server did not start again")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _rss_mb(pid):
    import psutil
    return psutil.Process(pid).memory_info().rss / 2 ** 20


def run(args, run_load, set_weights):
    """The comparison; `run_load(url, model, batch, max_tokens, in_flight)` is bench.serve's client,
    `set_weights(app, format)` switches First Token's `weights` setting."""
    from transformers import AutoTokenizer
    from engine.model import loading as model_mod
    tok = AutoTokenizer.from_pretrained(model_mod._gguf_cache_dir(model_mod.default_model_path()))
    binary = reference.build()
    slots = max(n for n, *_ in LOADS.values())
    ours = App("--threads", str(args.threads), "--slots", str(slots))
    ref = ReferenceServer(args.threads, slots)
    # name -> (url, model, First Token's weights format or None)
    servers = {"first_token": (ours.url, ours.health["model"], "stored"),
               "first_token_fp32": (ours.url, ours.health["model"], "dequantised"),
               "llama_cpp": (ref.url, ref.model, None)}
    runs = {load: {name: [] for name in servers} for load in LOADS}
    rss = {"first_token": [], "llama_cpp": []}
    try:
        for r in range(args.rounds):
            for load, (in_flight, prompt_tokens, new, n) in LOADS.items():
                if getattr(args, "smoke", False):       # one short request a load (a check, not a figure)
                    n, prompt_tokens, new = 1, 16, 4
                batch = prompts(tok, min(n, in_flight * 2) if args.quick else n, prompt_tokens)
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order:
                    print(f"  .. round {r + 1}/{args.rounds}: {load} on {name}", flush=True)
                    url, model, weights = servers[name]
                    if weights:
                        set_weights(ours, weights)
                    else:
                        ref.ensure_up()
                    try:
                        runs[load][name].append(run_load(url, model, batch, new, in_flight))
                    except OSError:
                        if weights:
                            raise
                        ref.ensure_up()          # it exited mid-load: once more on a fresh one
                        runs[load][name].append(run_load(url, model, batch, new, in_flight))
                rss["first_token"].append(_rss_mb(ours.proc.pid))
                rss["llama_cpp"].append(_rss_mb(ref.proc.pid))
    finally:
        ours.stop()
        ref.stop()
    result = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": args.threads,
              "slots": slots, "rounds": args.rounds, "reference": str(binary),
              "reference_version": (binary.parent / "VERSION").read_text().strip(),
              "reference_flags": ref.extra, "reference_restarts": ref.restarts,
              "processor": machine.processor(), "rss_mb_max": {k: max(v) for k, v in rss.items() if v}, "loads": {}}
    for load, by_server in runs.items():
        med = {name: {f: statistics.median(x[f] for x in rs) for f in FIGURES} for name, rs in by_server.items()}
        result["loads"][load] = {"median": med, "runs": by_server,
                                 "ratio": {f: med["first_token"][f] / med["llama_cpp"][f] for f in FIGURES},
                                 "ratio_fp32": {f: med["first_token_fp32"][f] / med["llama_cpp"][f] for f in FIGURES}}
    return result


def report(r):
    ms = lambda v: f"{1e3 * v:.0f} ms"  # noqa: E731
    p = r["processor"]
    lines = ["", f"First Token vs llama.cpp's llama-server ({r['reference_version']}"
                 f"{', ' + ' '.join(r['reference_flags']) if r['reference_flags'] else ''}), same GGUF, {r['threads']} "
                 f"threads, {r['slots']} slots each, same client and prompts, interleaved, median of {r['rounds']} "
                 "rounds; ratio = First Token (weights as stored) / llama.cpp (tok/s: higher is better; times: "
                 f"lower is better); on {p['model']} ({p['isa']}, {p['cores']} cores); llama-server restarts: "
                 f"{r['reference_restarts']}; resident memory at most: " +
                 ", ".join(f"{k} {v:.0f} MB" for k, v in r["rss_mb_max"].items()),
             f"{'load':5s} {'server':16s} {'tok/s':>7s} {'TTFT p50':>9s} {'ITL p50':>9s} {'ITL p99':>9s}"]
    for load, x in r["loads"].items():
        for name, m in x["median"].items():
            lines.append(f"{load:5s} {name:16s} {m['tokens_per_s']:7.1f} {ms(m['ttft_p50']):>9s} "
                         f"{ms(m['itl_p50']):>9s} {ms(m['itl_p99']):>9s}")
        for label, key in (("ratio", "ratio"), ("ratio fp32", "ratio_fp32")):
            q = x[key]
            lines.append(f"{load:5s} {label:16s} {q['tokens_per_s']:6.2f}x {q['ttft_p50']:8.2f}x "
                         f"{q['itl_p50']:8.2f}x {q['itl_p99']:8.2f}x")
    return "\n".join(lines)
