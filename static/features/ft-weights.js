// First Token: the weights as a live lesson (issue 31). The engine reads the model as its file
// stores it, 4-bit blocks (`stored`, through a fused kernel); the fp32 matrices they mean
// (`dequantised`) are made from the blocks only when the `weights` setting asks (the time it took
// is measured: settings.fp32_made_s), freed when it is switched back (issue 41). The
// `activations` setting gives the 4-bit layers a second arithmetic, int8 (its own lesson, with
// its measured agreement: settings.int8_agreement). The header also shows the server's resident
// memory, measured (stats.rss_bytes). This module
// names them from `hello.weights` (never hard-coded figures): the header's format and bytes per
// decode step, the control's choices, each format's bandwidth floor (an ESTIMATE: bytes ÷ the
// bandwidth measured at start), a forward's hover line, the step-time chart split by format, and
// the `weights` preset's live figure: the median decode step MEASURED under each format from the
// `step` events (each says the format it read, step.weights).
import {alpha, palette as P} from "ft/palette";
import {percentile} from "ft/state";
import * as teach from "ft/teach";
import {$, fmtBytes, fmtS} from "ft/util";

// Megabytes as the lesson says them ("97 MB", "538 MB"); small models' bytes as fmtBytes does.
export const mb = (b) => (b >= 10e6 ? `${Math.round(b / 1e6)} MB` : fmtBytes(b));

// The formats this server has (`hello.weights.formats`), or null (observe mode, traces before 12).
export const formats = (st) => (st && st.hello && st.hello.weights ? st.hello.weights.formats : null);

// The format the engine reads now: the setting, or the only copy there is.
export function inForce(st) {
  const f = formats(st);
  if (!f) return null;
  const v = st.settings && st.settings.weights;
  return v && f[v] ? v : Object.keys(f)[0] || null;
}

// The file's float types as the page names them.
const FLOATS = {F32: "fp32", F16: "fp16", BF16: "bf16"};

// "4-bit" for Q4_1 (the layers; the head's Q8_0 rides along), for a Q4_K_M file's Q4_K, Q5_0, Q6_K
// and Q8_0 too (its fewest bits), "8-bit" for Q8_0 only, "fp16"/"bf16" for float blocks kept as
// stored, "fp32"/"bf16" for the dequantised copy in the model's dtype.
function bits(st, fmt) {
  const f = formats(st), blocks = (f && f[fmt] && f[fmt].blocks) || [];
  if (fmt === "dequantised" || !blocks.length || blocks.every((b) => b === "F32")) {
    const dt = st.hello && st.hello.dtype;
    return {float32: "fp32", bfloat16: "bf16", float16: "fp16"}[dt] || dt || "fp32";
  }
  if (blocks.every((b) => FLOATS[b])) return blocks.map((b) => FLOATS[b]).join("/");
  const q = blocks.map((b) => parseInt(b.replace(/^Q/, ""), 10)).filter((n) => n > 0);
  return q.length ? `${Math.min(...q)}-bit` : "blocks";
}

// How a format is named: "4-bit as stored" / "fp32 dequantised" (long), "4-bit" / "fp32" (short).
export function name(st, fmt, kind = "long") {
  if (!fmt) return "";
  const b = bits(st, fmt);
  if (kind === "short") return b;
  return fmt === "stored" ? `${b} as stored` : fmt === "dequantised" ? `${b} dequantised` : fmt;
}

// The control's choice: "as stored (4-bit, 97 MB)" / "dequantised (fp32, 538 MB)", on two lines
// (the parenthesis under the name: the controls panel is narrow; ft.css keeps the line break).
export function choiceText(st, fmt) {
  const f = formats(st);
  if (!f || !f[fmt]) return fmt;
  return `${fmt === "stored" ? "as stored" : fmt}\n(${bits(st, fmt)}, ${mb(f[fmt].decode_bytes)})`;
}

// A format's bytes per batch-1 decode step and its bandwidth floor (an estimate), with the
// measured bandwidth; the default format's from `hello.bandwidth` where hello has no `weights`.
export function floorOf(st, fmt = inForce(st)) {
  const h = st && st.hello, bw = h && h.bandwidth, f = formats(st);
  const gbs = bw && typeof bw.gbs === "number" ? bw.gbs : null;
  if (f && fmt && f[fmt]) return {fmt, bytes: f[fmt].decode_bytes, floorS: f[fmt].floor_s, gbs};
  if (bw && typeof bw.floor_s === "number") return {fmt: null, bytes: bw.weight_bytes ?? h.weight_bytes, floorS: bw.floor_s, gbs};
  return null;
}

// "estimated floor: 97 MB ÷ 24.9 GB/s" (short enough for a phone's chart; the header names the format).
export function floorLabel(fl) {
  return fl.gbs ? `estimated floor: ${mb(fl.bytes)} ÷ ${fl.gbs.toFixed(1)} GB/s` : "estimated floor (weights ÷ bandwidth)";
}

