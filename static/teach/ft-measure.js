// First Token: "Decode cost, measured". The Measure button sends `{"type": "measure"}`; the
// engine pauses serving, sweeps decode step time over batch sizes and context lengths and KV
// cache on vs off, and publishes the result in a `measure` event (docs/protocol.md). Every
// page announces the pause while it runs and then draws: step time against batch size per
// context length with the memory-bandwidth floor (an estimate, labelled so), tokens/s per
// request and in total, step time against sequence length with the cache on and off, and the
// roofline: every decode and prefill point's step time against the tokens its forward
// computed, on log-log axes under the two roofs (weights ÷ bandwidth, flat; flops ÷ peak matmul
// rate, rising), which are estimates and say so, with the gap between measured and estimated
// named when it is large. Each sweep reads one copy of the weights (`measure.weights`, the
// `weights` setting): the sheet keeps the latest under each, and once both are there draws both,
// each format's step times against its own floor and memory roof (*Measure both weight formats*
// runs the two sweeps in turn, then puts the setting back).
// (Plotly: the global that plotly.min.js, a classic script before the modules, defines.)
import {sweepBusyText, sweepPace} from "ft/busy";
import {send} from "ft/connection";
import {alpha, palette as P} from "ft/palette";
import {batchingSentence, ridgeSentence} from "ft/relations";
import {ROLES, percentile} from "ft/state";
import {rooflineGap} from "ft/targets";
import {$, CHAR_PX, fmtBytes, fmtS, plural, toast} from "ft/util";
import {colorOf, floorOf, formats, inForce, mb, name} from "ft/weights";

// The functions that read the page state take it as `s` (its connectT tells history sent on
// connect from news).
let result = null, drawn = null, drawnBoxes = "";
let byFormat = {};   // weights format -> the latest finished sweep that read it
let both = null;     // "Measure both weight formats" while it runs: {step}
const DASHES = ["solid", "dot", "dashdot", "longdash"];

// The format a sweep read: a finished one says; one still running reads the setting in force.
const formatOf = (s, ev) => ev.weights || inForce(s);
// The sweeps to draw: one per format once both formats have one (the newest first), else the newest.
function shown() {
  const fmts = Object.keys(byFormat);
  if (result && result.status === "done" && fmts.length > 1) return ["dequantised", "stored"].filter((f) => byFormat[f]).map((f) => byFormat[f]);
  return result ? [result] : [];
}

