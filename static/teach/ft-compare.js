// First Token: compare two runs side by side. A comparison runs one teaching preset twice
// with one setting changed (KV cache on or off; static or continuous batching; prefill-first
// or chunked prefill), through the `preset` message with `settings` over the preset's own: the
// engine resets, applies them, and fires the preset's seeded bursts, so both runs get the same
// prompts at the same times. A comparison may run several presets on each side, in turn
// (speculative decoding off vs on: one user, then many). The page records each run's events
// from its `preset` event until all its requests have finished, then draws the two recordings
// on aligned timelines (each in its own state, times from its first arrival) with their TTFT p50
// and total tokens/s (several presets: each one's tokens/s, guesses accepted and tokens per
// forward, and B's tokens/s against A's for each: the crossover), and checks the prompts'
// first tokens to say whether they matched, and that both runs began with an empty prefix
// cache (their `reset` events say so). Each run is drawn while it records, with its progress;
// Cancel stops the comparison and resets the engine. A run gives up only after two minutes
// without a forward, so a slow machine's long run is waited for. The two copies of the weights
// (fp32 dequantised vs the file's 4-bit blocks) run the `weights` preset with the format fixed on
// each side (its timed switch leaves an overridden setting alone), drawn with each side's median
// decode step and the bytes a step read; offered where the server has both (hello.weights).
import {send} from "ft/connection";
import {sloCounts, throughput} from "ft/figures";
import {pct, rates, tally} from "ft/speculate";
import {createState, firstOf, ingest, ofType, percentile} from "ft/state";
import {confirmReset} from "ft/teach";
import {$, el, fmtS} from "ft/util";
import {formats as weightFormats, mb, name as formatName} from "ft/weights";

// The page state `s` (both runs start from its hello and settings) and the page's timeline with
// the features' layers (each run is drawn on one) are passed to the functions that read them.
let awaiting = false;   // a comparison's `preset` message was sent; its event starts the recording
let recording = null;   // {events, requests, reset} while a run is captured
export let runs = null;   // the last finished pair: {cmp, a, b}
let busy = false;
let cancelled = false;
let pending = null;     // {reset}: the `reset` before a comparison's `preset` event
let partial = {};       // side -> the run recorded so far, drawn while it records
let drawn = {runs: null, size: ""};   // what was last drawn: finished runs change only in size
let current = null;     // the comparison running or last run

// base: the preset both runs apply; a/b: the setting each changes over it.
export const COMPARISONS = {
  kv: {title: "KV cache on vs off", base: "kv-cache-off", a: ["KV cache on", {kv_cache: true}], b: ["KV cache off", {kv_cache: false}]},
  batching: {title: "static vs continuous batching", base: "continuous-batching",
             a: ["static batching", {schedule: "static"}], b: ["continuous batching", {schedule: "mixed"}]},
  chunked: {title: "prefill-first vs chunked prefill", base: "chunked-prefill",
            a: ["prefill-first", {schedule: "prefill-first"}], b: ["chunked prefill (mixed)", {schedule: "mixed"}]},
  goodput: {title: "goodput: prefill-first vs chunked prefill", base: "goodput",
            a: ["prefill-first", {schedule: "prefill-first"}], b: ["chunked prefill (mixed)", {schedule: "mixed"}]},
  // Each side runs two presets in turn (`bases`), the same seeded copy tasks for one user, then
  // for many: where speculation gains and where it stops gaining.
  speculation: {title: "speculative decoding off vs on: one user, then many", bases: ["speculative", "speculative-busy"],
                a: ["speculation off", {speculation: "off"}], b: ["speculation on (ngram)", {speculation: "ngram"}]},
  // Offered where both copies exist; labels named from hello.weights when it arrives.
  weights: {title: "weights: dequantised (fp32) vs as stored (4-bit)", base: "weights", figs: "weights",
            offered: (s) => { const f = weightFormats(s); return !!(f && f.stored && f.dequantised); },
            a: ["weights dequantised", {weights: "dequantised"}], b: ["weights as stored", {weights: "stored"}]},
};
const basesOf = (cmp) => cmp.bases || [cmp.base];
const TIME_KEYS = ["t", "start", "end", "sampled"];

// Resolves when pred() holds; gives up after `ms` without it, counted again from each time
// moved() says the run made progress (a slow machine's run is slow, not stuck).
const until = (pred, ms, moved = () => false) => new Promise((resolve, reject) => {
  let end = performance.now() + ms;
  const timer = setInterval(() => {
    if (moved()) end = performance.now() + ms;
    if (cancelled) { clearInterval(timer); reject(new Error("cancelled")); }
    else if (pred()) { clearInterval(timer); resolve(); }
    else if (performance.now() > end) { clearInterval(timer); reject(new Error(`timed out: no forward for ${ms / 1000} s`)); }
  }, 100);
});

