// First Token: "Why does this response feel slow?" for the selected request. diagnose(r, s)
// is a pure function of one request and the page state: it adds up the request's measured
// stages (finished.stages for the first token, finished.later per later token, its admissions
// and preemptions) into the parts a person can act on — queueing (for a slot or for KV-cache
// blocks), prefill, decode, waiting behind other requests' prefill, preemption, delivery —
// names the largest, and says so with the numbers, as a hypothesis; for a request that
// speculated, also whether its guesses helped or hurt (its forwards against plain ones measured
// here). The panel shows it.
import {busySuspect} from "ft/busy";
import {diagnoseDelivery, firstShapeNote} from "ft/delivery";
import {selectedReq} from "ft/panels";
import {perTokenText} from "ft/pertoken";
import {requestBatchText} from "ft/relations";
import {diagnoseClient, observing} from "ft/server";
import {pct, rates, requestCounts, tally} from "ft/speculate";
import {percentile, prefillTime, running, stepMedians} from "ft/state";
import {missed, targetBelowEngine} from "ft/targets";
import {$, el, finishText, fmtS, plural} from "ft/util";

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

// Who was ahead of r: requests that had arrived before it and were still waiting when it
// came. And the slots held while it waited: the most requests running at any admission
// during its wait (or half-way through it).
function atArrival(r, s) {
  const end = r.admitted !== null ? r.admitted : s.latestT;
  const running = (t) => {
    let n = 0;
    for (const q of s.reqs.values()) if (q !== r && q.admitted !== null && q.admitted <= t && (q.end === null || q.end > t)) n++;
    return n;
  };
  let ahead = 0, busy = running((r.arrival + end) / 2);
  for (const q of s.reqs.values()) {
    if (q === r || q.rejected || q.arrival >= r.arrival) continue;
    if ((q.admitted === null || q.admitted > r.arrival) && (q.end === null || q.end > r.arrival)) ahead++;
    if (q.admitted !== null && q.admitted > r.arrival && q.admitted < end) busy = Math.max(busy, running(q.admitted));
  }
  return {ahead, busy};
}

// The median decode-only step at a batch size (the nearest measured size; `medians` from
// stepMedians), ms.
function decodeOnlyMs(medians, batch) {
  let best = null;
  for (const b of medians.keys()) if (best === null || Math.abs(b - batch) < Math.abs(best - batch)) best = b;
  return best === null ? null : medians.get(best);
}

// Of the time r spent in mixed forwards (decoding while they also carried others' prompt
// chunks), the part above a decode-only step at the same batch: its wait for their prefill.
// Measured from the forwards still in the page's history; null when none are.
function mixedExcess(r, s) {
  const medians = stepMedians(s.points);
  let excess = 0, seen = 0;
  for (const st of s.steps) {
    if (st.kind !== "mixed" || !st.decodeIds.includes(r.id)) continue;
    const base = decodeOnlyMs(medians, st.decodeIds.length);
    if (base === null) continue;
    seen++;
    excess += Math.max(0, (st.end - st.start) - base / 1000);
  }
  return seen ? excess : null;
}

// Why the queue held it: the reason most stats samples named (r.waitOn, ft-state.js), if any were taken.
function waitedFor(r) {
  const w = r.waitOn;
  let top = null;
  for (const k in w) if (top === null || w[k] > w[top]) top = k;
  return top;
}

// A finished request's time, in seconds per part. Parts sum to e2e (what is left is "other").
function finishedParts(r, s) {
  const st = r.stages, L = r.later || {}, k = Math.max(0, (r.outputTokens || 0) - 1);
  const per = (name) => (L[name] || 0) * k;
  const mixed = per("mixed");
  let excess = mixed > 0 ? mixedExcess(r, s) : 0;
  excess = excess === null ? 0 : Math.min(excess, mixed);
  const p = {
    load: st.load || 0, queue: st.queue, prefill: st.prefill + st.tokenize,
    transfer: st.transfer || 0,   // disaggregated: its keys and values copied to the decode instance (0 colocated)
    decode: per("decode") + (mixed - excess) + per("sample") + st.first_sample,
    stalled: per("stalled") + excess, preempted: per("preempted"),
    delivery: st.delivery + per("delivery"),
  };
  p.other = Math.max(0, r.e2e - sum(Object.values(p)));
  return p;
}

