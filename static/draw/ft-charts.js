// First Token: the plotly charts, redrawn at 2 Hz when the state moved and only while
// visible. Where the time to first token went for the last finished requests, and the
// measured decode step time against batch size with the estimated bandwidth floor.
// Colours come from the palette in ft.css (ft-palette.js). Plotly is the global that
// plotly.min.js (a classic script, loaded before the modules where the page has charts) defines.
import {alpha, palette as P, stageColor, stagesOf} from "ft/palette";
import {percentile, stepMedians} from "ft/state";
import {rooflineGap} from "ft/targets";
import {$, CHAR_PX} from "ft/util";
import {floorMarks, formatTraces, pointFormats} from "ft/weights";

let version = -1;   // the state version last drawn
let drawnSize = "";   // and the charts' boxes it was drawn in

const PLOT_LAYOUT = {
  paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
  font: {color: P.text2, size: 13, family: "system-ui, sans-serif"},
  margin: {l: 52, r: 10, t: 6, b: 36}, showlegend: true,
  legend: {orientation: "h", y: -0.22, font: {size: 13}},
};
// Sized by us (update, sized), not by plotly's `responsive`: that follows only the window,
// and under presenter mode's CSS zoom plotly measures the zoomed box and draws 1.4x too wide.
const PLOT_CONFIG = {displayModeBar: false, responsive: false, staticPlot: false};
const sized = (div, height) => ({width: div.clientWidth, height: height || div.clientHeight});