// The header: "weights: 4-bit as stored, 97 MB/step".
export function headerText(st) {
  const fmt = inForce(st), fl = floorOf(st, fmt);
  if (!fmt || !fl) return "";
  return `weights: ${name(st, fmt, "long")}, ${mb(fl.bytes)}/step`;
}

// A forward's hover line: the weights it read and what multiplied them (step.weights, .kernel).
export function stepLine(s, st) {
  if (!st.weights || typeof st.weightBytes !== "number") return null;
  return `weights read: ${mb(st.weightBytes)}, ${name(s, st.weights)} (${st.kernel})`;
}

// ---------------------------------------------------------------- the steps chart, by format

// The formats the decode points read, in the order first seen; [] when none says (before 12).
export const pointFormats = (pts) => [...new Set(pts.map((p) => p.weights).filter(Boolean))];
const COLORS = {stored: () => P.decode, dequantised: () => P.queue};
export const colorOf = (fmt) => (COLORS[fmt] || (() => P.decode))();

// Dashed floors for `fmts` (or the format in force), each labelled an estimate, for plotly. Two
// floors: each in its format's colour, labelled short (format and bytes), one at each end of its
// line so that the labels never sit on each other in a phone's chart.
// `narrow`: a chart too narrow for the figures (a phone's; a presenter's panel, whose type is
// larger) gets the short label; the chart's heading says the rest.
export function floorMarks(st, fmts, narrow = false) {
  const list = (fmts && fmts.length ? fmts : [inForce(st)]).map((f) => floorOf(st, f)).filter(Boolean);
  const shapes = [], annotations = [], two = list.length > 1;
  list.forEach((fl, i) => {
    const y = fl.floorS * 1000, c = two ? colorOf(fl.fmt) : P.accent;
    shapes.push({type: "line", xref: "paper", x0: 0, x1: 1, y0: y, y1: y, line: {color: c, width: 2, dash: "dash"}});
    annotations.push({xref: "paper", x: two && i ? 0.99 : 0.01, xanchor: two && i ? "right" : "left", y, yanchor: "bottom",
                      showarrow: false, font: {color: c, size: 13},
                      text: narrow ? (two ? `est. floor, ${name(st, fl.fmt, "short")}` : "estimated floor")
                        : two ? `est. floor, ${name(st, fl.fmt, "short")}: ${mb(fl.bytes)}` : floorLabel(fl)});
  });
  return {shapes, annotations, top: Math.max(0, ...list.map((fl) => fl.floorS * 1000))};
}

// ---------------------------------------------------------------- the lesson's live figure

// Decode steps of one request alone (batch 1) since t0, by the format each read: median ms, count.
export function stepsByFormat(st, t0) {
  const by = new Map();
  for (const x of st.steps) {
    if (x.kind !== "decode" || x.ids.length !== 1 || x.start < t0 || !x.weights) continue;
    if (!by.has(x.weights)) by.set(x.weights, []);
    by.get(x.weights).push((x.end - x.start) * 1000);
  }
  return new Map([...by].map(([fmt, ms]) => [fmt, {ms: percentile(ms, 50), n: ms.length}]));
}

// The `weights` preset's proof: each format's median decode step, measured, beside its floor
// (an estimate), and how much faster the 4-bit steps ran for how many fewer bytes.
export function lessonFigure(st, t0) {
  const f = formats(st);
  if (!f) return null;
  if (!f.stored) {
    const why = st.hello.weights.why;
    return `this server reads one copy of the weights only: ${name(st, "dequantised", "long")}` + (why ? ` (${why})` : "");
  }
  const by = stepsByFormat(st, t0), q = by.get("dequantised"), k = by.get("stored");
  if (!q && !k) return null;
  const part = (fmt, m) => `${name(st, fmt, "long")} ${m.ms.toFixed(1)} ms (median of ${m.n} step${m.n === 1 ? "" : "s"}; ` +
    `floor ${fmtS(f[fmt].floor_s)}, est.)`;
  if (!(q && k)) {
    const [fmt, m] = q ? ["dequantised", q] : ["stored", k];
    return `decode step at batch 1: ${part(fmt, m)} · waiting for steps reading ${name(st, fmt === "stored" ? "dequantised" : "stored", "long")}…`;
  }
  const r = q.ms / k.ms, bytes = f.dequantised.decode_bytes / f.stored.decode_bytes;
  return `decode step at batch 1: ${part("dequantised", q)} → ${part("stored", k)}: ` +
    `${r >= 1 ? `${r.toFixed(1)}× faster` : `${(1 / r).toFixed(1)}× slower`} for ${bytes.toFixed(1)}× fewer bytes` +
    madeNote(st);
}

