// First Token: compare two runs side by side. A comparison runs one teaching preset twice
// with one setting changed (KV cache on or off; static or continuous batching; prefill-first
// or chunked prefill), through the `preset` message with `settings` over the preset's own: the
// engine resets, applies them, and fires the preset's seeded bursts, so both runs get the same
// prompts at the same times. The page records each run's events from its `preset` event until
// all its requests have finished, then draws the two recordings on aligned timelines (each in
// its own state, times from its first arrival) with their TTFT p50 and total tokens/s, and
// checks the prompts' first tokens to say whether they matched, and that both runs began with an
// empty prefix cache (their `reset` events say so). Each run is drawn while it records, with
// its progress; Cancel stops the comparison and resets the engine. A run gives up only after two
// minutes without a forward, so a slow machine's long run is waited for.
import {send} from "ft/connection";
import {sloCounts} from "ft/figures";
import {createState, ingest, percentile} from "ft/state";
import {confirmReset} from "ft/teach";
import {drawTimeline} from "ft/timeline";
import {$, el, fmtS} from "ft/util";

let s;   // the page state, from init (both runs start from its hello and settings)
let awaiting = false;   // a comparison's `preset` message was sent; its event starts the recording
let recording = null;   // {events, requests, reset} while a run is captured
export let runs = null;   // the last finished pair: {cmp, a, b}
let busy = false;
let cancelled = false;
let pending = null;     // {reset}: the `reset` before a comparison's `preset` event
let partial = {};       // side -> the run recorded so far, drawn while it records
let drawn = {runs: null, size: ""};   // what was last drawn: finished runs change only in size

// base: the preset both runs apply; a/b: the setting each changes over it.
export const COMPARISONS = {
  kv: {title: "KV cache on vs off", base: "kv-cache-off", a: ["KV cache on", {kv_cache: true}], b: ["KV cache off", {kv_cache: false}]},
  batching: {title: "static vs continuous batching", base: "continuous-batching",
             a: ["static batching", {schedule: "static"}], b: ["continuous batching", {schedule: "mixed"}]},
  chunked: {title: "prefill-first vs chunked prefill", base: "chunked-prefill",
            a: ["prefill-first", {schedule: "prefill-first"}], b: ["chunked prefill (mixed)", {schedule: "mixed"}]},
  goodput: {title: "goodput: prefill-first vs chunked prefill", base: "goodput",
            a: ["prefill-first", {schedule: "prefill-first"}], b: ["chunked prefill (mixed)", {schedule: "mixed"}]},
};
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

// A run's own state from its recorded events, times from its first arrival.
function replayRun(cmp, side, rec) {
  const rs = createState();
  ingest(rs, shifted(s.hello, s.hello.t), null);
  rs.settings = Object.assign({}, s.settings);
  const first = rec.events.find((e) => e.type === "request");
  const t0 = first ? first.t : rec.t;
  for (const ev of rec.events) ingest(rs, shifted(ev, t0), null);
  const count = (type) => rec.events.filter((e) => e.type === type).length;
  return {label: cmp[side][0], settings: rs.settings, s: rs, requests: rec.requests,
          arrived: count("request"), done: count("finished") + count("rejected"),
          elapsed: (rec.events.length ? rec.events[rec.events.length - 1].t : rec.t) - t0,
          emptyCache: rec.reset !== null && rec.reset.cached_blocks === 0,
          prompts: rec.events.filter((e) => e.type === "tokenized").map((e) => e.ids.join(","))};
}

async function runSide(cmp, side) {
  recording = null; awaiting = true; pending = null;
  send({type: "preset", name: cmp.base, settings: cmp[side][1]});
  await until(() => recording !== null, 30000);
  const n = recording.requests;
  const count = (...types) => recording.events.filter((e) => types.includes(e.type)).length;
  await until(() => {
    partial[side] = replayRun(cmp, side, recording);
    const p = partial[side];
    status(`running ${side.toUpperCase()}: ${cmp[side][0]} — ${p.done} of ${n} requests done, ${fmtS(Math.max(0, p.elapsed))}…`);
    return count("request") >= n && count("finished", "rejected") >= n;
  }, 120000, progress());
  const run = replayRun(cmp, side, recording);
  recording = null;
  return run;
}

