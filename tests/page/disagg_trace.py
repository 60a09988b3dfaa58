"""A crafted protocol-13 trace of a disaggregated server (one prefill instance, one decode instance),
for the page's tests until the engine side lands.

TODO(lead): when engine/disagg/ lands, replace `disaggregated_trace()` with a recording of a live
two-process run (`python app.py --disaggregate ...`, engine.record.record(..., preset="disaggregation"))
and keep the tests that use it as they are: they read the trace only through the page.

The run: six long prompts (512 tokens) arrive every half second while earlier ones stream. Each is
admitted on the prefill instance, computed there in two 256-token chunks, its keys and values then
copied (kv_transfer, pulled by the decode instance), admitted on the decode instance (cached_tokens =
the transferred tokens), its last prompt position recomputed there (prefill pos 511, 1 token) in the
decode instance's next forward, and decoded there (24 tokens). Times are plausible for the bundled
model on a CPU; the shapes are docs/protocol.md's (version 13), and the trace validates against
docs/events.schema.json."""
import copy
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
N, PROMPT, CHUNK, NEW = 6, 512, 256, 24
EVERY, CHUNK_S, COPY_GBS = 0.5, 0.15, 2.0
PREFILL_SLOTS, PREFILL_BLOCKS, DECODE_SLOTS, DECODE_BLOCKS = 4, 256, 8, 512