// Every chart's legend sits in rows above its plot, clear of the lines (it covered the longest
// context's end inside the plot); the top margin is sized for the rows it wraps into (frame()).
const LAYOUT = {
  paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
  font: {color: P.text2, size: 13, family: "system-ui, sans-serif"},
  margin: {l: 56, r: 14, t: 8, b: 40}, showlegend: true,
  legend: {orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom", font: {size: 12}, tracegroupgap: 0},
};
// Sized by us from each chart's box (frame()), redrawn when a box changes: plotly's own `responsive`
// follows the window only, and the words above a chart change its height.
const CONFIG = {displayModeBar: false, responsive: false};
const CHARTS = ["m-steps", "m-rates", "m-kv", "m-roof"];
const boxes = () => CHARTS.map((id) => `${$(id).clientWidth}x${$(id).clientHeight}`).join(" ");
// automargin: a title is kept inside its margin, so a margin too small for the tick labels, the
// standoff and the title put the title over the labels (the roofline's "10" under its x title, now
// and then, at 150 % zoom); plotly then grows the margin instead.
const axis = (title, extra) => Object.assign({title: {text: title, standoff: 4}, automargin: true, gridcolor: P.grid, zeroline: false}, extra);
const LEGEND_ITEM_PX = (name) => 44 + 6.6 * name.length;   // a 12 px legend item: its symbol, text and gap

// The y axis titles' short forms, for a plot too short for the long one (at 150 % zoom the
// roofline's "ms per forward (log)" ran past its chart onto the words under it).
const SHORT_Y = {"ms per decode step": "ms / step", "tokens/s (measured)": "tokens/s", "ms per forward (log)": "ms (log)"};

// The layout for one chart in `div`: the legend's rows above the plot (as many as its entries
// wrap into at this width), `extra` over it, and the y title short when the plot is.
function frame(div, data, extra) {
  const names = data.filter((t) => t.showlegend !== false && t.name).map((t) => t.name);
  const width = Math.max(1, div.clientWidth - LAYOUT.margin.l - LAYOUT.margin.r);
  let rows = names.length ? 1 : 0, used = 0;
  for (const n of names) {
    const w = LEGEND_ITEM_PX(n);
    if (used && used + w > width) { rows++; used = 0; }
    used += w;
  }
  const margin = Object.assign({}, LAYOUT.margin, {t: 8 + 20 * rows}), plotH = div.clientHeight - margin.t - margin.b;
  const y = extra.yaxis, long = y && y.title && y.title.text;
  if (y) {
    const yaxis = Object.assign({}, y);
    if (long && SHORT_Y[long] && long.length * CHAR_PX > plotH) yaxis.title = Object.assign({}, y.title, {text: SHORT_Y[long]});
    // a log axis over many decades on a short plot (a busy machine's slow points, a tiny model's
    // roofs at 0.001 ms, 150 % zoom): a label every few decades, so that none runs into the next
    if (y.type === "log" && y.range) yaxis.dtick = Math.max(y.dtick || 1, Math.ceil(MIN_TICK_PX / (Math.max(1, plotH) / (y.range[1] - y.range[0]))));
    extra = Object.assign({}, extra, {yaxis});
  }
  return Object.assign({}, LAYOUT, {margin, width: div.clientWidth, height: div.clientHeight}, extra);
}

// Integer batch ticks: the batch sizes measured, each at least MIN_TICK_PX from the one before
// (the largest always kept), on an axis from 0: it ran "−1 0 1 … 34", the labels colliding.
const MIN_TICK_PX = 24;
function batchAxis(div, batches) {
  const most = Math.max(...batches), range = [0, most * 1.04 + 0.5];
  const px = Math.max(1, div.clientWidth - LAYOUT.margin.l - LAYOUT.margin.r) / (range[1] - range[0]);
  const ticks = [];
  for (const b of [...new Set(batches)].sort((a, c) => a - c)) {
    if (ticks.length && (b - ticks[ticks.length - 1]) * px < MIN_TICK_PX) {
      if (b !== most) continue;
      ticks.pop();
    }
    ticks.push(b);
  }
  return axis("requests in the batch", {range, tickmode: "array", tickvals: ticks, ticktext: ticks.map(String)});
}
const HUES = [P.decode, P.prefill, P.queue, P.tokenize, P.first, P.delivery];

// decode rows grouped by context length, each sorted by batch.
function byContext(rows) {
  const m = new Map();
  for (const r of rows) { if (!m.has(r.context)) m.set(r.context, []); m.get(r.context).push(r); }
  for (const list of m.values()) list.sort((a, b) => a.batch - b.batch);
  return [...m.entries()].sort((a, b) => a[0] - b[0]);
}

// One sweep's lines (one per context length), each with its floor: the weights it read plus
// that batch's keys/values read once at the measured bandwidth (the points' floor_s), an estimate
// that rises with the batch and the context; drawn dashed in its line's colour, one legend entry
// for them all. (It was one flat line at the median of every point's floor, 3.5 ms where its note's
// weights ÷ bandwidth is 1.8 ms.) A context's skipped batches (ev.skipped) are named in its entry.
// With two formats drawn each takes its own colour, and the contexts their dashes.
function stepLines(s, ev, two) {
  const fmt = formatOf(s, ev), tag = two ? `${name(s, fmt, "short")}, ` : "";
  const data = [];
  byContext(ev.decode).forEach(([ctx, rows], i) => {
    const color = two ? colorOf(fmt) : HUES[i % HUES.length];
    const left = skippedOf(ev).filter((k) => k.sweep === "decode" && k.tokens === ctx).map((k) => k.batch);
    data.push({type: "scatter", mode: "lines+markers", name: `${tag}context ${ctx}${left.length ? ` (batch ${left.join(", ")} skipped)` : ""}`,
      x: rows.map((r) => r.batch), y: rows.map((r) => r.step_s * 1000),
      line: {color, width: 3, dash: two ? DASHES[i % DASHES.length] : "solid"},
      hovertemplate: `${tag}context ${ctx}: batch %{x} → %{y:.1f} ms<extra></extra>`});
    const floor = rows.filter((r) => typeof r.floor_s === "number");
    if (floor.length) {
      // one legend entry for a format's floors (its first context's); the others named for their hover
      const fl = floorOf(s, fmt);
      data.push({type: "scatter", mode: "lines", legendgroup: `floor${fmt}`, showlegend: i === 0,
                 name: i ? `estimate: floor, context ${ctx}` : `estimate: memory-bandwidth floor${two && fl && fl.fmt ? ` (${name(s, fmt, "short")}: ${mb(fl.bytes)})` : ""}`, x: floor.map((r) => r.batch), y: floor.map((r) => r.floor_s * 1000),
                 line: {color: two ? colorOf(fmt) : alpha(color, 0.85), width: 1.5, dash: "dash"},
                 hovertemplate: `estimated floor${two ? `, ${name(s, fmt, "short")}` : ""}, context ${ctx}: batch %{x} → %{y:.1f} ms<extra></extra>`});
    }
  });
  return data;
}

function drawSteps(s, evs) {
  const div = $("m-steps"), data = evs.flatMap((ev) => stepLines(s, ev, evs.length > 1));
  const batches = evs.flatMap((ev) => ev.decode.map((r) => r.batch));
  $("m-steps-note").textContent = stepsNote(s, evs[evs.length - 1]);   // first: its lines take the chart's height
  // what the sweep says about batching here, measured (ft-relations.js): across the sheet, under its status
  $("m-findings").textContent = [batchingSentence(s), ridgeSentence(s)].filter(Boolean).join(" ");
  Plotly.react(div, data, frame(div, data, {
    xaxis: batchAxis(div, batches.length ? batches : [1]), yaxis: axis("ms per decode step", {rangemode: "tozero"})}), CONFIG);
}

// The skipped points of a sweep: {sweep, batch, tokens, blocks_needed, blocks_free} (protocol 14; a
// trace before it: words, kept as they are).
const skippedOf = (ev) => (ev.skipped || []).filter((k) => typeof k === "object" && k);

// The steps chart's words: the floor the dashed lines draw, with the numbers it is computed from.
function stepsNote(s, ev) {
  const h = s.hello, bw = h && h.roofline ? h.roofline.gbs : h && h.bandwidth ? h.bandwidth.gbs : null;
  const f = formats(s), fmt = formatOf(s, ev), bytes = f && f[fmt] ? f[fmt].decode_bytes : h && h.bandwidth ? h.bandwidth.weight_bytes : null;
  const first = ev.decode.slice().sort((a, b) => a.context - b.context || a.batch - b.batch)[0];
  const words = [];
  if (bytes && bw && first) {
    words.push(`Dashed: each context's floor, an estimate: (${mb(bytes)} of weights + batch × context × ` +
      `${fmtBytes(h.kv_bytes_per_token)} of keys and values) ÷ ${bw.toFixed(1)} GB/s (measured at start); ${fmtS(bytes / (bw * 1e9))} for the ` +
      `weights alone, ${fmtS(first.floor_s)} at batch ${first.batch}, context ${first.context}.`);
  }
  return words.join(" ");
}

// Total (solid) and per request (dotted) for each context; one legend entry per context (the heading
// says which line is which).
function drawRates(ev) {
  const div = $("m-rates"), data = [];
  byContext(ev.decode).forEach(([ctx, rows], i) => {
    const c = HUES[i % HUES.length];
    data.push({type: "scatter", mode: "lines+markers", name: `context ${ctx}`, legendgroup: String(ctx), x: rows.map((r) => r.batch),
               y: rows.map((r) => r.batch / r.step_s), line: {color: c, width: 3},
               hovertemplate: `context ${ctx}, batch %{x}: %{y:.0f} tokens/s in total<extra></extra>`});
    data.push({type: "scatter", mode: "lines", name: `per request, context ${ctx}`, legendgroup: String(ctx), showlegend: false,
               x: rows.map((r) => r.batch), y: rows.map((r) => 1 / r.step_s), line: {color: c, width: 2, dash: "dot"},
               hovertemplate: `context ${ctx}, batch %{x}: %{y:.1f} tokens/s per request<extra></extra>`});
  });
  const batches = ev.decode.map((r) => r.batch);
  Plotly.react(div, data, frame(div, data, {
    xaxis: batchAxis(div, batches.length ? batches : [1]), yaxis: axis("tokens/s (measured)", {rangemode: "tozero"})}), CONFIG);
}

function drawKV(ev) {
  const rows = ev.kv.slice().sort((a, b) => a.tokens - b.tokens);
  const data = [
    {type: "scatter", mode: "lines+markers", name: "KV cache on", x: rows.map((r) => r.tokens), y: rows.map((r) => r.cached_s * 1000),
     line: {color: P.decode, width: 3}},
    {type: "scatter", mode: "lines+markers", name: "KV cache off (recompute)", x: rows.map((r) => r.tokens),
     y: rows.map((r) => r.recompute_s * 1000), line: {color: P.bad, width: 3}},
  ];
  Plotly.react($("m-kv"), data, frame($("m-kv"), data, {
    xaxis: axis("sequence length, tokens"), yaxis: axis("ms per decode step", {rangemode: "tozero"})}), CONFIG);
}

// The roofs from hello: the memory roof, every weight read once at the measured bandwidth
// (flat: a forward cannot be faster, however few its tokens), and the compute roof, two flops
// per linear weight per token at the measured matmul rate (rising). Both estimates; null in
// observe mode or before hello.
// `fmt`: the copy of the weights the forwards read (hello.weights), else the default format's bytes.
export function roofs(hello, fmt = null) {
  const R = hello && hello.roofline, bw = hello && hello.bandwidth;
  if (!R || !bw || typeof bw.weight_bytes !== "number") return null;
  const f = hello.weights && fmt ? hello.weights.formats[fmt] : null, bytes = f ? f.decode_bytes : bw.weight_bytes;
  return {memoryS: bytes / (R.gbs * 1e9), computeS: (n) => (2 * R.linear_params * n) / (R.peak_gflops * 1e9),
          gbs: R.gbs, gflops: R.peak_gflops, weightBytes: bytes, linear: R.linear_params, fmt: f ? fmt : null};
}

// The median of measured ÷ estimated over points, or null.
const medianRatio = (pts) => percentile(pts.filter((p) => typeof p.predicted_s === "number" && p.predicted_s > 0)
  .map((p) => p.step_s / p.predicted_s), 50);

function drawRoofline(s, evs) {
  const two = evs.length > 1, data = [];
  let xs = [], dec = [], pre = [], R = null;
  const point = (p, n, what) => `${what}<br>measured ${fmtS(p.step_s)} · roofline estimate ${fmtS(p.predicted_s)} (${p.bound}-bound)` +
    (rooflineGap(p.step_s, p.predicted_s) ? `<br>${rooflineGap(p.step_s, p.predicted_s)}` : "");
  for (const ev of evs) {   // each sweep's points, and the memory roof of the bytes it read
    const fmt = formatOf(s, ev), tag = two ? `, ${name(s, fmt, "short")}` : "";
    dec = (ev.decode || []).slice().sort((a, b) => a.batch - b.batch || a.context - b.context);
    pre = (ev.prefill || []).slice().sort((a, b) => a.tokens - b.tokens);
    data.push(
      {type: "scatter", mode: "markers", name: `decode (measured)${tag}`, x: dec.map((p) => p.batch), y: dec.map((p) => p.step_s * 1000),
       marker: {color: two ? colorOf(fmt) : P.decode, size: 9}, text: dec.map((p) => point(p, p.batch, `decode${tag}: batch ${p.batch}, context ${p.context}`)),
       hovertemplate: "%{text}<extra></extra>"},
      {type: "scatter", mode: "lines+markers", name: `prefill (measured)${tag}`, x: pre.map((p) => p.tokens), y: pre.map((p) => p.step_s * 1000),
       marker: {color: P.prefill, size: 9, symbol: two && fmt === "dequantised" ? "square" : "circle"}, line: {color: P.prefill, width: 2},
       text: pre.map((p) => point(p, p.tokens, `prefill${tag}: one ${p.tokens}-token prompt`)), hovertemplate: "%{text}<extra></extra>"});
    xs = xs.concat(dec.map((p) => p.batch), pre.map((p) => p.tokens));
  }
  const roofList = evs.map((ev) => roofs(s.hello, formatOf(s, ev))).filter(Boolean);
  R = roofList[roofList.length - 1] || null;
  if (R && xs.length) {
    const x0 = 1, x1 = Math.max(...xs) * 1.5;
    for (const r of roofList) {
      const tag = two && r.fmt ? `, ${name(s, r.fmt, "short")}: ${mb(r.weightBytes)}` : "";
      data.push({type: "scatter", mode: "lines", name: `memory roof (estimate${tag})`,
                 x: [x0, x1], y: [r.memoryS * 1000, r.memoryS * 1000], line: {color: two ? colorOf(r.fmt) : P.accent, width: 2, dash: "dash"},
                 hovertemplate: `memory roof (estimate${tag}): %{y:.1f} ms<extra></extra>`});
    }
    data.push({type: "scatter", mode: "lines", name: "compute roof (estimate)",
               x: [x0, x1], y: [R.computeS(x0) * 1000, R.computeS(x1) * 1000], line: {color: P.bad, width: 2, dash: "dot"},
               hovertemplate: `compute roof (estimate): %{x:.0f} tokens → %{y:.1f} ms<extra></extra>`});
  }
  $("m-roof-note").textContent = roofNote(s, dec, pre, R, two ? roofList : null);   // first: its lines take the chart's height
  // The y range from the measured points and the memory roofs: the compute roof at one token is far
  // below them (0.002 ms with int8's peak), and drawn to there the decades' labels ran into each other
  // and into the axis title on a short plot. Below the range the compute roof is clipped, not hidden.
  const ys = data.filter((t) => !/^compute/.test(t.name)).flatMap((t) => t.y).filter((v) => v > 0);
  const yrange = ys.length ? [Math.log10(Math.min(...ys) / 2), Math.log10(Math.max(...ys) * 2)] : undefined;
  Plotly.react($("m-roof"), data, frame($("m-roof"), data, {
    xaxis: axis("tokens per forward (log)", {type: "log", dtick: 1}),
    yaxis: axis("ms per forward (log)", {type: "log", dtick: 1, range: yrange})}), CONFIG);
}

// The gap between what was measured and what the roofline estimates, said plainly.
function roofNote(s, dec, pre, R, both = null) {
  if (!R) return "No roofline: this server did not send its measured rates.";
  const parts = [];
  let over = false;
  for (const [name, pts] of [["Decode", dec], ["Prefill", pre]]) {
    const k = medianRatio(pts);
    if (k === null) continue;
    // the first gap over 2x names what the roofline leaves out, once
    const why = over ? ", too" : " (Python, kernel launches, gathering paged KV blocks, kernels below peak)";
    const gap = over ? "overhead" : "overhead the roofline does not model";
    over = over || k > 2;
    parts.push(k > 2 ? `${name}: measured ${k.toFixed(1)}× the roofline (median): ${gap}${why}.`
               : k < 0.5 ? `${name}: measured ${(1 / k).toFixed(1)}× under the roofline (median): the estimated rates are off here.`
               : `${name}: measured ${k.toFixed(1)}× the roofline (median), close to it.`);
  }
  return parts.join(" ") + (both ? ` (The figures: the ${name(s, R.fmt)} sweep.)` : "") +
    ` Roofs, estimates from rates measured at start: memory = ${both ? both.map((r) => `${fmtBytes(r.weightBytes)} (${name(s, r.fmt)})`).join(" or ") : fmtBytes(R.weightBytes)}` +
    ` of weights ÷ ${R.gbs.toFixed(1)} GB/s; compute = 2 flops × ${(R.linear / 1e6).toPrecision(3)} M linear weights × tokens ÷ ` +
    `${R.gflops.toFixed(0)} Gflop/s (a matmul).`;
}

function show(on) { $("sheet-measure").hidden = !on; }

export const reactions = {
  hello() { result = null; byFormat = {}; },
  measure: measured,
};

// A `measure` event (`s`: the state it was folded into): the sheet's status line, and the points to draw.
function measured(ev, s) {
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
    else { $("m-busy").hidden = true; }
  } else if (ev.status === "done") {
    result = ev;
    if (ev.weights) byFormat[ev.weights] = ev;
    status.dataset.status = "done";
    const fmts = Object.keys(byFormat);
    status.textContent = `Measured in ${fmtS(ev.seconds)} on this machine: ${planText(s, ev)}` +
      `${ev.weights ? `, reading the weights ${name(s, ev.weights)}` : ""}; serving resumed. Every point is a timed step; the dashed ` +
      "floors and the roofs are estimates." +
      (fmts.length > 1 ? ` Both weight formats drawn (${fmts.map((f) => name(s, f)).join(", ")}); ` +
      `the rates and KV charts: the latest sweep (${name(s, ev.weights)}).` : "");
  } else {
    status.dataset.status = "error";
    status.textContent = `The measurement failed: ${ev.message}`;
  }
  flags(s, ev);
}

