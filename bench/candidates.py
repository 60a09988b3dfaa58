"""What the tokens' odds cost (issue 42): per decode step, and in bytes per viewer.

    python -m bench.candidates                  # the bundled model, batch 1 (and 8), 1000 tok/s scaled
    python -m bench.candidates --steps 40       # fewer steps
    python -m bench.candidates --threads 1      # one model thread (steadier beside other programs)

1. **Per step.** One request decodes alone (batch 1; then eight at once) while the engine's
   `candidates` switch flips every step, so drift in the machine's load hits both sides alike.
   Each step is timed whole as the driver does it: `Engine.step()` and the events' wire JSON
   (what publishing costs; the odds' texts, rounding and second JSON included). Medians of each
   side, and their difference as a share of the step without odds: the criterion for keeping
   them on by default was under 2 % of a batch-1 step (engine/core/engine.py `candidates`); it is more on
   a CPU here, so the engine computes them while a page shows them or a request asks.
2. **Bytes per viewer.** The events of a run of `--requests` streams (every event a page gets:
   steps, stats, tokens), grouped into the page's 50 ms frames, sent to a page that does not show
   candidates (`top` null) and to one that asked (`view`), as JSON and as it goes on the wire
   with permessage-deflate (Chromium offers it and simple-websocket accepts it: zlib with the
   context kept between messages, as wsproto's PerMessageDeflate does, plus the frame header).
   Bytes per token, scaled to 1,000 tokens/s (this CPU makes fewer: the figure is that run's
   bytes per token times 1,000; the steps and stats per token are that batch's).
"""
import argparse
import json
import statistics
import time
import zlib

from bench import machine
from engine.broadcast import Wire, encode

FRAME_S = 0.05       # server/live.py SEND_EVERY_S: a page's frames
RATE = 1000          # tokens per second the budget is stated at
BUDGET = 50_000      # bytes per second per viewer at RATE (issue 42)


def step_cost(engine, steps, batch=1, prompt="We hold these truths to be self-evident, that all men"):
    """Median step time (seconds) with the page's odds on and off, alternating every step, over
    `steps` decode steps of `batch` greedy requests: {"on_s", "off_s", "cost_s", "share", "steps"}."""
    from engine.core.request import GenerateRequest
    for _ in range(batch):
        engine.add(engine.new_sequence(GenerateRequest(prompt=prompt, max_new_tokens=steps + 4, ignore_eos=True,
                                                       temperature=0)))
    while not all(s.output_ids for s in engine.scheduler.running) or len(engine.scheduler.running) < batch:
        engine.step()   # prompts computed: every step from here is a decode of `batch` rows
    times = {True: [], False: []}
    for i in range(steps):
        on = i % 2 == 0
        engine.candidates = (lambda: True) if on else (lambda: False)
        t0 = time.perf_counter()
        for ev in engine.step():
            Wire(ev.to_dict())
        times[on].append(time.perf_counter() - t0)
    engine.candidates = lambda: True
    while engine.scheduler.running or engine.scheduler.waiting:
        engine.step()
    on_s, off_s = statistics.median(times[True]), statistics.median(times[False])
    return {"batch": batch, "on_s": on_s, "off_s": off_s, "cost_s": on_s - off_s,
            "share": (on_s - off_s) / off_s, "steps": steps}


def _deflated(frames):
    """Bytes on the wire of these text frames under permessage-deflate (context kept, as wsproto)."""
    comp = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -zlib.MAX_WBITS)
    total = 0
    for text in frames:
        data = comp.compress(text.encode()) + comp.flush(zlib.Z_SYNC_FLUSH)
        n = len(data) - 4            # the sync flush's tail, which the extension strips
        total += n + (2 if n < 126 else 4 if n < 65536 else 10)
    return total


def viewer_bytes(engine, requests=16, new_tokens=48):
    """The events of `requests` streams of `new_tokens` (load-generator prompts, sampled at 0.8),
    as a lean page and a page showing candidates get them: bytes per token, JSON and deflated,
    and per second at RATE tokens/s."""
    from engine.core.request import GenerateRequest
    engine.candidates = lambda: True
    events = []
    for _ in range(requests):
        text = engine.loadgen.prompt(64)
        events += engine.add(engine.new_sequence(GenerateRequest(prompt=text, max_new_tokens=new_tokens,
                                                                 ignore_eos=True, temperature=0.8, source="load")))
    while engine.scheduler.running or engine.scheduler.waiting:
        events += engine.step()
    wires = [Wire(ev.to_dict()) for ev in events]
    tokens = sum(w["type"] == "token" for w in wires)
    frames, start, batch = [], None, []
    for w in wires:                  # the page's frames: every FRAME_S of engine time
        start = w["t"] if start is None else start
        if w["t"] - start >= FRAME_S and batch:
            frames.append(batch)
            batch, start = [], w["t"]
        batch.append(w)
    frames.append(batch)
    out = {"tokens": tokens, "events": len(wires), "frames": len(frames), "rate": RATE, "budget": BUDGET}
    for name, full in (("lean", False), ("candidates", True)):
        texts = [encode(f, full) for f in frames]
        js, wire = sum(len(t.encode()) for t in texts), _deflated(texts)
        out[name] = {"json_per_token": js / tokens, "wire_per_token": wire / tokens,
                     "json_per_s": js / tokens * RATE, "wire_per_s": wire / tokens * RATE}
    return out


def report(costs, sizes):
    import torch
    print(f"the tokens' odds (issue 42) on {machine.describe()}, {torch.get_num_threads()} model threads")
    for c in costs:
        print(f"  decode step, batch {c['batch']}: {c['off_s'] * 1e3:.2f} ms without odds, {c['on_s'] * 1e3:.2f} ms "
              f"with (median of {c['steps'] // 2} steps each, alternating): {c['cost_s'] * 1e6:+.0f} us = "
              f"{100 * c['share']:+.2f} % of the step")
    print(f"  bytes per viewer, {sizes['tokens']} tokens in {sizes['frames']} frames of {FRAME_S * 1000:.0f} ms "
          f"(scaled to {RATE} tokens/s; budget {BUDGET / 1000:.0f} kB/s):")
    for name in ("lean", "candidates"):
        x = sizes[name]
        print(f"    {name:<10} {x['json_per_token']:6.0f} B/token JSON = {x['json_per_s'] / 1000:6.1f} kB/s · "
              f"on the wire (permessage-deflate) {x['wire_per_token']:5.0f} B/token = {x['wire_per_s'] / 1000:6.1f} kB/s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed per batch size (half on, half off)")
    ap.add_argument("--requests", type=int, default=16, help="streams of the bytes-per-viewer run")
    ap.add_argument("--threads", type=int, default=None, help="model threads (default: torch's); 1 is steadier on a busy machine")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    from engine import Engine, EngineConfig
    from engine.model import loading as model_mod
    bundle = model_mod.load()
    engine = Engine(bundle, EngineConfig(slots=max(8, args.requests), kv_tokens=8192, max_context=1024))
    costs = [step_cost(engine, args.steps, 1), step_cost(engine, args.steps // 2, 8)]
    sizes = viewer_bytes(engine, args.requests)
    report(costs, sizes)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine.processor(), "steps": costs, "bytes": sizes}, f, indent=1)


if __name__ == "__main__":
    main()