def disaggregated_trace():
    base = json.loads((ROOT / "examples" / "queueing.json").read_text())
    tpl = {ev["type"]: ev for ev in reversed(base)}   # one example of each event's shape
    tpl["kv_transfer"] = {"type": "kv_transfer"}
    hello = copy.deepcopy(base[0])
    bpt, bs = hello["kv_bytes_per_token"], hello["block_size"]
    store = lambda blocks: blocks * bs * bpt   # noqa: E731
    hello.update(t=0.5, protocol=13, max_slots=DECODE_SLOTS, cache_blocks=DECODE_BLOCKS, kv_store_bytes=store(DECODE_BLOCKS),
                 instances=[{"name": "prefill", "pid": 4101, "threads": 1, "max_slots": PREFILL_SLOTS,
                             "cache_blocks": PREFILL_BLOCKS, "kv_store_bytes": store(PREFILL_BLOCKS)},
                            {"name": "decode", "pid": 4102, "threads": 1, "max_slots": DECODE_SLOTS,
                             "cache_blocks": DECODE_BLOCKS, "kv_store_bytes": store(DECODE_BLOCKS)}])
    hello["settings"].update(slots=DECODE_SLOTS, prompt_tokens=PROMPT, max_new_tokens=NEW, max_batched_tokens=CHUNK)
    preset = {"name": "disaggregation", "title": "Prompts on one instance, streams on another",
              "explain": "Long prompts arrive while other answers stream. One engine instance computes prompts, "
                         "another decodes; each prompt's keys and values are copied from one to the other.",
              "watch": "the streams' later tokens never wait for others' prompts",
              "settings": {"prompt_tokens": PROMPT, "max_new_tokens": NEW},
              "actions": [{"at": 0, "burst": 1}, {"at": EVERY, "burst": 1}]}
    hello["presets"] = hello["presets"] + [preset]
    out = [hello, dict(tpl["preset"], t=0.55, name=preset["name"], title=preset["title"], explain=preset["explain"],
                       watch=preset["watch"], overrides={}, requests=N)]
    ev = lambda etype, t, **kw: out.append(dict(copy.deepcopy(tpl[etype]), t=t, **kw))   # noqa: E731
    step = lambda t0, t1, inst, kind, rows, pre, dec: ev(   # noqa: E731
        "step", t1, kind=kind, start=t0, end=t1, ids=list(rows), tokens=pre + dec, prefill_tokens=pre, decode_tokens=dec,
        cache_tokens=sum(rows.values()), cache_blocks_used=sum(math.ceil(n / bs) for n in rows.values()),
        per_request=dict(rows), predicted_s=(t1 - t0) * 0.7, bound="memory" if kind == "decode" else "compute",
        spec=None, first_shape=False, instance=inst)

    # The prefill instance: one prompt at a time, two chunks each; it holds the blocks until copied.
    R, free_at = [], 0.0
    for i in range(N):
        rid, a = f"r{i + 1}", 1.0 + EVERY * i
        r = {"id": rid, "a": a, "tok": a + 0.001, "pslot": i % 2, "src": list(range((i % 2) * 32, (i % 2) * 32 + 32))}
        r["admit_p"] = max(r["tok"], free_at)
        ev("request", a, id=rid, source="load", prompt_tokens=PROMPT, max_new_tokens=NEW, preview=f"long document {i + 1}",
           estimated=False, label=None)
        ev("tokenized", r["tok"], id=rid, start=a, end=r["tok"], n=PROMPT, ids=[11] * 48, pieces=[" word"] * 48, truncated=True)
        ev("admitted", r["admit_p"], id=rid, slot=r["pslot"], queue_s=r["admit_p"] - a, blocks=16, prompt_tokens=PROMPT,
           cached_tokens=0, resumed=False, instance="prefill")
        t = r["pstart"] = r["admit_p"] + 0.0002
        for pos in range(0, PROMPT, CHUNK):
            ev("prefill", t + CHUNK_S, id=rid, start=t, end=t + CHUNK_S, pos=pos, tokens=CHUNK, done=pos + CHUNK == PROMPT,
               instance="prefill")
            step(t, t + CHUNK_S, "prefill", "prefill", {rid: pos + CHUNK}, CHUNK, 0)
            t += CHUNK_S
        r["pdone"] = free_at = t
        r["xs"] = t + 0.003
        r["xe"] = r["xs"] + PROMPT * bpt / (COPY_GBS * 1e9)
        R.append(r)

    # The decode instance: back-to-back forwards while anything runs; a copied prompt joins the next
    # one with its last position recomputed (a mixed step beside the streams).
    T, dfree, running, pending, done = R[0]["xe"], list(range(DECODE_BLOCKS)), [], list(R), []
    while pending or running:
        new = [r for r in pending if r["xe"] <= T]
        if not new and not running:
            T = pending[0]["xe"]
            continue
        for r in new:
            pending.remove(r)
            r["dst"], dfree = dfree[:32], dfree[32:]
            r["dslot"] = min(set(range(DECODE_SLOTS)) - {q["dslot"] for q in running})
            r["admit_d"], r["toks"], r["kinds"] = T, [], []
            ev("kv_transfer", r["xe"], id=r["id"], start=r["xs"], end=r["xe"], tokens=PROMPT, bytes=PROMPT * bpt,
               src_blocks=r["src"], dst_blocks=r["dst"])
            ev("admitted", T, id=r["id"], slot=r["dslot"], queue_s=T - r["xe"], blocks=32, prompt_tokens=PROMPT,
               cached_tokens=PROMPT, resumed=False, instance="decode")
        dur = 0.026 + 0.002 * len(running) + (0.012 if new else 0)
        kind = "mixed" if new and running else "prefill" if new else "decode"
        for r in new:
            ev("prefill", T + dur, id=r["id"], start=T, end=T + dur, pos=PROMPT - 1, tokens=1, done=True, instance="decode")
        rows = {r["id"]: PROMPT + len(r["toks"]) + (0 if r in new else 1) for r in running + new}
        step(T, T + dur, "decode", kind, rows, len(new), len(running))
        T += dur
        for r in running + new:
            r["rec"] = T - r["admit_d"] if r in new else r.get("rec")
            r["toks"].append(T + 0.0004)
            r["kinds"].append(kind)
            k = len(r["toks"]) - 1
            ev("token", T + 0.0004, id=r["id"], index=k, token_id=300 + k, text=f" t{k}", first=k == 0, sampled=T + 0.0002,
               sample_s=0.0002, client_text=None, spec=None)
        running += new
        for r in [q for q in running if len(q["toks"]) == NEW]:
            running.remove(r)
            dfree = sorted(dfree + r["dst"])
            done.append(r)
            finished(ev, r, T + 0.0006)
        T += 0.0008   # scheduling between forwards

    # Each instance's stats, every half second (the decode instance's carry the request figures).
    for k in range(int((T + 0.5 - 1.0) / 0.5) + 1):
        t = 1.25 + 0.5 * k   # (between arrivals: a sample at an arrival would catch it in its millisecond of queue)
        arrived = [r for r in R if r["a"] <= t]
        on_p = [r for r in arrived if r["admit_p"] <= t < r["xe"]]
        wait_p = [r for r in arrived if t < r["admit_p"]]
        pslots = [next((r["id"] for r in on_p if r["pslot"] == i), None) for i in range(PREFILL_SLOTS)]
        ev("stats", t + 0.0001, queue=len(wait_p), running=len(on_p), waiting_ids=[r["id"] for r in wait_p], slots=pslots,
           cache_blocks_used=32 * len(on_p), cache_blocks=PREFILL_BLOCKS, cache_tokens=PROMPT * len(on_p), tokens_per_s=0.0,
           ttft={"p50": None, "p90": None, "p99": None}, itl={"p50": None, "p90": None, "p99": None}, finished=0,
           blocked_on="slot" if wait_p else None, cache_blocks_shared=0, cache_blocks_cached=0,
           block_tables={r["id"]: r["src"] for r in on_p}, prefix_queries=PROMPT * len([r for r in arrived if r["admit_p"] <= t]),
           prefix_hits=0, preemptions=0, goodput=None, slo_attainment=None, slo_met=0, slo_judged=0, instance="prefill")
        on_d = [r for r in R if "admit_d" in r and r["admit_d"] <= t and t < r["toks"][-1]]
        fin = [r for r in R if "toks" in r and len(r["toks"]) == NEW and r["toks"][-1] <= t]
        n_tok = lambda r: sum(1 for x in r.get("toks", []) if x <= t)   # noqa: E731
        tables = {r["id"]: r["dst"] + list(range(480 + 2 * int(r["id"][1:]), 480 + 2 * int(r["id"][1:]) +
                                                    math.ceil((PROMPT + n_tok(r)) / bs) - 32)) for r in on_d}
        ttfts = sorted(r["toks"][0] - r["a"] for r in R if r.get("toks") and r["toks"][0] <= t)
        pct = lambda xs: {"p50": xs[len(xs) // 2], "p90": xs[-1], "p99": xs[-1]} if xs else {"p50": None, "p90": None, "p99": None}   # noqa: E731
        gaps = sorted(b - a for r in R for a, b in zip(r.get("toks", []), r.get("toks", [])[1:]) if b <= t)
        recent = sum(1 for r in R for x in r.get("toks", []) if t - 1.0 < x <= t)
        ev("stats", t + 0.0002, queue=0, running=len(on_d), waiting_ids=[],
           slots=[next((r["id"] for r in on_d if r["dslot"] == i), None) for i in range(DECODE_SLOTS)],
           cache_blocks_used=sum(len(b) for b in tables.values()), cache_blocks=DECODE_BLOCKS,
           cache_tokens=sum(PROMPT + n_tok(r) for r in on_d), tokens_per_s=float(recent), ttft=pct(ttfts), itl=pct(gaps),
           finished=len(fin), blocked_on=None, cache_blocks_shared=0, cache_blocks_cached=0, block_tables=tables,
           prefix_queries=0, prefix_hits=0, preemptions=0, goodput=len(fin) / 30 if fin else None,
           slo_attainment=1.0 if fin else None, slo_met=len(fin), slo_judged=len(fin), instance="decode")
    head, rest = out[:2], out[2:]
    return head + sorted(rest, key=lambda e: e["t"])   # stable: a step after its prefill rows, tokens after it


def finished(ev, r, t):
    """The decode instance's finished event: the TTFT's stages (transfer between prefill and first
    sample) and each later token's parts (no prefill runs on this instance: nothing stalls)."""
    first, ttft = r["toks"][0], r["toks"][0] - r["a"]
    tokenize, queue = r["tok"] - r["a"], (r["pstart"] - r["tok"]) + (r["xs"] - r["pdone"]) + (r["admit_d"] - r["xe"])
    prefill, transfer, sample, delivery = 2 * CHUNK_S + r["rec"], r["xe"] - r["xs"], 0.0002, 0.0001
    gaps = [b - a for a, b in zip(r["toks"], r["toks"][1:])]
    tpot = sum(gaps) / len(gaps)
    mixed = sum(g for g, k in zip(gaps, r["kinds"][1:]) if k == "mixed") / len(gaps)
    ev("finished", t, id=r["id"], reason="length", source="load", prompt_tokens=PROMPT, output_tokens=NEW, e2e=t - r["a"],
       ttft=ttft, tpot=tpot, cached_tokens=0, preemptions=0,
       stages={"tokenize": tokenize, "load": 0, "queue": queue, "prefill": prefill, "transfer": transfer,
               "first_sample": sample, "delivery": delivery,
               "other": max(0.0, ttft - tokenize - queue - prefill - transfer - sample - delivery)},
       later={"decode": tpot - mixed - 0.00028, "mixed": mixed, "stalled": 0.0, "preempted": 0.0, "sample": 0.0002,
              "delivery": 0.00008},
       slo={"ttft_met": ttft <= 2.0, "tpot_met": tpot <= 0.1, "met": ttft <= 2.0 and tpot <= 0.1,
            "ttft_target_s": 2.0, "tpot_target_s": 0.1})