// What the sweep covered: "batches 1–32 (every slot the engine has; serving uses 2 now), contexts 128–1024".
function planText(s, ev) {
  const b = ev.batches || [], c = ev.contexts || [], most = s.hello && s.hello.max_slots, live = s.settings.slots;
  const span = (xs) => (xs.length > 1 ? `${Math.min(...xs)}–${Math.max(...xs)}` : String(xs[0] ?? "—"));
  const why = most && Math.max(...b) === most
    ? ` (up to the engine's ${most} slots${live && live < most ? `; serving uses ${live} now, as the settings left it` : ""})` : "";
  return `batches ${span(b)}${why}, context${c.length > 1 ? "s" : ""} ${span(c)} tokens`;
}

// The sheet's warnings under its status: a sweep taken while the machine was busy (ft-busy.js's
// signal, the points against the engine's quiet pace), and the points it skipped and why.
function flags(s, ev) {
  const busy = ev.status === "done" ? sweepBusyText(sweepPace(s, ev)) : null;
  $("m-busy").hidden = !busy;
  $("m-busy").textContent = busy || "";
  const skipped = ev.skipped || [];
  $("m-skipped").hidden = !skipped.length;
  $("m-skipped").textContent = skipped.length ? `Not measured (${plural(skipped.length, "point")}): ${skipped.map((k) => skippedText(s, k)).join("; ")}.` : "";
}

