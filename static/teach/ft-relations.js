// First Token: the relations the page states in words, drawn from this engine's measurements: how
// much a busier batch slows a decode step, whether a step here is bound by reading the weights or
// by each request's own arithmetic, and where the ridge is (the batch past which arithmetic takes
// over). Never a fixed claim: a kernel that gets faster at batch > 1, another machine or a busy one
// changes them, and the words follow. Each comes from the latest decode-cost sweep of the weights
// format in force when one has run (`s.sweeps`, its smallest context), otherwise from the decode
// steps seen so far (`s.points`, medians by batch size), and says which; the ridge also as the
// roofline estimates it (hello.roofline's measured bandwidth and matmul rate with the model's
// sizes), labelled an estimate. Pure functions of the page state: the diagnosis, the tour's
// Batching step, the measure sheet and the many-users lesson read them, so the page says one
// thing everywhere.
import {sweepPace} from "ft/busy";
import {percentile} from "ft/state";
import {fmtS} from "ft/util";
import {floorOf, inForce, mb} from "ft/weights";

const MIN_STEPS = 3;     // live decode steps at a batch size before its median counts
const PROPORTIONAL = 0.6;   // this share or more: the step grows nearly in proportion to the batch
const NEAR = 0.25;       // a step within this share of the smallest batch's: still nearly as cheap

// The sweep that read the weights in force (else the latest of any format), or null.
function sweepOf(s) {
  const all = Object.values(s.sweeps || {});
  if (!all.length) return null;
  return s.sweeps[inForce(s) || ""] || all.sort((a, b) => b.t - a.t)[0];
}

// A decode step's measured cost by batch size: {source: "sweep" | "steps", rows: [{batch, ms, n}]
// (ascending batch, at least two), context (the sweep's, or the steps' median length), n (steps
// or points), busy (a sweep taken on a busy machine, ft-busy.js)}, or null when fewer than two batch
// sizes are measured.
export function stepCosts(s) {
  const sw = sweepOf(s);
  if (sw) {
    const context = Math.min(...sw.decode.map((p) => p.context));
    const rows = sw.decode.filter((p) => p.context === context).sort((a, b) => a.batch - b.batch)
      .map((p) => ({batch: p.batch, ms: p.step_s * 1000, n: 1}));
    const pace = sweepPace(s, sw);
    if (rows.length >= 2) return {source: "sweep", rows, context, n: sw.decode.length, busy: !!(pace && pace.busy)};
  }
  const fmt = inForce(s);
  const pts = s.points.filter((p) => p.kv && !p.guesses && (!fmt || !p.weights || p.weights === fmt));
  const by = new Map();
  for (const p of pts) { if (!by.has(p.batch)) by.set(p.batch, []); by.get(p.batch).push(p.ms); }
  const rows = [...by].filter(([, ms]) => ms.length >= MIN_STEPS).sort((a, b) => a[0] - b[0])
    .map(([batch, ms]) => ({batch, ms: percentile(ms, 50), n: ms.length}));
  if (rows.length < 2) return null;
  return {source: "steps", rows, context: Math.round(percentile(pts.map((p) => p.len), 50)),
          n: rows.reduce((a, r) => a + r.n, 0), busy: false};
}

// Where the costs come from, as the sentence says it.
export function sourceText(c) {
  return c.source === "sweep"
    ? `the decode-cost sweep, context ${c.context} tokens${c.busy ? ", taken while the machine was busy" : ""}`
    : `the ${c.n} decode steps seen so far, medians by batch size`;
}

// The measured ridge: how far a step stays nearly as cheap as at the smallest batch (within
// 1 + NEAR of it), the first batch past that (where each request's own work, arithmetic, has taken
// over), and what each request adds there (the least-squares slope over the larger half of the
// batches measured). {flatTo, past (null: flat up to the largest measured), perMs, baseMs, most}.
export function measuredRidge(c) {
  const rows = c.rows, base = rows[0], most = rows[rows.length - 1].batch;
  let flatTo = base.batch, past = null;
  for (const r of rows.slice(1)) {
    if (r.ms <= (1 + NEAR) * base.ms && past === null) flatTo = r.batch;
    else if (past === null) past = r.batch;
  }
  let upper = rows.filter((r) => r.batch >= most / 4);
  if (upper.length < 2) upper = rows.slice(-2);
  const mx = upper.reduce((a, r) => a + r.batch, 0) / upper.length, my = upper.reduce((a, r) => a + r.ms, 0) / upper.length;
  const sxx = upper.reduce((a, r) => a + (r.batch - mx) ** 2, 0);
  const perMs = upper.reduce((a, r) => a + (r.batch - mx) * (r.ms - my), 0) / sxx;
  return {flatTo, past, perMs, baseMs: base.ms, base: base.batch, most};
}

