// First Token: the live figures a lesson points at, computed from the page's state alone
// (pure functions, no DOM). Each preset names the number that proves its point
// (`preset.watch`); proof[name](s, t0) measures that number over what happened since the
// preset was applied at engine time t0, or says what it still waits for. The tour and the
// presenter read the same functions, so a figure is computed one way everywhere.
import {pace} from "ft/busy";
import {proof as samplingProof} from "ft/candidates";
import {proof as wayOutProof} from "ft/delivery";
import {proof as disaggProof} from "ft/disagg";
import {batchCost, costText, ridgeEstimate} from "ft/relations";
import {lessonFigure} from "ft/speculate";
import {percentile, running} from "ft/state";
import {proof as weightsProof} from "ft/weights";
import {fmtS} from "ft/util";

export const median = (xs) => percentile(xs, 50);

// Requests that arrived at or after t0 and finished with a full accounting.
export function finishedSince(s, t0) {
  const out = [];
  for (const id of s.order) {
    const r = s.reqs.get(id);
    if (r.arrival >= t0 && r.stages && r.ttft !== null) out.push(r);
  }
  return out;
}

// Output tokens per second over finished requests: their output tokens ÷ first arrival to last
// finish (the comparison's figure too); null when none finished.
export function throughput(done) {
  if (!done.length) return null;
  const span = Math.max(...done.map((r) => r.end)) - Math.min(...done.map((r) => r.arrival));
  return {n: done.length, span, tps: done.reduce((a, r) => a + (r.outputTokens || 0), 0) / span};
}

// Output tokens per second per stream (1 / mean time per later token), median over requests.
function streamRate(done) {
  const tp = done.filter((r) => r.tpot).map((r) => 1 / r.tpot);
  return median(tp);
}

// Decode steps with the KV cache off since t0: step time against the mean sequence length
// each request recomputed in that step (`tokens` counts whole sequences then). The shortest
// and longest thirds are compared, so noise in single steps does not decide it.
export function recomputeSlope(s, t0) {
  const pts = s.steps.filter((st) => st.kind === "decode" && !st.kv && st.start >= t0 && st.ids.length)
    .map((st) => ({len: st.tokens / st.ids.length, ms: (st.end - st.start) * 1000}))
    .sort((a, b) => a.len - b.len);
  if (pts.length < 6) return null;
  const k = Math.floor(pts.length / 3);
  const lo = pts.slice(0, k), hi = pts.slice(-k);
  return {n: pts.length, short: {len: median(lo.map((p) => p.len)), ms: median(lo.map((p) => p.ms))},
          long: {len: median(hi.map((p) => p.len)), ms: median(hi.map((p) => p.ms))}};
}

// The lesson's measured relation (ft-relations.js): a busier step against a lone one, and where
// arithmetic takes over, measured and as the roofline estimates it; "" before two batch sizes are measured.
function batchingFigure(s) {
  const b = batchCost(s);
  if (!b) return "";
  const r = b.ridge, est = ridgeEstimate(s, b.costs.context);
  const near = (x) => (Number.isFinite(x) ? `batch ${x < 1.5 ? 1 : Math.round(x)}` : "none");
  return ` · measured (${b.costs.source === "sweep" ? "the sweep" : "steps seen"}): ${costText(b)} · arithmetic takes over ` +
    `${r.past === null ? `past batch ${r.most} (not reached)` : `by batch ${r.past}`}` + (est ? ` (roofline estimate: ${near(est.batch)})` : "");
}

// TTFT, queue and prefill medians over the requests finished since t0.
function ttftParts(s, t0) {
  const done = finishedSince(s, t0);
  if (!done.length) return null;
  return {n: done.length, ttft: median(done.map((r) => r.ttft)), queue: median(done.map((r) => r.stages.queue)),
          prefill: median(done.map((r) => r.stages.prefill)), prompt: median(done.map((r) => r.promptTokens || 0)),
          stream: streamRate(done), done};
}

const pct = (a, b) => `${Math.round((100 * a) / b)}%`;
const WAIT = "waiting for the first requests to finish…";

