// First Token: "Decode cost, measured". The Measure button sends `{"type": "measure"}`; the
// engine pauses serving, sweeps decode step time over batch sizes and context lengths and KV
// cache on vs off, and publishes the result in a `measure` event (docs/protocol.md). Every
// page announces the pause while it runs and then draws: step time against batch size per
// context length with the memory-bandwidth floor (an estimate, labelled so), tokens/s per
// request and in total, and step time against sequence length with the cache on and off.
// (Plotly: the global that plotly.min.js, a classic script before the modules, defines.)
import {send} from "ft/connection";
import {alpha, palette as P} from "ft/palette";
import {percentile} from "ft/state";
import {$, fmtS, toast} from "ft/util";

let s;   // the page state, from init (its connectT tells history sent on connect from news)
let result = null, drawn = null;

const LAYOUT = {
  paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
  font: {color: P.text2, size: 14, family: "system-ui, sans-serif"},
  margin: {l: 60, r: 14, t: 8, b: 46}, showlegend: true,
  legend: {x: 0, y: 1, bgcolor: alpha(P.bg, 0.7), font: {size: 12}},
};
const CONFIG = {displayModeBar: false, responsive: true};
const axis = (title, extra) => Object.assign({title: {text: title, standoff: 4}, gridcolor: P.grid, zeroline: false}, extra);
const HUES = [P.decode, P.prefill, P.queue, P.tokenize, P.first, P.delivery];

// decode rows grouped by context length, each sorted by batch.
function byContext(rows) {
  const m = new Map();
  for (const r of rows) { if (!m.has(r.context)) m.set(r.context, []); m.get(r.context).push(r); }
  for (const list of m.values()) list.sort((a, b) => a.batch - b.batch);
  return [...m.entries()].sort((a, b) => a[0] - b[0]);
}

function drawSteps(ev) {
  const groups = byContext(ev.decode);
  const data = groups.map(([ctx, rows], i) => ({type: "scatter", mode: "lines+markers", name: `context ${ctx} tokens`,
    x: rows.map((r) => r.batch), y: rows.map((r) => r.step_s * 1000), line: {color: HUES[i % HUES.length], width: 3},
    hovertemplate: `context ${ctx}: batch %{x} → %{y:.1f} ms<extra></extra>`}));
  const floors = ev.decode.map((r) => r.floor_s).filter((v) => typeof v === "number");
  if (floors.length) {
    const batches = [...new Set(ev.decode.map((r) => r.batch))].sort((a, b) => a - b);
    const floor = percentile(floors, 50) * 1000;
    data.push({type: "scatter", mode: "lines", name: "estimate: memory-bandwidth floor", x: batches, y: batches.map(() => floor),
               line: {color: P.accent, width: 2, dash: "dash"}, hovertemplate: "estimate: %{y:.1f} ms<extra></extra>"});
  }
  Plotly.react($("m-steps"), data, Object.assign({}, LAYOUT, {
    xaxis: axis("requests in the batch", {dtick: 1}), yaxis: axis("ms per decode step", {rangemode: "tozero"})}), CONFIG);
}

function drawRates(ev) {
  const groups = byContext(ev.decode);
  const data = [];
  groups.forEach(([ctx, rows], i) => {
    const c = HUES[i % HUES.length];
    data.push({type: "scatter", mode: "lines+markers", name: `total, context ${ctx}`, x: rows.map((r) => r.batch),
               y: rows.map((r) => r.batch / r.step_s), line: {color: c, width: 3}});
    data.push({type: "scatter", mode: "lines", name: `per request, context ${ctx}`, x: rows.map((r) => r.batch),
               y: rows.map((r) => 1 / r.step_s), line: {color: c, width: 2, dash: "dot"}});
  });
  Plotly.react($("m-rates"), data, Object.assign({}, LAYOUT, {
    xaxis: axis("requests in the batch", {dtick: 1}), yaxis: axis("tokens/s (measured)", {rangemode: "tozero"})}), CONFIG);
}

function drawKV(ev) {
  const rows = ev.kv.slice().sort((a, b) => a.tokens - b.tokens);
  const data = [
    {type: "scatter", mode: "lines+markers", name: "KV cache on", x: rows.map((r) => r.tokens), y: rows.map((r) => r.cached_s * 1000),
     line: {color: P.decode, width: 3}},
    {type: "scatter", mode: "lines+markers", name: "KV cache off (recompute)", x: rows.map((r) => r.tokens),
     y: rows.map((r) => r.recompute_s * 1000), line: {color: P.bad, width: 3}},
  ];
  Plotly.react($("m-kv"), data, Object.assign({}, LAYOUT, {
    xaxis: axis("sequence length, tokens"), yaxis: axis("ms per decode step", {rangemode: "tozero"})}), CONFIG);
}

function show(on) { $("sheet-measure").hidden = !on; }

export function onEvent(ev) {
  if (ev.type === "hello") { result = null; return; }
  if (ev.type !== "measure") return;
  const status = $("m-status");
  const replayed = s.connectT !== null && ev.t < s.connectT;   // history sent on connect: no pop-up
  if (ev.status === "running") {
    const first = ev.points_done === null || ev.points_done === undefined;
    if (!replayed && first) { show(true); toast("measuring decode cost: serving is paused while it runs"); }
    status.dataset.status = "running";
    status.textContent = "Measuring: the engine has paused serving (waiting requests wait) while it times decode steps" +
      (first ? "…" : ` — ${ev.points_done} of ${ev.points_total} points` +
                     (ev.eta_s !== null ? `, about ${fmtS(ev.eta_s)} left (estimated from the pace so far)` : "") + ".");
    if (!first) result = ev;   // the points timed so far, drawn as they come
  } else if (ev.status === "done") {
    result = ev;
    status.dataset.status = "done";
    status.textContent = `Measured in ${fmtS(ev.seconds)} on this machine; serving resumed. ` +
      "Every point is a timed step; the dashed floor is an estimate (weight bytes ÷ measured bandwidth).";
  } else {
    status.dataset.status = "error";
    status.textContent = `The measurement failed: ${ev.message}`;
  }
}

// Charts are drawn when the sheet is visible (plotly needs its size).
export function update() {
  if (!result || drawn === result || $("sheet-measure").hidden || !window.Plotly) return;
  drawn = result;
  drawSteps(result); drawRates(result); drawKV(result);
  for (const id of ["m-steps", "m-rates", "m-kv"]) $(id).classList.toggle("partial", result.status === "running");
}

export function init(deps) {
  ({s} = deps);
  $("btn-measure").addEventListener("click", () => {
    if (send({type: "measure"})) { show(true); $("m-status").textContent = "asking the engine to measure…"; }
  });
  $("m-close").addEventListener("click", () => show(false));
}