// "batch 32 at context 1024: needs 2,112 free KV blocks, 2,048 were free (requests in flight held the rest)".
function skippedText(s, k) {
  if (typeof k !== "object" || !k) return String(k);   // a trace before protocol 14: the engine's words
  const where = k.sweep === "decode" ? `batch ${k.batch} at context ${k.tokens}` : k.sweep === "kv"
    ? `KV cache on vs off at ${k.tokens} tokens` : `prefill of a ${k.tokens}-token prompt`;
  const store = s.hello && s.hello.cache_blocks;
  const why = store && k.blocks_needed > store ? `more than the whole KV store (${store.toLocaleString("en")} blocks)`
    : `${k.blocks_free.toLocaleString("en")} were free (requests in flight held the rest)`;
  return `${where} needs ${k.blocks_needed.toLocaleString("en")} free KV blocks, ${why}`;
}

// Charts are drawn when the sheet is visible (plotly needs its size).
export function update({s}) {
  $("m-both").hidden = !(formats(s) && formats(s).stored && formats(s).dequantised) || document.body.dataset.role === ROLES.VIEWER;
  $("m-both").disabled = !!both;
  if (!result || $("sheet-measure").hidden || !window.Plotly) return;
  const key = boxes();
  if (drawn === result && drawnBoxes === key) return;
  drawn = result;
  const evs = shown();
  drawSteps(s, evs); drawRates(result); drawKV(result); drawRoofline(s, evs);
  drawnBoxes = boxes();   // the words written above the charts may have moved them: drawn again at the next tick
  for (const id of CHARTS) $(id).classList.toggle("partial", result.status === "running");
}