// The roofline's ridge for a decode step at `context` (an estimate): the batch where the step's
// flops at the measured matmul rate (per request: 2 per linear and head weight, and attention over
// its context) take as long as its bytes at the measured bandwidth (the weights once, and each
// request's keys and values), as engine/timing/roofline.py counts them. Null without hello.roofline.
export function ridgeEstimate(s, context = 0) {
  const h = s.hello, R = h && h.roofline, fl = floorOf(s);
  if (!R || !fl || !(R.gbs > 0) || !(R.peak_gflops > 0)) return null;
  const bw = R.gbs * 1e9, peak = R.peak_gflops * 1e9;
  const rowFlops = 2 * (R.linear_params + (R.head_params || 0)) + (R.attention_flops_per_pair || 0) * (context + 1);
  const rowS = rowFlops / peak - ((context + 2) * (h.kv_bytes_per_token || 0)) / bw;   // reads its keys/values, writes one
  const readS = fl.bytes / bw;
  return {batch: rowS > 0 ? readS / rowS : Infinity, readS, rowS: rowFlops / peak, rowFlops, bytes: fl.bytes,
          gbs: R.gbs, gflops: R.peak_gflops};
}

const about = (b) => (b < 1.5 ? "1" : b < 10 ? String(Math.round(b)) : String(Math.round(b / 2) * 2));

// The row nearest `batch` (the largest at or below it when two are as near).
function nearest(rows, batch) {
  let best = rows[0];
  for (const r of rows) if (Math.abs(r.batch - batch) <= Math.abs(best.batch - batch)) best = r;
  return best;
}

// How much a step of `batch` (the largest measured when null) costs against one of the smallest
// batch: {costs, base, at, factor, share (what each added request adds, as a share of the
// smallest batch's step), kind: "free" (within 1 + NEAR of it) | "grows" | "proportional" (each
// request adding PROPORTIONAL of a lone step or more), ridge}, or null when not measured.
export function batchCost(s, batch = null) {
  const costs = stepCosts(s);
  if (!costs) return null;
  const base = costs.rows[0], at = batch === null ? costs.rows[costs.rows.length - 1] : nearest(costs.rows, batch);
  const factor = at.ms / base.ms, k = at.batch / base.batch;
  const share = k > 1 ? (factor - 1) / (k - 1) : 0;
  const kind = factor <= 1 + NEAR ? "free" : share >= PROPORTIONAL ? "proportional" : "grows";
  return {costs, base, at, factor, share, kind, ridge: measuredRidge(costs)};
}

const step = (r) => `a step of ${r.batch} request${r.batch === 1 ? "" : "s"}`;

// "a step of 16 requests takes 3.9× a step of 1 (20.6 ms against 5.3 ms)", measured.
export function costText(b) {
  return `${step(b.at)} takes ${b.factor.toFixed(1)}× a step of ${b.base.batch} ` +
    `(${fmtS(b.at.ms / 1000)} against ${fmtS(b.base.ms / 1000)})`;
}

// What batching does to a step here, in one sentence: the measured cost of the largest batch
// (or `batch`) against the smallest, with its source, and what that means for each stream and in
// total. Null when fewer than two batch sizes are measured.
export function batchingSentence(s, batch = null) {
  const b = batchCost(s, batch);
  if (!b || b.at.batch === b.base.batch) return null;
  const total = (b.at.batch / b.base.batch) / b.factor;
  const each = b.kind === "free" ? "each stream only a little slower (each step is mostly reading the weights)"
    : `each stream ${b.factor.toFixed(1)}× slower`;
  return `Measured here (${sourceText(b.costs)}): ${costText(b)}: ${each}, total tokens/s ` +
    `${total >= 1.05 ? `${total.toFixed(1)}× higher` : total > 0.95 ? "about the same" : `${total.toFixed(2)}× as high`}.`;
}