// A function that says whether the recording has more forwards than when it last asked.
function progress() {
  let seen = 0;
  return () => {
    const n = recording ? recording.forwards : 0;
    const moved = n !== seen;
    seen = n;
    return moved;
  };
}

// An event with its times counted from the run's start, so both runs share one axis.
function shifted(ev, t0) {
  const out = Object.assign({}, ev);
  for (const k of TIME_KEYS) if (typeof out[k] === "number") out[k] -= t0;
  return out;
}

// A run's own state from its recorded events (one recording per preset it ran, in order), times
// from its first arrival; `parts`: each preset's requests, for its own figures.
function replayRun(s, cmp, side, recs) {
  const rs = createState();
  ingest(rs, shifted(s.hello, s.hello.t), null);
  rs.settings = Object.assign({}, s.settings);
  const events = recs.flatMap((rec) => rec.events), last = recs[recs.length - 1];
  const first = firstOf(events, "request");
  const t0 = first ? first.t : recs[0].t;
  for (const ev of events) ingest(rs, shifted(ev, t0), null);
  const count = (type) => ofType(events, type).length;
  return {label: cmp[side][0], settings: rs.settings, s: rs, requests: recs.reduce((a, rec) => a + rec.requests, 0),
          arrived: count("request"), done: count("finished") + count("rejected"),
          elapsed: (events.length ? events[events.length - 1].t : last.t) - t0,
          emptyCache: recs.every((rec) => rec.reset !== null && rec.reset.cached_blocks === 0),
          prompts: ofType(events, "tokenized").map((e) => e.ids.join(",")),
          several: basesOf(cmp).length > 1,
          parts: recs.map((rec) => ({who: users(rec.requests), ids: new Set(ofType(rec.events, "request")
                                                                             .map((e) => e.id))}))};
}

const users = (n) => `${n} user${n === 1 ? "" : "s"}`;

// Each of the comparison's presets in turn under this side's settings, recorded until all its
// requests have finished.
async function runSide(s, cmp, side) {
  const recs = [];
  for (const base of basesOf(cmp)) {
    recording = null; awaiting = true; pending = null;
    send({type: "preset", name: base, settings: cmp[side][1]});
    await until(() => recording !== null, 30000);
    const rec = recording, n = rec.requests;
    const count = (...types) => ofType(rec.events, ...types).length;
    await until(() => {
      partial[side] = replayRun(s, cmp, side, recs.concat([rec]));
      const p = partial[side], who = basesOf(cmp).length > 1 ? ` · ${users(n)}` : "";
      status(`running ${side.toUpperCase()}: ${cmp[side][0]}${who} — ${p.done} of ${p.requests} requests done, ` +
             `${fmtS(Math.max(0, p.elapsed))}…`);
      return count("request") >= n && count("finished", "rejected") >= n;
    }, 120000, progress());
    recs.push(rec);
    recording = null;
  }
  return replayRun(s, cmp, side, recs);
}

// TTFT p50, total tokens/s (output tokens ÷ first arrival to last finish), ITL-ish per-token p50,
// and against the objectives (finished.slo): goodput (requests that met both ÷ that same span),
// attainment (met ÷ judged) and how many missed each objective. Over the requests in `ids`
// (one part of a run), else all.
export function figures(rs, ids = null) {
  const done = [...rs.reqs.values()].filter((r) => r.ttft !== null && r.end !== null && (!ids || ids.has(r.id)));
  const tp = throughput(done);
  if (!tp) return null;
  const slo = sloCounts(done);
  return {n: done.length, ttft: percentile(done.map((r) => r.ttft), 50), tps: tp.tps, span: tp.span,
          tpot: percentile(done.filter((r) => r.tpot).map((r) => r.tpot), 50), slo,
          goodput: slo.judged ? slo.met / tp.span : null, attainment: slo.judged ? slo.met / slo.judged : null};
}

// A run of several presets: for each, its total tokens/s, its speculative decoding (guesses
// accepted, mean acceptance length) and the tokens its forwards gave out per forward, all from
// its own requests' events.
function partFigs(run) {
  return run.parts.map((p) => {
    const box = el("div", "cmp-part"), f = figures(run.s, p.ids);
    box.append(el("span", "cmp-part-k", p.who));
    const c = tally(run.s.steps, (st) => st.ids.some((id) => p.ids.has(id))), x = rates(c);
    const figs = f ? [fig("tokens/s", f.tps.toFixed(1)), fig("guesses accepted · length", x ? `${pct(x.rate)} · ${x.length.toFixed(2)}` : "none"),
                      fig("tokens/forward", (c.out / c.forwards).toFixed(2))] : [fig("no request finished", "")];
    for (const d of figs) d.dataset.k += ` · ${p.who}`;
    box.append(...figs);
    return box;
  });
}