// TTFT p50, total tokens/s (output tokens ÷ first arrival to last finish), ITL-ish per-token p50,
// and against the objectives (finished.slo): goodput (requests that met both ÷ that same span),
// attainment (met ÷ judged) and how many missed each objective.
export function figures(rs) {
  const done = [...rs.reqs.values()].filter((r) => r.ttft !== null && r.end !== null);
  if (!done.length) return null;
  const span = Math.max(...done.map((r) => r.end)) - Math.min(...done.map((r) => r.arrival));
  const out = done.reduce((a, r) => a + (r.outputTokens || 0), 0);
  const slo = sloCounts(done);
  return {n: done.length, ttft: percentile(done.map((r) => r.ttft), 50), tps: out / span, span,
          tpot: percentile(done.filter((r) => r.tpot).map((r) => r.tpot), 50), slo,
          goodput: slo.judged ? slo.met / span : null, attainment: slo.judged ? slo.met / slo.judged : null};
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

export async function run() {
  if (busy) return;
  const cmp = COMPARISONS[$("c-which").value];
  if (!confirmReset("Comparing two runs")) return;
  busy = true; runs = null; cancelled = false; partial = {};
  $("c-run").disabled = true; $("c-cancel").hidden = false;
  try {
    status(`running A: ${cmp.a[0]} (the ${cmp.base} preset)…`);
    const a = await runSide(cmp, "a");
    status(`running B: ${cmp.b[0]} (the same requests)…`);
    const b = await runSide(cmp, "b");
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

// Both runs on one time axis: finished ones, or what is recorded so far (an empty side waits).
function draw() {
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
    $(`c-${side}-figs`).replaceChildren(...(f ? [
      fig("goodput", f.goodput === null ? "—" : `${f.goodput.toFixed(2)}/s`), sloFig(f),
      fig("TTFT p50", fmtS(f.ttft)), fig("total tokens/s", f.tps.toFixed(1)), fig("per later token p50", fmtS(f.tpot)),
      fig("all done after", fmtS(f.span))] : [fig("no request finished", "")]));
    drawTimeline(canvas, r.s, view, span, {selected: null, grow: false});
  }
}

function fig(k, v) {
  const d = el("div", "fig");
  d.dataset.k = k;
  d.append(el("span", "k", k), el("span", "v", v));
  return d;
}

export function init(deps) {
  ({s} = deps);
  $("c-which").replaceChildren(...Object.entries(COMPARISONS).map(([k, c]) => { const o = el("option", "", c.title); o.value = k; return o; }));
  $("btn-compare").addEventListener("click", () => { $("sheet-compare").hidden = false; });
  $("c-close").addEventListener("click", () => { $("sheet-compare").hidden = true; });
  $("c-run").addEventListener("click", run);
  $("c-cancel").addEventListener("click", () => { cancelled = true; });
}

export function onEvent(ev) {
  if (awaiting && ev.type === "reset") pending = {reset: ev};
  else if (awaiting && ev.type === "preset") {
    awaiting = false;
    recording = {events: [], forwards: 0, requests: ev.requests, t: ev.t, reset: pending ? pending.reset : null};
  } else if (recording) {
    recording.events.push(ev);
    if (ev.type === "step") recording.forwards++;
  }
}

export function update() {
  if ($("sheet-compare").hidden) { drawn = {runs: null, size: ""}; return; }
  const c = $("c-a-canvas"), size = `${c.clientWidth}x${c.clientHeight}`;
  // a finished pair is drawn again only when it or the size changes; a recording every tick
  if (runs && runs === drawn.runs && size === drawn.size) return;
  drawn = {runs, size};
  draw();
}