// Where arithmetic takes over, in one sentence: measured (from the same costs) when two batch
// sizes are, and as the roofline estimates it (at the costs' context, else none), labelled.
export function ridgeSentence(s) {
  const b = batchCost(s), c = b && b.costs;
  const est = ridgeEstimate(s, c ? c.context : 0), parts = [];
  if (b && b.at.batch !== b.base.batch) {
    const r = b.ridge, adds = r.perMs > 0 ? `, each request adding about ${fmtS(r.perMs / 1000)}` : "";
    parts.push(r.past === null
      ? `batching is nearly free up to batch ${r.most}, the largest measured (a step within ${1 + NEAR}× of ${r.base === 1 ? "a lone one" : `one of ${r.base}`}): still bound by reading the weights`
      : r.flatTo === r.base
        ? `a step grows from batch ${r.past} on (no flat part): each request's own arithmetic sets the pace` +
          (r.perMs > 0 ? `, about ${fmtS(r.perMs / 1000)} a request` : "")
        : `batching is nearly free up to batch ${r.flatTo} (a step within ${1 + NEAR}× of ${r.base === 1 ? "a lone one" : `one of ${r.base}`}); by batch ${r.past} ` +
          `arithmetic takes over${adds}`);
  }
  if (est) {
    const at = Number.isFinite(est.batch) ? `near batch ${about(est.batch)}` : "at no batch";
    parts.push(`the roofline puts the ridge ${at} (an estimate: ${mb(est.bytes)} ÷ ${est.gbs.toFixed(1)} GB/s = ${fmtS(est.readS)} ` +
      `of reading against ${fmtS(est.rowS)} of arithmetic per request, ${(est.rowFlops / 1e9).toFixed(2)} Gflop at ${est.gflops.toFixed(0)} Gflop/s)`);
  }
  if (!parts.length) return null;
  const text = parts.join("; ");
  return `${b && b.at.batch !== b.base.batch ? "Measured, " : ""}${text}.`.replace(/^./, (x) => x.toUpperCase());
}

// The two together, or what is still to be measured: for the tour, the lesson and the sheet.
export function batchingWords(s) {
  const a = batchingSentence(s), r = ridgeSentence(s);
  if (!a) {
    return "How much a busier batch slows a step is not measured yet: steps at two batch sizes (or the decode-cost " +
      `sweep, Measure decode cost) will say.${r ? ` ${r}` : ""}`;
  }
  return r ? `${a} ${r}` : a;
}

// For the diagnosis: what sharing its steps did to request r (the median batch of the decode steps
// it was in), from the same costs; null when r's steps are gone from the page's history.
export function requestBatchText(r, s) {
  const sizes = s.steps.filter((st) => st.kind === "decode" && st.ids.includes(r.id)).map((st) => st.ids.length);
  if (!sizes.length) return null;
  const batch = percentile(sizes, 50), b = batchCost(s, batch);
  const alone = batch === 1 ? "It had its decode steps to itself" : `Its decode steps held a median of ${batch} requests`;
  if (!b) {
    return `${alone}; how much a busier batch slows a step is not measured yet here (steps at two batch sizes, or the ` +
      "decode-cost sweep, will say).";
  }
  // at the smallest batch measured: how a busier one would cost, for comparison
  if (b.at.batch === b.base.batch) return `${alone}; measured here (${sourceText(b.costs)}), ${costText(batchCost(s))}.`;
  const verdict = b.kind === "free" ? "each step is mostly reading the weights, so sharing the batch slowed it only a little"
    : `sharing the batch made each of its tokens about ${b.factor.toFixed(1)}× slower than ` +
      `${b.base.batch === 1 ? "alone" : `at batch ${b.base.batch}`} — fewer requests at once would likely help too`;
  return `${alone}; measured here (${sourceText(b.costs)}), ${costText(b)}: ${verdict}.`;
}
