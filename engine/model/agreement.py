"""How far int8 activations move the model's output: measured on the running engine the first
time the `activations` setting is switched to int8 (it is another arithmetic, so the page says
how close it stays, from the engine's own forwards, not from a claim).

Teacher-forced over the shipped corpus's tokens (read again from its start where it is shorter:
2,048 positions where the KV blocks and the context allow, as tests/engine/test_weights_real.py
does): the same token ids go through the engine's own runner twice, chunk by
chunk, once with fp32 activations and once with int8 ones, each with its own keys and values
in blocks taken from the free list (as the measure sweep takes them) and given back after.
At every position the two next-token distributions are compared: the share of positions whose
top token is the same, and the largest difference of any logit. Serving pauses meanwhile (a
few seconds on two cores for SmolLM2), as for the measure sweep.
"""
import time

from ..teach.loadgen import CORPUS
from ..timing.measure import _Synthetic

POSITIONS = 2048
CHUNK = 512


def measure(engine, positions=POSITIONS, chunk=CHUNK):
    """{positions, top1, max_logit_diff, seconds}: int8 against fp32 activations, teacher-forced;
    None where fewer than 64 positions fit (free KV blocks, the model's context)."""
    runner, pool = engine.runner, engine.blocks.pool
    text = CORPUS.read_text()
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = (ids * -(-positions // max(1, len(ids))))[:positions]
    free = (pool.block_budget - pool.used) * pool.block_size // 2      # two sequences' worth
    n = min(positions, len(ids), engine.max_context - 1, free)
    if n < 64:
        return None
    t0 = time.perf_counter()
    before = runner.formats.int8
    same, worst = 0, 0.0
    try:
        with _Synthetic(pool, engine.bundle.model.config.vocab_size) as syn:
            seqs = {arith: syn.seq(n) for arith in (False, True)}
            for seq in seqs.values():
                seq.prompt_ids[:] = ids[:n]                 # the corpus, not the sweep's random ids
            for start in range(0, n, chunk):
                k = min(chunk, n - start)
                logits = {}
                for int8, seq in seqs.items():
                    runner.formats.int8 = int8
                    logits[int8] = runner.logits_everywhere(seq, start, k)
                same += int((logits[False].argmax(-1) == logits[True].argmax(-1)).sum())
                worst = max(worst, float((logits[False] - logits[True]).abs().max()))
    finally:
        runner.formats.int8 = before
    return {"positions": n, "top1": same / n, "max_logit_diff": worst, "seconds": time.perf_counter() - t0}