// "; the fp32 copy was made from the blocks in 1.4 s" where the engine made it (measured).
function madeNote(st) {
  return typeof st.fp32MadeS === "number" ? `; the fp32 copy was made from the blocks for it in ${fmtS(st.fp32MadeS)}` : "";
}

// Whether a forward's 4-bit layers took int8 activations (step.kernel says so: engine/model/linears.py).
export const int8Step = (x) => typeof x.kernel === "string" && x.kernel.includes("int8");

// The `int8` preset's proof: the median decode step with fp32 and with int8 activations since t0
// (measured, from the steps), and int8's agreement with fp32 as the engine measured it.
export function int8Figure(st, t0) {
  const lim = st.limits && st.limits.activations;
  if (!lim || !(lim.choices || []).includes("int8")) return "this server offers fp32 activations only (no 4-bit Q4_1 blocks or kernel here)";
  const by = {fp32: [], int8: []};
  for (const x of st.steps) {
    if (x.kind !== "decode" || x.start < t0 || x.weights !== "stored") continue;
    by[int8Step(x) ? "int8" : "fp32"].push((x.end - x.start) * 1000);
  }
  const med = (v) => (v.length ? `${percentile(v, 50).toFixed(1)} ms (median of ${v.length})` : "—");
  const a = st.int8Agreement;
  const agree = a ? `int8 against fp32, teacher-forced over ${a.positions} positions: top-1 agreement ` +
    `${(100 * a.top1).toFixed(2)} %, largest logit difference ${a.max_logit_diff.toFixed(2)} (measured in ${fmtS(a.seconds)})`
    : "int8's agreement with fp32: measured when int8 is first chosen…";
  let speed = `decode step, fp32 activations ${med(by.fp32)} → int8 ${med(by.int8)}`;
  if (by.fp32.length && by.int8.length) {
    const r = percentile(by.fp32, 50) / percentile(by.int8, 50);
    speed += `: ${r >= 1 ? `${r.toFixed(2)}× faster` : `${(1 / r).toFixed(2)}× slower`}`;
  }
  return `${speed} · ${agree}`;
}
export const proof = {weights: lessonFigure, int8: int8Figure};

// "RSS 870 MB": the server process's resident memory from the latest `stats` (measured), or "".
export function rssText(s) {
  const b = s.last && s.last.rss_bytes;
  return typeof b === "number" ? ` · RSS ${Math.round(b / 1e6)} MB` : "";
}

// ---------------------------------------------------------------- the header, at 4 Hz

export function update(s) {
  const text = headerText(s), span = $("model-weights"), fig = $("h-weights-fig"), rss = $("model-rss");
  if (rss) {
    rss.textContent = rssText(s);
    rss.title = rss.textContent ? "the server process's resident memory now, measured (stats.rss_bytes): the weights' " +
      "blocks, the KV store, the fp32 copy while it is read, Python and torch" : "";
  }
  // presenter mode shows the headline figure during the weights lesson (in the schedule's place)
  document.body.classList.toggle("weights-lesson", !!(teach.active && teach.active.name === "weights"));
  if (span) {
    span.textContent = text || (s.hello && s.hello.dtype) || "";
    const fl = floorOf(s);
    span.title = text && fl ? `the copy of the weights each decode step reads now (the weights setting): ${fmtBytes(fl.bytes)}` +
      `, floor ${fmtS(fl.floorS)} at ${fl.gbs ? fl.gbs.toFixed(1) : "?"} GB/s (an estimate: bytes ÷ the bandwidth measured at start)` +
      (s.hello.weights.kernel ? `; the blocks' kernel: ${s.hello.weights.kernel}` : `; no kernel for the blocks here${s.hello.weights.why ? `: ${s.hello.weights.why}` : ""}`) : "";
  }
  if (fig) {
    fig.hidden = !text;
    const fmt = inForce(s), fl = floorOf(s);
    $("h-weights").textContent = text ? `${name(s, fmt, "short")} · ${mb(fl.bytes)}` : "—";
    fig.title = span ? span.title : "";
    fig.dataset.format = fmt || "";
  }
}

// Translucent dots and a median line per format, for the step-time chart (ft-charts.js).
export function formatTraces(s, pts, jitter, hover, medians) {
  const out = [];
  for (const fmt of pointFormats(pts)) {
    const mine = pts.filter((p) => p.weights === fmt), c = colorOf(fmt);
    out.push(Object.assign({type: "scattergl", mode: "markers", name: name(s, fmt, "short"), x: mine.map(jitter), y: mine.map((p) => p.ms),
                            marker: {color: alpha(c, 0.45), size: 5}, showlegend: false}, hover(mine)));
    out.push(Object.assign({type: "scatter", mode: "lines+markers", name: name(s, fmt, "short"), line: {color: c, width: 3},
                            hovertemplate: `batch %{x}: median %{y:.1f} ms (${name(s, fmt)}, its dots: each step)<extra></extra>`}, medians(mine)));
  }
  return out;
}