// Every draw goes through here. With `firstToken.traceCharts` set (the browser tests set it),
// each is announced on the console first, so an error plotly's SVG logs while drawing comes
// right after the name and box of the chart that caused it.
export const trace = {on: false};
function react(div, data, layout) {
  if (trace.on) console.debug(`plotly.react #${div.id} ${layout.width}x${layout.height} box ${div.clientWidth}x${div.clientHeight}`);
  Plotly.react(div, data, layout, PLOT_CONFIG);
}
const SHOW_FINISHED = 16;   // requests in the stages chart
const ROW_PX = 19;          // its least height per request (13 px names, one per row)
const NAME_CHAR_PX = 8;     // a 13 px monospace character of a row's name, with a little to spare
// A legend in one row above the plot, out of the way of the points and the floor's label.
const LEGEND_ABOVE = {orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom", font: {size: 13}};
const STEPS_MARGIN = {l: 52, r: 20, t: 26, b: 42};   // the steps chart's (either kind)
const MIN_CHART_W = 200;   // px: narrower, the margins and the stages chart's row names leave no plot

// Median step time per batch size, as a trace's x and y.
function medians(pts) {
  const m = stepMedians(pts);
  return {x: [...m.keys()], y: [...m.values()]};
}
const jitter = (p) => p.batch + ((p.ms * 7919) % 1 - 0.5) * 0.3;   // deterministic spread so dots don't stack

// Dots and their median line, for the steps with the KV cache on, then (if any) off.
// A decode step's hover: measured, and the roofline's estimate beside it (step.predicted_s).
const stepHover = (pts) => ({customdata: pts.map((p) => [p.batch, p.predMs === null ? "—" : `${p.predMs.toFixed(1)} ms`,
                                                         p.bound || "", p.predMs ? rooflineGap(p.ms, p.predMs) || "" : ""]),
  hovertemplate: "batch %{customdata[0]}: measured %{y:.1f} ms<br>roofline estimate %{customdata[1]} (%{customdata[2]}-bound)" +
                 "<br>%{customdata[3]}<extra></extra>"});

// The median roofline estimate per batch size (an estimate, drawn thin and labelled so).
function predictedMedians(pts) {
  const by = new Map();
  for (const p of pts) if (p.predMs !== null) { if (!by.has(p.batch)) by.set(p.batch, []); by.get(p.batch).push(p.predMs); }
  const x = [...by.keys()].sort((a, b) => a - b);
  return {x, y: x.map((b) => percentile(by.get(b), 50))};
}

// The median of measured ÷ estimated over the decode steps: how far above the roofline they run.
export function rooflineRatio(pts) {
  return percentile(pts.filter((p) => p.predMs).map((p) => p.ms / p.predMs), 50);
}

function stepTraces(s, points) {
  const on = points.filter((p) => p.kv), off = points.filter((p) => !p.kv);
  // steps that read different copies of the weights (the `weights` setting): dots and a median each
  const data = pointFormats(on).length > 1 ? formatTraces(s, on, jitter, stepHover, medians) : [
    Object.assign({type: "scattergl", mode: "markers", name: "KV cache on", x: on.map(jitter), y: on.map((p) => p.ms),
                   marker: {color: alpha(P.decode, 0.45), size: 5}}, stepHover(on)),
    Object.assign({type: "scatter", mode: "lines+markers", name: "median", line: {color: P.decode, width: 3},
                   hovertemplate: "batch %{x}: median %{y:.1f} ms<extra></extra>"}, medians(on)),
  ];
  const pred = predictedMedians(on);
  if (pred.x.length) {
    data.push(Object.assign({type: "scatter", mode: "lines", name: "roofline (estimate)", line: {color: P.text2, width: 1.5, dash: "dot"},
                             hovertemplate: "batch %{x}: roofline estimate %{y:.1f} ms<extra></extra>"}, pred));
  }
  if (off.length) {
    data.push({type: "scattergl", mode: "markers", name: "KV cache off", x: off.map(jitter), y: off.map((p) => p.ms),
               marker: {color: alpha(P.bad, 0.5), size: 5}, hoverinfo: "skip"});
    data.push(Object.assign({type: "scatter", mode: "lines", name: "median (off)", line: {color: P.bad, width: 3}}, medians(off)));
  }
  return data;
}

const TRANSFER_ONLY = new Set(["transfer"]);   // a colocated run's chart as it always was
function drawStages(div, s) {
  const done = [];
  for (let i = s.order.length - 1; i >= 0 && done.length < SHOW_FINISHED; i--) {
    const r = s.reqs.get(s.order[i]);
    if (r.stages) done.push(r);
  }
  done.reverse();
  const y = done.map((r) => r.id);
  const data = stagesOf(done, TRANSFER_ONLY).map(([k, name]) => ({type: "bar", orientation: "h", name, y, x: done.map((r) => (r.stages[k] || 0) * 1000),
    marker: {color: stageColor(k)}, hovertemplate: `%{y} ${name}: %{x:.1f} ms<extra></extra>`}));
  // Rows named as the timeline names them: a classroom student's name, else the request id.
  // (a student who asked twice: both rows, told apart by request id).
  const count = new Map();
  for (const r of done) if (r.label) count.set(r.label, (count.get(r.label) || 0) + 1);
  // The names' margin is ours, not plotly's automargin: that lays the chart out a second time,
  // later, and with a class's long names in a narrow panel (presenter mode at 1024x768) it left
  // the plot no width, its labels at -Infinity (Chromium logs it). A name that would take more
  // than 45% of the width is shown as its request id (unique, as every row must be).
  const room = Math.floor((0.45 * div.clientWidth - 10) / NAME_CHAR_PX);
  const names = done.map((r) => {
    const name = !r.label ? r.id : count.get(r.label) > 1 ? `${r.label} · ${r.id}` : r.label;
    return name.length <= room ? name : r.id;
  });
  for (const d of data) d.y = names;
  const left = 14 + NAME_CHAR_PX * Math.max(4, ...names.map((n) => n.length));
  // a row for every name (plotly drops category labels that do not fit): the chart grows with them
  const tall = done.length * ROW_PX + 60;
  div.style.minHeight = `${tall}px`;
  react(div, data, Object.assign({}, PLOT_LAYOUT, {
    barmode: "stack", showlegend: false, margin: {l: left, r: 10, t: 4, b: 42}, ...sized(div, Math.max(tall, div.clientHeight)),
    xaxis: Object.assign({title: {text: "ms", standoff: 6}, automargin: false, gridcolor: P.grid, zeroline: false},
                         done.length ? {} : {range: [0, 100]}),   // empty: a positive axis, not plotly's -1…6
    yaxis: {type: "category", dtick: 1, automargin: false, tickfont: {family: "ui-monospace, monospace", size: 13}},
  }));
}

// The largest batch size drawn: the slots, or more where a step held more (a setting changed).
const mostBatch = (s, points) => points.reduce((m, p) => Math.max(m, p.batch), s.settings.slots || 4);

// One tick per batch size while they fit in the chart's width (about 40 px a label).
function batchTick(s, points, div) {
  const most = mostBatch(s, points);
  const fit = Math.max(2, Math.floor((div.clientWidth - 70) / 40));
  return [1, 2, 4, 8, 16, 32].find((d) => most / d <= fit) || 64;
}

// The steps chart's frame: its legend in rows above the plot, the top margin sized for as many
// rows as a narrow box wraps it into (plotly otherwise grows the margin itself, past the box:
// a 277x208 box in presenter mode left the plot no height, and its tick labels were placed at
// y = -Infinity, which Chromium logs). When the box cannot hold the legend and a plot of 60 px,
// the legend goes (the heading names the chart). At most one y tick per ~26 px of the plot. The
// left margin holds the y title and the widest tick label up to `top` (ms): its 52 px fit three
// digits; a busy machine's 1,000 ms step has four, and ran into the title.
const LEGEND_ITEM_PX = (name) => 40 + CHAR_PX * name.length;   // a 13 px legend item: its symbol, text and gap
function stepsFrame(div, traces, top) {
  const names = traces.filter((t) => t.showlegend !== false && t.name).map((t) => t.name);
  const need = names.reduce((a, n) => a + LEGEND_ITEM_PX(n), 0);
  const rows = Math.max(1, Math.ceil(need / Math.max(1, div.clientWidth - 20)));
  const l = STEPS_MARGIN.l + CHAR_PX * Math.max(0, String(Math.floor(top)).length - 3);
  let margin = {...STEPS_MARGIN, l, t: Math.max(STEPS_MARGIN.t, 8 + 22 * rows)}, showlegend = true;
  if (div.clientHeight - margin.t - margin.b < 60) { margin = {...STEPS_MARGIN, l}; showlegend = false; }
  const plotH = div.clientHeight - margin.t - margin.b;
  return {margin, showlegend, legend: LEGEND_ABOVE, nticks: Math.max(2, Math.floor((plotH - 10) / 26))};
}

// With the KV cache off, what grows is the sequence each step recomputes, not the batch: the
// chart then plots step time against sequence length (the cache-on steps of the same run too).
function byLength(div, s) {
  const off = s.points.filter((p) => !p.kv), since = off.length ? off[0].t : 0;
  const on = s.points.filter((p) => p.kv && p.t >= since);
  $("steps-title").textContent = "Decode step time vs sequence length";
  $("step-info").textContent = `(${off.length} steps with the KV cache off, ${on.length} on; measured)`;
  const dots = (pts, name, color) => ({type: "scattergl", mode: "markers", name, x: pts.map((p) => p.len),
    y: pts.map((p) => p.ms), marker: {color: alpha(color, 0.6), size: 5}, hoverinfo: "skip"});
  const traces = [dots(off, "KV cache off", P.bad), dots(on, "KV cache on", P.decode)], both = [...off, ...on];
  const {nticks, ...frame} = stepsFrame(div, traces, 1.1 * Math.max(0, ...both.map((p) => p.ms)));   // plotly's autorange pads the top
  // From a little left of zero: at zero the x axis's "0" ran into the y axis's "0" at the corner.
  const right = 1.05 * Math.max(1, ...both.map((p) => p.len));
  react(div, traces, Object.assign({}, PLOT_LAYOUT, sized(div), frame, {
    xaxis: {title: {text: "tokens per sequence", standoff: 6}, automargin: false, range: [-0.05 * right, right], gridcolor: P.grid, zeroline: false},
    yaxis: {title: {text: "ms per step"}, rangemode: "tozero", gridcolor: P.grid, nticks},
  }));
}

function drawSteps(div, s) {
  if (s.settings.kv_cache === false || s.points.some((p) => !p.kv)) { byLength(div, s); return; }
  $("steps-title").textContent = "Decode step time vs batch size";
  const k = rooflineRatio(s.points.filter((p) => p.kv));
  $("step-info").textContent = `(${s.points.length} measured decode-only steps; mixed steps left out)` +
    (k !== null && k > 2 ? ` · measured ${k.toFixed(1)}× the roofline: overhead the roofline does not model` : "");
  // The estimated floor (weight bytes ÷ measured bandwidth) of the copy of the weights the steps
  // read, each copy's when they read both (ft-weights.js), inside the scale: plotly's autorange ignores shapes.
  // Two floors' long labels (one at each end, "est. floor, fp32: 538 MB") need ~420 px side by
  // side: narrower (presenter mode's panel at 1280x800), they printed over each other; the short ones.
  const fmts = pointFormats(s.points.filter((p) => p.kv));
  const floors = floorMarks(s, fmts, div.clientWidth < (fmts.length > 1 ? 560 : 340));
  const top = Math.max(floors.top, ...s.points.map((p) => p.ms)) * 1.18 || 10;
  const traces = stepTraces(s, s.points), {nticks, ...frame} = stepsFrame(div, traces, top);
  react(div, traces, Object.assign({}, PLOT_LAYOUT, sized(div), {shapes: floors.shapes, annotations: floors.annotations}, frame, {
    xaxis: Object.assign({title: {text: "requests in the batch", standoff: 6}, automargin: false, gridcolor: P.grid, zeroline: false},
                         // a fixed range that always holds a tick: with every point at one batch size,
                         // plotly's own range (their jitter, ±0.15) held none, and with no tick label
                         // to stand off from, the axis title's y was -Infinity (Chromium logged it)
                         {range: [0.5, mostBatch(s, s.points) + 0.5], dtick: batchTick(s, s.points, div)}),
    yaxis: {title: {text: "ms per step"}, range: [0, top], gridcolor: P.grid, nticks},
  }));
}

// Redrawn when the state moved or a chart's box changed size (the window, presenter mode, a
// panel that grew): the plot is sized to the box, and the ticks that fit (batchTick) depend
// on its width. `s`: the page state.
export function update(s) {
  if (!window.Plotly) return;
  const stagesDiv = $("chart-stages"), stepsDiv = $("chart-steps");
  const box = (d) => (d ? `${d.clientWidth}x${d.clientHeight}` : "");
  const size = `${box(stagesDiv)} ${box(stepsDiv)} ${getComputedStyle(document.body).zoom}`;
  if (s.version === version && size === drawnSize) return;
  version = s.version; drawnSize = size;
  // A box too small for a chart's margins and labels (a panel mid-way through presenter mode's
  // resize) gives plotly a plot of zero or negative size, whose labels land at -Infinity: skip
  // it; the box's next size draws it.
  const roomy = (d) => d && d.offsetParent !== null && d.clientWidth >= MIN_CHART_W;
  if (roomy(stagesDiv)) drawStages(stagesDiv, s);
  if (roomy(stepsDiv) && stepsDiv.clientHeight > STEPS_MARGIN.t + STEPS_MARGIN.b + 20) drawSteps(stepsDiv, s);
}

