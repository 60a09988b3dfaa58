"""What structured output costs a decode step (issue 51): one request at a time, decoded with and
without a JSON-schema constraint (engine/model/structured.py: llguidance's mask for the row, built
in the sampling stage), the two kinds alternating so drift in the machine's load hits both alike.

    python -m bench.structured                  # the bundled model, 4 requests each way
    python -m bench.structured --repeats 2 --threads 1

Engine-measured: each token's `sample_s` (its step's sampling stage, where the mask is built and
applied) and each request's `tpot` (its time per output token after the first), from the engine's
own events. Medians over the tokens (sampling) and the requests (tpot); the cost of the mask is
the sampling stage's difference, and the ITL ratio is constrained tpot over plain tpot.
"""
import argparse
import statistics

from bench import engine_cli, machine

PROMPT = "Write a short story about a lighthouse keeper, as JSON."
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
          "required": ["title", "story"]}


def run(engine, tokens, constrained):
    """One greedy request of up to `tokens` new tokens to its end: (its tokens' sample_s, its tpot)."""
    from engine import events as ev
    from engine.core.request import GenerateRequest
    seq = engine.new_sequence(GenerateRequest(prompt=PROMPT, chat=True, max_new_tokens=tokens, temperature=0,
                                              structured_outputs={"json": SCHEMA} if constrained else None))
    events = engine.add(seq)
    while engine.scheduler.running or engine.scheduler.waiting:
        events += engine.step()
    samples = [e.sample_s for e in events if isinstance(e, ev.Token) and e.id == seq.id and not e.first]
    (fin,) = [e for e in events if isinstance(e, ev.Finished) and e.id == seq.id]
    return samples, fin.tpot


def measure(engine, tokens=64, repeats=4):
    run(engine, 4, True)        # the tokenizer's conversion and the first shapes: not timed
    run(engine, 4, False)
    out = {True: ([], []), False: ([], [])}
    for i in range(2 * repeats):
        constrained = i % 2 == 0
        samples, tpot = run(engine, tokens, constrained)
        out[constrained][0].extend(samples)
        out[constrained][1].append(tpot)
    med = {k: (statistics.median(s), statistics.median(t)) for k, (s, t) in out.items()}
    (on_sample, on_tpot), (off_sample, off_tpot) = med[True], med[False]
    return {"tokens": tokens, "repeats": repeats, "plain_sample_s": off_sample, "masked_sample_s": on_sample,
            "mask_cost_s": on_sample - off_sample, "plain_tpot_s": off_tpot, "masked_tpot_s": on_tpot,
            "itl_ratio": on_tpot / off_tpot, "masked_tokens": len(out[True][0])}


def report(r):
    import torch
    print(f"structured output (issue 51) on {machine.describe()}, {torch.get_num_threads()} model threads")
    print(f"  one request, greedy, up to {r['tokens']} tokens, {r['repeats']} each way, alternating, medians: "
          f"sampling stage {r['plain_sample_s'] * 1e3:.2f} ms plain, {r['masked_sample_s'] * 1e3:.2f} ms with a "
          f"JSON-schema mask (+{r['mask_cost_s'] * 1e3:.2f} ms a step); time per output token "
          f"{r['plain_tpot_s'] * 1e3:.1f} -> {r['masked_tpot_s'] * 1e3:.1f} ms ({r['itl_ratio']:.3f}x)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request at most")
    ap.add_argument("--repeats", type=int, default=4, help="requests each way")
    engine_cli.add_flags(ap)
    args = ap.parse_args(argv)
    engine = engine_cli.make_engine(args, slots=2, kv_tokens=4096, max_context=1024)
    r = measure(engine, args.tokens, args.repeats)
    report(r)
    engine_cli.write(args, r)


if __name__ == "__main__":
    main()
