"""What a prompt's log-probabilities cost (issue 51): a 512-token prompt prefilled with and without
`prompt_logprobs` (the API's echo with logprobs: lm-evaluation-harness's log-likelihood request).

    python -m bench.prompt_logprobs                 # the bundled model, 8 prefills each way
    python -m bench.prompt_logprobs --repeats 4     # fewer
    python -m bench.prompt_logprobs --threads 1     # one model thread (steadier beside other programs)

One request at a time, `max_new_tokens` 1, greedy, the whole prompt in one forward
(`max_batched_tokens` 512) and prefix caching off (a request asking for its prompt's odds never
reads the cache; the plain one must not either, or it would skip its prefill): the two kinds
alternate, so drift in the machine's load hits both alike. Each prefill is timed whole as the
driver runs it (`Engine.step()` until the request finished: its forward, where the output head
runs over every prompt row instead of the last, and its postprocessing, where one batched
log-softmax / top-k / rank turns those rows' logits into the prompt's odds), and its forward
alone (the `step` event's own clock reads). Medians, and the cost as a share of the plain prefill.
"""
import argparse
import statistics
import time

from bench import engine_cli, machine

PROMPT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
          "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
          "it was the season of Darkness, it was the spring of hope, it was the winter of despair. ") * 12


def prefill(engine, tokens, k):
    """One request of `tokens` prompt tokens asking for `k` candidates per prompt token (None: none),
    run to its end: (wall seconds of its steps, seconds of its forwards)."""
    from engine import events as ev
    from engine.core.request import GenerateRequest
    seq = engine.new_sequence(GenerateRequest(prompt=PROMPT, prompt_tokens=tokens, max_new_tokens=1, temperature=0,
                                              prompt_logprobs=k))
    assert len(seq.prompt_ids) == tokens
    engine.add(seq)
    wall = forward = 0.0
    while engine.scheduler.running or engine.scheduler.waiting:
        t0 = time.perf_counter()
        events = engine.step()
        wall += time.perf_counter() - t0
        forward += sum(e.end - e.start for e in events if isinstance(e, ev.Step))
    return wall, forward


def measure(engine, tokens=512, k=1, repeats=8):
    engine.apply_settings({"max_batched_tokens": tokens, "prefix_caching": False})
    prefill(engine, tokens, k)          # the first forward of each shape makes its kernels: not timed
    prefill(engine, tokens, None)
    runs = {True: [], False: []}
    for i in range(2 * repeats):
        asks = i % 2 == 0
        runs[asks].append(prefill(engine, tokens, k if asks else None))
    med = {asks: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for asks, rs in runs.items()}
    (on_s, on_fwd), (off_s, off_fwd) = med[True], med[False]
    return {"tokens": tokens, "k": k, "repeats": repeats, "plain_s": off_s, "with_s": on_s, "share": on_s / off_s - 1,
            "plain_forward_s": off_fwd, "with_forward_s": on_fwd, "forward_share": on_fwd / off_fwd - 1}


def report(r):
    import torch
    print(f"prompt log-probabilities (issue 51) on {machine.describe()}, {torch.get_num_threads()} model threads")
    print(f"  {r['tokens']}-token prompt, top-{r['k']}, median of {r['repeats']} each, alternating: "
          f"{r['plain_s'] * 1e3:.1f} ms plain prefill, {r['with_s'] * 1e3:.1f} ms with the prompt's odds "
          f"({100 * r['share']:+.1f} %); forward alone {r['plain_forward_s'] * 1e3:.1f} -> "
          f"{r['with_forward_s'] * 1e3:.1f} ms ({100 * r['forward_share']:+.1f} %)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512, help="prompt tokens")
    ap.add_argument("--k", type=int, default=1, help="candidates per prompt token (lm-eval asks 1)")
    ap.add_argument("--repeats", type=int, default=8, help="prefills timed each way")
    engine_cli.add_flags(ap)
    args = ap.parse_args(argv)
    engine = engine_cli.make_engine(args, slots=2, kv_tokens=4096, max_context=1024)
    r = measure(engine, args.tokens, args.k, args.repeats)
    report(r)
    engine_cli.write(args, r)


if __name__ == "__main__":
    main()