const HELP = {
  slot: "more batch slots or less load would likely help",
  cache: "a bigger KV-cache budget, shorter prompts or fewer requests at once would likely help",
  batch: "static batching held it until the running batch finished; continuous batching would likely let it in sooner",
  budget: "the step token budget went to running requests; a larger step token budget would likely let it in sooner",
  drain: "the KV-cache mode changed and running requests had to drain first",
};

function queueText(r, s, p, total) {
  const {ahead, busy} = atArrival(r, s), slots = s.settings.slots;
  const why = waitedFor(r) || (busy >= slots ? "slot" : null);
  const cause = why === "cache" ? "cache" : "queueing";
  const what = cause === "cache" ? "waiting in the queue for free KV-cache blocks" : "queueing";
  const taken = slots === 1 ? (busy ? "the only slot was busy" : "the only slot was free")
    : busy >= slots ? `all ${slots} slots were busy` : `${busy} of ${slots} slots were busy`;
  const scene = `${plural(ahead, "request was", "requests were")} ahead of it and ${taken} while it waited`;
  return {cause, text: `Most of this request's ${fmtS(total)} was ${what} (${fmtS(p.queue)}): ${scene} — ` +
    `${HELP[why] || HELP.slot}.`, extra: {ahead, busy, slots, waitedFor: why}};
}

function causeText(cause, r, s, p, total) {
  const k = Math.max(0, (r.outputTokens || 0) - 1);
  const lead = (what, v) => `Most of this request's ${fmtS(total)} was ${what} (${fmtS(v)})`;
  switch (cause) {
    case "queueing": return queueText(r, s, p, total);
    case "prefill": {
      const n = r.promptTokens || 0;
      return {cause, text: `${lead("prefill", p.prefill)}: computing its ${n}-token prompt` +
        (n ? ` (${fmtS((p.prefill / n) * 100)} per 100 tokens)` : "") +
        ` — a shorter prompt, or a prompt prefix the prefix cache already holds, would likely help.`};
    }
    case "decode": {
      // how much sharing the batch cost it: measured here (ft-relations.js), never a fixed claim
      const shared = requestBatchText(r, s);
      return {cause, text: `${lead("decoding", p.decode)}: ${plural(k, "later token")} at ${perTokenText(r, s)}, ` +
        `${requestCounts(r).drafts ? "one or more per model step (speculative decoding)" : "one per model step"} ` +
        `shared with the batch — fewer output tokens would likely help.${shared ? ` ${shared}` : ""}`};
    }
    case "stalled": return {cause, text: `${lead("waiting behind other requests' prefill", p.stalled)}: ` +
      `its later tokens waited while other prompts were computed — chunked prefill (the mixed schedule) or a smaller ` +
      `step token budget would likely keep it streaming.`};
    case "preempted": return {cause: "preemption", text: `${lead("preemption", p.preempted)}: the KV cache ran out, it gave its blocks back ` +
      `${plural(r.finalPreemptions || r.preempts.length, "time", "times")} and waited to be recomputed — ${HELP.cache}.`};
    case "transfer": {
      const x = r.transfers[r.transfers.length - 1];
      return {cause, text: `${lead("copying its keys and values from the prefill instance to the decode instance", p.transfer)}` +
        (x ? `: ${(x.bytes / 1e6).toFixed(1)} MB for its ${x.tokens} prompt tokens` : "") +
        ` — a faster link between the instances, or a shorter prompt, would likely help.`};
    }
    case "delivery": return {cause, text: `${lead("delivery", p.delivery)}: handing its tokens on to the client, not the model — ` +
      `a slow client or network is the likely cause.`};
    default: return {cause: "other", text: `${lead("engine time between forwards", p.other)}: not one stage — ` +
      `scheduling and bookkeeping, or a machine busy with other work, is the likely cause.`};
  }
}