// The crossover, for a run of several presets: B's total tokens/s over A's, preset by preset.
function crossover(cmp, a, b) {
  const each = a.parts.map((p, i) => {
    const fa = figures(a.s, p.ids), fb = figures(b.s, b.parts[i].ids);
    return `${fa && fb ? `×${(fb.tps / fa.tps).toFixed(2)}` : "—"} with ${p.who}`;
  });
  return `${cmp.b[0]} against ${cmp.a[0]}, total tokens/s: ${each.join(", ")}.`;
}

// "3 of 12 met both · missed: TTFT 2, per-token 7"
function sloFig(f) {
  if (!f.slo.judged) return fig("SLO met", "—");
  const miss = [f.slo.ttft ? `TTFT ${f.slo.ttft}` : "", f.slo.tpot ? `per-token ${f.slo.tpot}` : ""].filter(Boolean);
  const d = fig("SLO met", `${f.slo.met} of ${f.slo.judged} (${Math.round(f.attainment * 100)}%)`);
  d.title = miss.length ? `missed: ${miss.join(", ")}` : "every judged request met both objectives";
  if (miss.length) d.append(el("span", "miss", `missed ${miss.join(" · ")}`));
  return d;
}

async function run(s) {
  if (busy) return;
  const cmp = COMPARISONS[$("c-which").value];
  if (!confirmReset(s, "Comparing two runs")) return;
  current = cmp;
  busy = true; runs = null; cancelled = false; partial = {};
  $("c-run").disabled = true; $("c-cancel").hidden = false;
  try {
    const bases = basesOf(cmp);
    status(`running A: ${cmp.a[0]} (the ${bases.join(" then ")} preset${bases.length > 1 ? "s" : ""})…`);
    const a = await runSide(s, cmp, "a");
    status(`running B: ${cmp.b[0]} (the same requests)…`);
    const b = await runSide(s, cmp, "b");
    runs = {cmp, a, b};
    const n = a.prompts.length;
    const same = n === b.prompts.length && a.prompts.every((p, i) => p === b.prompts[i]);
    const cold = a.emptyCache && b.emptyCache;
    status(!cold ? "Done, but a run did not start from an empty prefix cache: its prefill may be cached. Compare with care." :
           same ? `Done. The same ${n} prompts both times (checked by their first tokens), both from an empty prefix cache; only ${Object.keys(cmp.a[1]).join(", ")} differs.`
                : "Done, but the two runs' prompts differ (checked by their first tokens): compare with care.");
    const st = b.settings;
    if (st.slo_ttft_ms) status(`${$("c-status").textContent} Both judged against TTFT ≤ ${fmtS(st.slo_ttft_ms / 1000)} ` +
                               `and ≤ ${fmtS(st.slo_tpot_ms / 1000)} per later token (✓/✗ after each request).`);
    if (bases.length > 1) status(`${$("c-status").textContent} ${crossover(cmp, a, b)}`);
    if (cmp.figs === "weights") status(`${$("c-status").textContent} ${weightsLine(a, b)}`);
    $("sheet-compare").dataset.same = String(same);
    $("sheet-compare").dataset.cold = String(cold);
  } catch (e) {
    recording = null; awaiting = false;
    if (cancelled) send({type: "reset"});   // its requests stop too
    status(cancelled ? "Cancelled: the engine was reset." : `The comparison stopped: ${e.message}.`);
  } finally {
    busy = false;
    $("c-run").disabled = false; $("c-cancel").hidden = true;
  }
}

function status(text) { $("c-status").textContent = text; }

// A run's decode steps: their median time and the bytes of weights a step read (step.weight_bytes).
function decodeSteps(rs) {
  const steps = rs.steps.filter((st) => st.kind === "decode");
  if (!steps.length) return null;
  return {n: steps.length, ms: percentile(steps.map((st) => (st.end - st.start) * 1000), 50),
          bytes: percentile(steps.filter((st) => typeof st.weightBytes === "number").map((st) => st.weightBytes), 50)};
}

// The two copies of the weights: each side's median decode step and bytes per step, measured and sent by the engine.
function weightsFigs(r, f) {
  const d = decodeSteps(r.s);
  return [fig("decode step p50", d ? `${d.ms.toFixed(1)} ms` : "—"), fig("weights / step", d && d.bytes !== null ? mb(d.bytes) : "—"),
          fig("per later token p50", f ? fmtS(f.tpot) : "—"), fig("total tokens/s", f ? f.tps.toFixed(1) : "—"),
          fig("all done after", f ? fmtS(f.span) : "—")];
}