// The sheet's buttons; `s`, the page state, for "Measure both".
export function init({s}) {
  $("btn-measure").addEventListener("click", () => {
    if (send({type: "measure"})) { show(true); $("m-status").textContent = "asking the engine to measure…"; }
  });
  $("m-close").addEventListener("click", () => show(false));
  $("m-both").addEventListener("click", () => measureBoth(s));
}

// Resolves when pred() holds (polled), or rejects after `ms`.
const until = (pred, ms) => new Promise((resolve, reject) => {
  const end = performance.now() + ms;
  const timer = setInterval(() => {
    if (pred()) { clearInterval(timer); resolve(); }
    else if (performance.now() > end) { clearInterval(timer); reject(new Error("timed out")); }
  }, 100);
});

// The sweep under each copy of the weights in turn, then the setting as it was: both drawn.
async function measureBoth(s) {
  if (both) return;
  const was = s.settings.weights;
  both = {step: 0};
  try {
    for (const fmt of ["dequantised", "stored"]) {
      if (!send({type: "set", settings: {weights: fmt}})) throw new Error("not connected");
      await until(() => s.settings.weights === fmt, 10000);
      const before = byFormat[fmt], prior = result;
      if (!send({type: "measure"})) throw new Error("not connected");
      show(true);
      const failed = () => result && result !== prior && result.status === "error";
      await until(() => (byFormat[fmt] && byFormat[fmt] !== before) || failed(), 600000);
      if (failed()) throw new Error(result.message);
    }
  } catch (e) {
    toast(`measuring both weight formats stopped: ${e.message}`);
  } finally {
    both = null;
    if (was && s.settings.weights !== was) send({type: "set", settings: {weights: was}});
  }
}