// A request that has not finished: what it is doing so far.
function inFlight(r, s) {
  const now = s.latestT, L = s.last;
  if (!r.admits.length) {
    const waited = now - (r.tokEnd !== null ? r.tokEnd : r.arrival);
    const why = L && L.blocked_on;
    const pos = s.waiting.indexOf(r.id);
    return {cause: why === "cache" ? "cache" : "queueing", numbers: {queue: waited},
            text: `So far it has waited ${fmtS(waited)} in the queue` + (pos > 0 ? ` behind ${plural(pos, "request", "requests")}` : "") +
              (s.hello ? `, with ${running(s)}/${s.settings.slots} slots busy` : "") + (why ? ` — ${HELP[why] || ""}` : "") +
              ". The full diagnosis comes when it finishes."};
  }
  if (r.first === null && r.transfers.length) {   // disaggregated: copied, on the decode instance now
    const x = r.transfers[r.transfers.length - 1];
    return {cause: "transfer", numbers: {queue: r.queueS, prefill: prefillTime(r), transfer: x.end - x.start},
            text: `Its prompt was computed on the prefill instance (${fmtS(prefillTime(r))}) and its keys and values copied ` +
              `to the decode instance in ${fmtS(x.end - x.start)}; its first token comes from there.`};
  }
  if (r.first === null) {
    return {cause: "prefill", numbers: {queue: r.queueS, prefill: prefillTime(r)},
            text: `Admitted after ${fmtS(r.queueS)} in the queue; its prompt is being computed (${fmtS(prefillTime(r))} so far).`};
  }
  return {cause: "decode", numbers: {ttft: r.first - r.arrival, tokens: r.tokens.length},
          text: `First token after ${fmtS(r.first - r.arrival)}; ${plural(r.tokens.length, "token")} so far. The full diagnosis comes when it finishes.`};
}

export function diagnose(r, s) {
  if (!r) return null;
  if (r.rejected) return {cause: "rejected", text: `It was refused: ${r.rejected}.`, numbers: {}};
  if (observing(s)) return diagnoseClient(s, r);   // observe mode: no engine stages, only what a client sees
  if (!r.stages) return inFlight(r, s);
  if (r.ttft === null) return {cause: r.reason, text: `It ended (${finishText(r.reason)}) before its first token.`, numbers: {}};
  const p = finishedParts(r, s), total = r.e2e;
  let cause = "other";
  for (const k in p) if (p[k] > p[cause]) cause = k;
  // A cold start, or a first token late here (network, buffering): told apart from queueing and
  // prefill by the model_load and the page's own arrivals (ft-delivery.js).
  const way = diagnoseDelivery(r, s, p[cause] || 0);
  const d = way ? {cause: way.cause, text: way.text, extra: way.numbers} : causeText(cause === "queue" ? "queueing" : cause, r, s, p, total);
  const shapes = firstShapeNote(r, s);   // its first token slowed by new shapes' kernels, measured
  if (shapes) d.text += ` ${shapes}`;
  const rest = Object.entries(p).filter(([k, v]) => k !== cause && v >= 0.1 * total).sort((a, b) => b[1] - a[1]);
  if (rest.length) d.text += ` Next: ${rest.map(([k, v]) => `${NAMES[k]} ${fmtS(v)}`).join(", ")}.`;
  d.numbers = Object.assign({total, ttft: r.ttft, tokens: r.outputTokens}, p, d.extra || {});
  delete d.extra;
  const spec = speculation(r, s);   // what speculative decoding did for its later tokens, when it guessed
  if (spec) { d.text += ` ${spec.text}`; d.spec = spec.verdict; }
  const busy = busySuspect(s, r);   // the machine shared with another program while it ran (measured)
  if (busy) { d.text += ` ${busy}`; d.busy = true; }
  sloVerdict(d, r, s);
  return d;
}