function weightsLine(a, b) {
  const da = decodeSteps(a.s), db = decodeSteps(b.s);
  if (!da || !db) return "";
  return `Median decode step: ${b.label} ${db.ms.toFixed(1)} ms against ${a.label} ${da.ms.toFixed(1)} ms ` +
    `(${(da.ms / db.ms).toFixed(1)}× faster), reading ${mb(db.bytes)} of weights a step against ${mb(da.bytes)}.`;
}

// Both runs on one time axis: finished ones, or what is recorded so far (an empty side waits).
function draw(timeline) {
  const shown = runs || partial;
  const fa = shown.a && figures(shown.a.s), fb = shown.b && figures(shown.b.s);
  const longest = Math.max(1, ...["a", "b"].map((k) => (shown[k] ? shown[k].elapsed : 0)),
                           fa ? fa.span : 0, fb ? fb.span : 0);
  const span = longest * 1.06;
  const view = {span, right: span * 0.99, paused: true};
  for (const [side, f] of [["a", fa], ["b", fb]]) {
    const r = shown[side];
    const canvas = $(`c-${side}-canvas`);
    if (!r) { canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height); continue; }
    $(`c-${side}-label`).textContent = `${side.toUpperCase()} · ${r.label}` + (runs ? "" : ` (${r.done} of ${r.requests} done)`);
    $(`c-${side}-figs`).replaceChildren(...(r.several ? partFigs(r) : current && current.figs === "weights" ? weightsFigs(r, f) : f ? [
      fig("goodput", f.goodput === null ? "—" : `${f.goodput.toFixed(2)}/s`), sloFig(f),
      fig("TTFT p50", fmtS(f.ttft)), fig("total tokens/s", f.tps.toFixed(1)), fig("per later token p50", fmtS(f.tpot)),
      fig("all done after", fmtS(f.span))] : [fig("no request finished", "")]));
    timeline.draw(canvas, r.s, view, span, {selected: null, grow: false});
  }
}

function fig(k, v) {
  const d = el("div", "fig");
  d.dataset.k = k;
  d.append(el("span", "k", k), el("span", "v", v));
  return d;
}

// The comparisons this server offers (the weights one where it has both copies), named from hello.
function options(s) {
  const f = weightFormats(s), was = $("c-which").value;
  if (f && f.stored && f.dequantised) {
    COMPARISONS.weights.title = `weights: ${formatName(s, "dequantised")} vs ${formatName(s, "stored")}`;
    COMPARISONS.weights.a[0] = `${formatName(s, "dequantised")} (${mb(f.dequantised.decode_bytes)}/step)`;
    COMPARISONS.weights.b[0] = `${formatName(s, "stored")} (${mb(f.stored.decode_bytes)}/step)`;
  }
  $("c-which").replaceChildren(...Object.entries(COMPARISONS).filter(([, c]) => !c.offered || c.offered(s))
    .map(([k, c]) => { const o = el("option", "", c.title); o.value = k; return o; }));
  if (was && COMPARISONS[was] && [...$("c-which").options].some((o) => o.value === was)) $("c-which").value = was;
}

// The sheet's list and buttons, for the page state `s`.
export function init({s}) {
  options(s);
  $("btn-compare").addEventListener("click", () => { $("sheet-compare").hidden = false; });
  $("c-close").addEventListener("click", () => { $("sheet-compare").hidden = true; });
  $("c-run").addEventListener("click", () => run(s));
  $("c-cancel").addEventListener("click", () => { cancelled = true; });
}

// While a comparison awaits its preset, the `reset` before it and then the `preset` event, which
// starts the recording; while one records, every event (after its `preset`).
export const reactions = {
  "*"(ev) { if (recording) recording.events.push(ev); },
  hello(ev, s) { options(s); },
  reset(ev) { if (awaiting) pending = {reset: ev}; },
  preset(ev) {
    if (!awaiting) return;
    awaiting = false;
    recording = {events: [], forwards: 0, requests: ev.requests, t: ev.t, reset: pending ? pending.reset : null};
  },
  step() { if (recording) recording.forwards++; },
};

export function update({timeline}) {
  if ($("sheet-compare").hidden) { drawn = {runs: null, size: ""}; return; }
  const c = $("c-a-canvas"), size = `${c.clientWidth}x${c.clientHeight}`;
  // a finished pair is drawn again only when it or the size changes; a recording every tick
  if (runs && runs === drawn.runs && size === drawn.size) return;
  drawn = {runs, size};
  draw(timeline);
}