// One function per preset: the number it proves, live. null = nothing measurable yet.
const proof = {
  idle(s, t0) {
    const p = ttftParts(s, t0);
    return p && `prefill ${fmtS(p.prefill)} of TTFT ${fmtS(p.ttft)} (${pct(p.prefill, p.ttft)}); queue ${fmtS(p.queue)}`;
  },
  queueing(s, t0) {
    const p = ttftParts(s, t0);
    return p && `TTFT p50 ${fmtS(p.ttft)} vs prefill median ${fmtS(p.prefill)} · queue median ${fmtS(p.queue)}` +
      (s.hello ? ` · ${s.waiting.length} waiting now` : "");
  },
  "long-document"(s, t0) {
    const p = ttftParts(s, t0);
    return p && `prefill median ${fmtS(p.prefill)} for ${p.prompt}-token prompts ` +
      `(${fmtS(p.prefill / Math.max(1, p.prompt) * 100)} per 100 tokens) · TTFT p50 ${fmtS(p.ttft)}`;
  },
  "many-users"(s, t0) {
    const L = s.last, p = ttftParts(s, t0);
    if (!L) return null;
    return `total ${L.tokens_per_s.toFixed(1)} tokens/s with ${running(s)} running` +
      (p && p.stream ? ` · each stream ${p.stream.toFixed(1)} tokens/s (median request)` : "") + batchingFigure(s);
  },
  "small-cache"(s) {
    const L = s.last;
    if (!L || L.cache_blocks_used === null) return null;
    return `${L.preemptions} preemption${L.preemptions === 1 ? "" : "s"} · ${L.cache_blocks_used}/${L.cache_blocks} blocks in use · ` +
      `${s.waiting.length} waiting${s.waiting.length && L.blocked_on ? ` (for ${L.blocked_on === "cache" ? "KV blocks" : `a ${L.blocked_on}`})` : ""}`;
  },
  "kv-cache-off"(s, t0) {
    const k = recomputeSlope(s, t0);
    return k && `decode step ${k.short.ms.toFixed(1)} ms at ~${Math.round(k.short.len)} tokens → ` +
      `${k.long.ms.toFixed(1)} ms at ~${Math.round(k.long.len)} tokens (${k.n} steps, cache off)`;
  },
  "shared-prefix"(s) {
    const L = s.last;
    if (!L || !L.prefix_queries) return null;
    return `prefix-cache hits ${L.prefix_hits} of ${L.prefix_queries} prompt tokens (${pct(L.prefix_hits, L.prefix_queries)})`;
  },
  "static-batching"(s, t0) { return batchFigure(s, t0); },
  "continuous-batching"(s, t0) { return batchFigure(s, t0); },
  "chunked-prefill"(s, t0) { return stallFigure(s, t0); },
  "prefill-first"(s, t0) { return stallFigure(s, t0); },
  goodput(s, t0) {
    const L = s.last, j = sloCounts(finishedSince(s, t0));
    if (!L || !j.judged) return null;
    return `goodput ${typeof L.goodput === "number" ? L.goodput.toFixed(2) : "—"} req/s · ${j.met} of ${j.judged} met both · ` +
      `missed TTFT ${j.ttft} · missed per-token ${j.tpot}`;
  },
  speculative(s, t0) { return lessonFigure(s, t0, throughput(finishedSince(s, t0))); },
  disaggregation: disaggProof,   // the engine's `disaggregation` preset (ft-disagg.js): the transfers, no stalls
  sampling: samplingProof,       // the sampling lesson (ft-candidates.js): the top bar taken, and how tall
  "speculative-busy"(s, t0) { return lessonFigure(s, t0, throughput(finishedSince(s, t0))); },
};

// Finished requests against their objectives (finished.slo): judged, met both, missed each.
export function sloCounts(done) {
  const out = {judged: 0, met: 0, ttft: 0, tpot: 0};
  for (const r of done) {
    if (!r.slo) continue;
    out.judged++;
    if (r.slo.met) out.met++;
    if (!r.slo.ttft_met) out.ttft++;
    if (!r.slo.tpot_met) out.tpot++;
  }
  return out;
}

function batchFigure(s, t0) {
  const L = s.last, p = ttftParts(s, t0);
  if (!L || !p) return null;
  return `TTFT p50 ${fmtS(p.ttft)} · total ${L.tokens_per_s.toFixed(1)} tokens/s · ${running(s)}/${s.settings.slots} slots busy`;
}

// How long streaming requests waited for others' prefill, per later token (finished.later).
function stallFigure(s, t0) {
  const done = finishedSince(s, t0).filter((r) => r.later && r.tpot);
  const L = s.last;
  if (!done.length || !L || !L.itl) return null;
  const stalled = median(done.map((r) => (r.later.stalled || 0) + (r.later.mixed || 0)));
  return `ITL p50 ${fmtS(L.itl.p50)} · p99 ${fmtS(L.itl.p99)} · a later token spent ${fmtS(stalled)} ` +
    "in or waiting for steps with others' prompts (median)";
}

// Where this run's figures contradict the lesson's claim, what happened instead, said after the
// claim in the banner (ft-teach.js): the idle lesson claims its request never queues, and on a
// busy machine it waited 5.35 s of an 11.7 s TTFT under those words. "" where the run agrees, or
// before anything is measured.
// The queue's share of TTFT, and its least time, from which "it never queues" is not what happened
// (a lone request's ~1 ms of queue is a fifth of the tiny test model's TTFT, and nobody's wait).
const QUEUED = 0.1, QUEUED_S = 0.02;
const RUN_SAYS = {
  idle(s, t0) {
    const p = ttftParts(s, t0);
    if (!p || p.queue < QUEUED * p.ttft || p.queue < QUEUED_S) return "";
    const b = pace(s, t0, s.latestT);
    return ` On this run it did queue: ${fmtS(p.queue)} of its ${fmtS(p.ttft)} TTFT went waiting before the engine took ` +
      "it up, which an idle server does at once" + (b && b.busy ? ` — this machine is busy, its decode steps at ` +
      `${b.factor.toFixed(1)}× their quiet pace.` : ": the engine was held up by something besides this request.");
  },
};
export const runSays = (name, s, t0) => (RUN_SAYS[name] ? RUN_SAYS[name](s, t0) : "");

// The live figure for a preset, or a line saying what it waits for.
export function proofText(name, s, t0) {
  const f = proof[name] || wayOutProof[name] || weightsProof[name];   // the way out's and the cold start's: ft-delivery.js; weights: ft-weights.js
  if (!f) return "";
  return f(s, t0) || WAIT;
}