// What speculative decoding did for a request that verified guesses, from its counts and its
// speculating forwards in the page's history: their median time over the tokens each gave it
// (mean acceptance length) is its time per token through them. Against a plain decode step at
// the same batch size measured here (no guesses), that says helped, broke even or hurt; with
// none measured, several tokens per forward alone in the batch say likely helped, few guesses
// accepted in a shared batch (whose forwards computed the rejected ones, every request waiting)
// say likely hurt. Returns {verdict, text}, or null: no guesses verified in the forwards the
// page holds, or nothing measured to judge them by (the request panel still gives the counts).
function speculation(r, s) {
  const c = requestCounts(r), x = rates(c);
  const mine = x ? s.steps.filter((st) => st.spec && st.spec[r.id]) : [];
  if (!mine.length) return null;
  const forward = percentile(mine.map((st) => st.end - st.start), 50), perToken = forward / x.length;
  const batch = Math.round(mine.reduce((a, st) => a + st.ids.length, 0) / mine.length);
  const all = tally(mine), wasted = (all.proposed - all.accepted) / all.positions;
  const plainMs = stepMedians(s.points.filter((p) => p.kv && !p.guesses)).get(batch);
  const plain = plainMs === undefined ? null : plainMs / 1000;
  const them = `${c.accepted} of ${c.proposed} guesses accepted (${pct(x.rate)}), ${x.length.toFixed(1)} tokens per speculating ` +
    `forward, ${batch === 1 ? "alone in the batch" : `${batch} requests in the batch`}: ${fmtS(perToken)} per token for a ` +
    `${fmtS(forward)} forward`;
  const against = plain === null ? "" : ` against ${fmtS(plain)} for a plain decode step at batch ${batch} measured here`;
  const helped = plain !== null ? perToken < 0.9 * plain : x.length >= 1.5 && batch === 1;
  const hurt = plain !== null ? perToken > 1.1 * plain : x.rate < 0.5 && batch > 1 && wasted >= 0.2;
  if (helped) return {verdict: "helped", text: `Speculative decoding ${plain === null ? "likely " : ""}helped: ${them}${against}.`};
  if (hurt) {
    return {verdict: "hurt", text: `Speculative decoding likely cost more than it gave: ${them}${against}; ` +
      `${pct(wasted)} of the positions those forwards computed were rejected guesses. Sharing each forward, the guesses are ` +
      "extra work every request in it waits for: speculation off, or fewer guesses, would likely help."};
  }
  if (plain !== null) return {verdict: "even", text: `Speculative decoding about broke even: ${them}${against}.`};
  return null;
}

// The request against its service-level objectives (finished.slo): a miss leads the text and
// names the objective and both numbers; a met one is said at the end.
function sloVerdict(d, r, s) {
  const o = r.slo, miss = missed(o);
  if (!o) return;
  d.slo = miss;
  if (!miss.length) {
    d.text += ` It met both service-level objectives (TTFT ≤ ${fmtS(o.ttft_target_s)}, ≤ ${fmtS(o.tpot_target_s)} per later token).`;
    return;
  }
  const bits = [];
  if (!o.ttft_met) bits.push(`its TTFT was ${fmtS(r.ttft)} against a ${fmtS(o.ttft_target_s)} target`);
  if (!o.tpot_met) bits.push(`its later tokens took ${fmtS(r.tpot)} each on average (the mean, as the objective judges it) against a ${fmtS(o.tpot_target_s)} target`);
  const below = targetBelowEngine(r, s.points);
  d.text = `It missed its service-level objective${miss.length > 1 ? "s" : ""} (${miss.join(" and ")}): ${bits.join(", and ")}, ` +
    `so it does not count towards goodput.${below ? ` ${below}` : ""} ${d.text}`;
}

const NAMES = {load: "model load", ttftHere: "TTFT here", queue: "queueing", prefill: "prefill", transfer: "KV transfer", decode: "decode", stalled: "waiting behind others' prefill",
               preempted: "preemption", delivery: "delivery", other: "other",
               first_chunk: "waiting for the first chunk (client)", streaming: "streaming (client)"};

// The selected request's diagnosis, computed again only when the request or the engine
// second changes: the panel and the tour's last step both read it on the 4 Hz tick.
let key = "", current = null, drawn;
export function diagnosis(s, ui) {
  const r = selectedReq(s, ui);
  const k = r ? `${s.epoch}:${r.id}:${r.end}:${r.admits.length}:${r.first}:${Math.floor(s.latestT)}` : "";
  if (k !== key) { key = k; current = r ? diagnose(r, s) : null; }
  return current;
}

export function update({s, ui}) {
  const d = diagnosis(s, ui), box = $("d-why");
  if (d === drawn) return;
  drawn = d;
  box.dataset.cause = d ? d.cause : "";
  box.dataset.slo = d && d.slo ? (d.slo.length ? d.slo.join(",") : "met") : "";
  box.dataset.spec = d && d.spec ? d.spec : "";
  if (!d) { box.replaceChildren(); return; }
  const parts = Object.entries(d.numbers).filter(([n, v]) => n in NAMES && typeof v === "number" && v > 0);
  const line = el("div", "why-parts", parts.map(([n, v]) => `${NAMES[n]} ${fmtS(v)}`).join(" · "));
  box.replaceChildren(el("p", "why-text", d.text), line);
}

