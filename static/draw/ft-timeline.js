// First Token: the timeline drawn on <canvas>, and the time axis it shares with the strips
// under it (ft-strips.js: KV cache, queue). They share one `view` (visible span and right
// edge, live or paused) so the three line up: a request queueing in the timeline sits over
// the queue rising below it, and over the KV cache that was full at that moment. The
// features (delivery, speculation, the observed server, the SLO marks) draw on the timeline
// through layers the page's composition root adds (createTimeline): this module imports none
// of them.
import {diagonalStripes, fitCanvas} from "ft/canvas";
import {palette as P, alpha} from "ft/palette";
import {INSTANCES, instanceOf} from "ft/state";

// Canvas colours: the palette from ft.css, some made translucent.
const C = {
  bg: P.panel2, grid: P.grid, muted: P.muted, api: P.api,
  tokenize: P.tokenize, queue: P.queue,
  prefill: P.prefill, prefillWait: alpha(P.prefill, 0.28), firstSample: P.first,
  decodeA: P.decode, decodeB: P.decodeAlt, decodeIdle: alpha(P.decode, 0.16),
  tick: P.tick, rejected: P.bad, select: alpha(P.overlay, 0.10), now: P.accent,
  bandDecode: alpha(P.overlay, 0.035), bandPrefill: alpha(P.prefill, 0.10), bandMixed: alpha(P.prefill, 0.05),
  preempt: P.bad, inst: {prefill: P.instPrefill, decode: P.instDecode},
};
// Disaggregated (hello.instances): a lane of forwards per instance, named in the gutter.
const INSTANCE_LANE = {prefill: "prefill instance", decode: "decode instance"};

// A prompt recomputed after a preemption: prefill colour with dark diagonal stripes
// (ft.css draws the legend swatch the same way).
const recomputeFill = (ctx) => diagonalStripes(ctx, 6, C.bg, 1.5, C.prefill);

function niceStep(span, px, minPx) {
  const steps = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300];
  for (const s of steps) if ((s / span) * px >= minPx) return s;
  return steps[steps.length - 1];
}

// Geometry shared by the strips: left gutter for labels, plot width, x(t).
// The gutter is the timeline's (view.gutter: wide enough for its row names, set as it draws),
// so the strips under it keep the same time axis.
export function frame(w, view, compact) {
  const gutter = view.gutter || (compact ? 46 : 78);
  const pw = Math.max(10, w - gutter - 10);
  const left = view.right - view.span;
  return {gutter, pw, left, right: view.right, origin: view.origin || 0,
          x: (t) => gutter + ((t - left) / view.span) * pw,
          t: (x) => left + ((x - gutter) / pw) * view.span};
}

export function timeAxis(ctx, f, top, bottom, font, labels) {
  const step = niceStep(f.right - f.left, f.pw, 90);
  ctx.strokeStyle = C.grid; ctx.lineWidth = 1;
  ctx.fillStyle = C.muted; ctx.font = font; ctx.textAlign = "center"; ctx.textBaseline = "top";
  // Ticks at round times from the page's start (f.origin), not from the server's.
  for (let u = Math.ceil((f.left - f.origin) / step) * step; u + f.origin <= f.right; u += step) {
    const x = Math.round(f.x(u + f.origin)) + 0.5;
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
    if (labels) ctx.fillText(`${+u.toFixed(2)} s`, x, bottom + 3);
  }
}

// First index whose `key` is >= t (the list is in time order).
export function firstFrom(list, t, key) {
  let lo = 0, hi = list.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (list[mid][key] < t) lo = mid + 1; else hi = mid; }
  return lo;
}

export function rect(ctx, f, a, b, y, h) {
  const x0 = Math.max(f.gutter, f.x(a)), x1 = Math.min(f.gutter + f.pw, f.x(b));
  if (x1 > x0) ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
}

// A step line through time-ordered points {t, …} (each value holds until the next), on to xEnd.
export function stepPath(ctx, f, pts, yOf, xEnd) {
  let prev = null;
  for (const p of pts) {
    const x = Math.max(f.gutter, Math.min(f.gutter + f.pw, f.x(p.t))), y = yOf(p);
    if (prev === null) ctx.moveTo(x, y); else { ctx.lineTo(x, prev); ctx.lineTo(x, y); }
    prev = y;
  }
  if (prev !== null) ctx.lineTo(xEnd, prev);
}

// ------------------------------------------------------------------ timeline
// A row is never thinner than MIN_ROW CSS px, so its label stays at least 13 px (18 on screen
// in presenter mode's 1.4 zoom); the strip asks the page for the height its rows need, up to
// MAX_ROWS of them, and shows the newest rows that fit beyond that.
const MIN_ROW = 16, MAX_ROWS = 48;

// Rows: requests alive somewhere in the window, oldest on top. A classroom student's requests
// share one row under their name (a student has one request in flight at a time), so thirty
// students are thirty named rows however many questions they ask.
function layoutRows(s, f, now, top, plotH, compact) {
  const lanes = [], laneOf = new Map();
  for (const id of s.order) {
    const r = s.reqs.get(id);
    const end = r.end === null ? now : r.end;
    if (r.arrival > f.right || end < f.left) continue;
    const key = r.source === "join" && r.label ? `join:${r.label}` : id;
    let lane = laneOf.get(key);
    if (!lane) {
      lane = {label: r.label || r.id, source: r.source, reqs: []};
      laneOf.set(key, lane); lanes.push(lane);
    }
    lane.reqs.push(r);
  }
  const fit = Math.max(1, Math.floor(plotH / MIN_ROW));
  // more than fit: the top row's place says how many older rows are left out (it was written
  // over the first row's bar)
  const shown = lanes.length > fit ? lanes.slice(lanes.length - Math.max(1, fit - 1)) : lanes;
  const note = shown.length < lanes.length ? 1 : 0;
  const rowH = shown.length ? Math.min(compact ? 20 : 30, plotH / (shown.length + note)) : 0;
  const rowOf = new Map(), reqs = [];
  shown.forEach((lane, i) => { for (const r of lane.reqs) { rowOf.set(r.id, i); reqs.push(r); } });
  const barH = rowH * 0.72, rows = top + note * rowH;
  return {hidden: lanes.length - shown.length, lanes: shown, wanted: Math.min(MAX_ROWS, lanes.length),
          reqs, rowH, rowOf, barH, top: rows, noteTop: top, plotH: plotH - note * rowH,
          barY: (r) => rows + rowOf.get(r.id) * rowH + (rowH - barH) / 2};
}

// Background bands: one per model forward, so a batch reads as a column shared by its rows;
// a prefill (blue) visibly stalls everybody's decoding, a mixed step is half as blue.
// Disaggregated, the prefill instance's forwards stall nobody's decoding: no band for them.
function drawBands(ctx, f, steps, i0, g) {
  for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
    const st = steps[i];
    if (st.kind === "release" || (st.kind === "decode" && st.n % 2) || st.instance === "prefill") continue;
    ctx.fillStyle = st.kind === "prefill" ? C.bandPrefill : st.kind === "mixed" ? C.bandMixed : C.bandDecode;
    rect(ctx, f, st.start, st.end, g.top, g.plotH);
  }
}

// One column per forward across the top: its prompt tokens (prefill colour, above) and decode
// tokens (decode colour, below) in proportion, so a mixed step shows how its budget was split
// (a layer at "lane" may draw over its foot: speculation's guessed positions).
// Disaggregated (`byInstance`: {prefill, decode} lanes), each instance's forwards in its own lane.
function drawStepLane(ctx, f, steps, i0, one, byInstance) {
  for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
    const st = steps[i];
    if (st.kind === "release" || !st.tokens) continue;
    const lane = byInstance ? byInstance[instanceOf(st)] : one;
    const ph = (lane.h * st.prefillTokens) / st.tokens;
    ctx.fillStyle = C.prefill;
    rect(ctx, f, st.start, st.end, lane.y, ph);
    ctx.fillStyle = st.n % 2 ? C.decodeB : C.decodeA;
    rect(ctx, f, st.start, st.end, lane.y + ph, lane.h - ph);
  }
}

// The lane's name in the gutter: "forwards", or what a layer says instead (its laneLabel).
// Disaggregated: each lane's instance colour beside its name (the colour its requests' rows carry).
function drawLaneLabel(ctx, f, lane, text, instance) {
  ctx.fillStyle = C.muted; ctx.font = "11px system-ui, sans-serif";
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  ctx.fillText(text, f.gutter - (instance ? 9 : 6), lane.y + lane.h / 2);
  if (instance) { ctx.fillStyle = C.inst[instance]; ctx.fillRect(f.gutter - 6, lane.y, 3, lane.h); }
}

// Stage segments, one colour per pass (fewer canvas state changes), later passes on top.
// `queue`, when given, draws the rows' wait before their prefill instead of the queue stage.
function drawStages(ctx, f, g, now, queue) {
  const endOr = (t, r) => (t !== null ? t : (r.end !== null ? r.end : now));
  const span = (a, b, y) => rect(ctx, f, a, b, y, g.barH);
  const pass = (fill, each) => { ctx.fillStyle = fill; for (const r of g.reqs) each(r, g.barY(r)); };
  pass(C.tokenize, (r, y) => { if (r.tokStart !== null) span(r.tokStart, r.tokEnd, y); });
  if (queue) queue();
  else pass(C.queue, (r, y) => {
    if (!r.rejected) span(r.tokEnd !== null ? r.tokEnd : r.arrival, endOr(r.prefills.length ? r.prefills[0].start : null, r), y);
  });
  pass(C.prefillWait, (r, y) => { if (r.prefills.length) span(r.prefills[0].start, endOr(r.first, r), y); });
  pass(C.decodeIdle, (r, y) => { if (r.first !== null) span(r.first, endOr(null, r), y); });
  // Preempted: waiting in the queue again until readmitted, then its tokens are recomputed.
  pass(C.queue, (r, y) => { for (const p of r.preempts) span(p.t, endOr(p.until, r), y); });
  pass(C.prefill, (r, y) => { for (const p of r.prefills) if (!p.recompute) span(p.start, p.end, y); });
  pass(recomputeFill(ctx), (r, y) => { for (const p of r.prefills) if (p.recompute) span(p.start, p.end, y); });
  // Admissions (got a slot and KV blocks): the queue stage goes on until its prefill starts.
  pass(C.tick, (r, y) => {
    for (const a of r.admits) if (a.t >= f.left && a.t <= f.right) ctx.fillRect(f.x(a.t) - 0.5, y, 1, g.barH);
  });
}

// Each forward's decode rows (every row of a decode step; the decoding ones of a mixed step)
// on the row of each request, alternating two shades.
function drawDecodeSteps(ctx, f, steps, i0, g) {
  for (const [color, parity] of [[C.decodeA, 0], [C.decodeB, 1]]) {
    ctx.fillStyle = color;
    for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
      const st = steps[i];
      if (st.n % 2 !== parity) continue;
      for (const id of st.decodeIds) {
        if (g.rowOf.has(id)) rect(ctx, f, st.start, st.end, g.barY({id}), g.barH);
      }
    }
  }
}

// Rejections, a tick per token (the first taller, in the first-sample colour; an accepted guess is
// its forward's cell instead, drawn by speculation's layer), preemptions.
function drawOutcomes(ctx, f, g, view) {
  const {reqs, barY, barH, rowH, rowOf, top} = g;
  const inView = (t) => t >= f.left && t <= f.right;
  const rowTop = (r) => top + rowOf.get(r.id) * rowH;
  ctx.fillStyle = C.rejected;
  for (const r of reqs) if (r.rejected) rect(ctx, f, r.arrival, Math.max(r.end, r.arrival + view.span / 200), barY(r), barH);
  const tickW = 2;
  ctx.fillStyle = C.tick;
  for (const r of reqs) {
    const y = barY(r);
    for (let k = 1; k < r.tokens.length; k++) {
      if (inView(r.tokens[k]) && r.tokenSpec[k] !== "accepted") ctx.fillRect(f.x(r.tokens[k]) - tickW / 2, y, tickW, barH);
    }
  }
  ctx.fillStyle = C.firstSample;
  for (const r of reqs) if (r.first !== null && inView(r.first)) ctx.fillRect(f.x(r.first) - tickW, rowTop(r), tickW * 2, rowH);
  for (const r of reqs) for (const p of r.preempts) if (inView(p.t)) preemptMark(ctx, f.x(p.t), rowTop(r), rowH);
}

// A preemption: a line through the row under a flag pointing down (not a bar like the first
// token's), outlined in the background colour so it stands out on the queue colour after it.
function preemptMark(ctx, x, y, h) {
  const w = Math.max(5, Math.min(10, h * 0.6));
  ctx.beginPath();
  ctx.moveTo(x - w / 2, y); ctx.lineTo(x + w / 2, y); ctx.lineTo(x + 1, y + w * 0.8);
  ctx.lineTo(x + 1, y + h); ctx.lineTo(x - 1, y + h); ctx.lineTo(x - 1, y + w * 0.8); ctx.closePath();
  ctx.strokeStyle = C.bg; ctx.lineWidth = 1.5; ctx.stroke();
  ctx.fillStyle = C.preempt; ctx.fill();
}

// `text` cut to `width` pixels with an ellipsis (a classroom student's name in the gutter),
// remembered: the labels are drawn every frame and measuring them again each time is waste.
const fitted = new Map();
export function fitText(ctx, text, width) {
  const key = `${ctx.font}|${width}|${text}`;
  let out = fitted.get(key);
  if (out === undefined) {
    out = text;
    if (ctx.measureText(text).width > width) {
      let n = text.length;
      while (n > 1 && ctx.measureText(text.slice(0, n) + "…").width > width) n--;
      out = text.slice(0, n) + "…";
    }
    if (fitted.size >= 2000) fitted.clear();   // bounded: fonts, widths and names come and go
    fitted.set(key, out);
  }
  return out;
}

// Every row's label (its request, or its student), the "now" line, and how many rows did not
// fit. Returns what it wrote, for the page's layout checks.
function drawLabels(ctx, f, g, compact, view, now) {
  const {lanes, rowH, top, plotH} = g;
  const px = Math.max(0, Math.min(compact ? 13 : 15, Math.floor(rowH - 3)));
  ctx.font = `${px}px ui-monospace, monospace`;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  const labels = lanes.map((lane, i) => {
    ctx.fillStyle = lane.source === "page" ? C.now : lane.source === "api" ? C.api : lane.source === "join" ? C.firstSample : C.muted;
    const text = fitText(ctx, lane.label, f.gutter - 8), y = top + i * rowH + rowH / 2;
    ctx.fillText(text, f.gutter - 6, y);
    return {text, full: lane.label, px, top: y - px / 2, bottom: y + px / 2};
  });
  if (!view.paused) {
    ctx.strokeStyle = C.now; ctx.lineWidth = 1.5;
    const x = Math.round(f.x(now)) + 0.5;
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + plotH); ctx.stroke();
  }
  if (g.hidden > 0) {
    ctx.fillStyle = C.muted; ctx.textAlign = "left"; ctx.textBaseline = "top";
    ctx.font = "12px system-ui, sans-serif";
    ctx.fillText(`+${g.hidden} older row${g.hidden === 1 ? "" : "s"}`, f.gutter + 4, g.noteTop + 2);
  }
  return labels;
}

// Room for the longest row name in view (a classroom student's), within a quarter of the width.
function gutterFor(ctx, s, view, w, compact) {
  let base = compact ? 46 : 78;
  const left = view.right - view.span;
  if (s.instances && !compact) {   // the lanes' names: "prefill instance"
    ctx.font = "11px system-ui, sans-serif";
    base = Math.max(base, Math.ceil(ctx.measureText(INSTANCE_LANE.prefill).width) + 14);
  }
  ctx.font = `${compact ? 13 : 15}px ui-monospace, monospace`;
  let widest = 0;
  for (const id of s.order) {
    const r = s.reqs.get(id);
    if (r.label && (r.end === null || r.end >= left)) widest = Math.max(widest, ctx.measureText(r.label).width);
  }
  return Math.round(Math.max(base, Math.min(w / 4, widest + 14)));
}

// ------------------------------------------------------------------ layers
// When a layer draws, in drawing order: over the forwards' background bands ("behind"), over
// the lane of forwards ("lane"), instead of the rows' queue stage ("queue"), over the rows'
// stages ("stages"), over their decode steps ("steps"), and over the tokens and preemptions
// ("marks"), all under the row labels.
const STAGES = ["behind", "lane", "queue", "stages", "steps", "marks"];

// A timeline with its layers. A layer is {name, at, draw(scene)}: `at` one of STAGES; `draw`
// gets the scene {ctx, f, s, g, lane, i0, now, compact, out}, where `out` holds what the layers
// before it returned, by name, and what it returns is the drawn layout's field `name` (hover
// read-outs and tests read it). Optional: `on(s)`, whether it draws for this state (default:
// always), and `laneLabel(result)`, the lane's label in place of "forwards" (falsy: no change).
// Layers at one stage draw in the order they were added.
export function createTimeline() {
  const layers = [];
  return {
    addLayer(layer) {
      if (!STAGES.includes(layer.at)) throw new Error(`timeline layer ${layer.name}: no stage "${layer.at}"`);
      layers.push(layer);
    },
    draw: (canvas, s, view, now, opts) => drawTimeline(canvas, s, view, now, layers.filter((l) => !l.on || l.on(s)), opts),
  };
}

function drawTimeline(canvas, s, view, now, layers, opts) {
  const {ctx, w, h} = fitCanvas(canvas);
  const compact = w < 700;
  view.gutter = gutterFor(ctx, s, view, w, compact);
  const f = frame(w, view, compact);
  const axisH = compact ? 16 : 24;
  const laneH = compact ? 6 : 10;
  // Disaggregated: the prefill instance's lane over the decode instance's (`lane`, where the
  // features draw on the forwards that make tokens).
  const byInstance = s.instances ? {prefill: {y: 3, h: laneH, instance: "prefill"}, decode: {y: 3 + laneH + 3, h: laneH, instance: "decode"}} : null;
  const lane = byInstance ? byInstance.decode : {y: 3, h: laneH};
  const top = lane.y + lane.h + 3, plotH = h - axisH - top;
  ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
  const g = layoutRows(s, f, now, top, plotH, compact);
  // The height these rows need (the strip's CSS min-height reads it): set only when it changes.
  const want = `${Math.ceil(g.wanted * MIN_ROW + top + axisH) + 3}px`;   // + the strip's border
  if (opts.grow !== false && canvas.parentElement.style.getPropertyValue("--tl-rows-h") !== want) {
    canvas.parentElement.style.setProperty("--tl-rows-h", want);
  }
  const i0 = firstFrom(s.steps, f.left, "end");
  const out = {}, scene = {ctx, f, s, g, lane, byInstance, i0, now, compact, out};
  const layersAt = (at) => { for (const l of layers) if (l.at === at) out[l.name] = l.draw(scene); };
  drawBands(ctx, f, s.steps, i0, g);
  layersAt("behind");
  drawStepLane(ctx, f, s.steps, i0, lane, byInstance);
  layersAt("lane");
  const label = layers.map((l) => l.laneLabel && l.laneLabel(out[l.name])).find(Boolean);
  if (!compact && byInstance) for (const k of INSTANCES) drawLaneLabel(ctx, f, byInstance[k], (k === "decode" && label) || INSTANCE_LANE[k], k);
  else if (!compact) drawLaneLabel(ctx, f, lane, label || "forwards");
  timeAxis(ctx, f, top, top + plotH, `${compact ? 10 : 13}px system-ui, sans-serif`, true);
  if (opts.selected && g.rowOf.has(opts.selected)) {
    ctx.fillStyle = C.select;
    ctx.fillRect(0, g.top + g.rowOf.get(opts.selected) * g.rowH, w, g.rowH);
  }
  drawStages(ctx, f, g, now, layers.some((l) => l.at === "queue") ? () => layersAt("queue") : null);
  layersAt("stages");
  drawDecodeSteps(ctx, f, s.steps, i0, g);
  layersAt("steps");
  drawOutcomes(ctx, f, g, view);
  layersAt("marks");
  const labels = drawLabels(ctx, f, g, compact, view, now);
  // the left-out rows' count, in the top row's place (the layout tests read it)
  const older = g.hidden ? {hidden: g.hidden, top: g.noteTop, rowsTop: g.top} : null;
  return {f, lanes: g.lanes, rowH: g.rowH, top: g.top, i0, labels, older, hidden: g.hidden, h, stepLanes: byInstance, ...out};
}

// The request under (x, y): the row's, the one whose time span holds the pointer's time
// (a student's row holds several), else the row's last before it.
export function hitTimeline(layout, s, x, y) {
  const lane = layout.lanes[Math.floor((y - layout.top) / layout.rowH)];
  if (!lane) return null;
  const t = layout.f.t(x);
  let r = lane.reqs[0];
  for (const q of lane.reqs) if (q.arrival <= t) r = q;
  let step = null;
  for (let k = layout.i0; k < s.steps.length && s.steps[k].start <= t; k++) {
    const st = s.steps[k];
    if (st.kind !== "release" && st.start <= t && t <= st.end && st.ids.includes(r.id)) step = st;
  }
  return {req: r, t, step};
}

// The forward under x in the lane across the timeline's top (y above the rows), or null;
// disaggregated, in the lane of the instance under y.
export function hitStep(layout, s, x, y) {
  if (y >= layout.top || y < 0) return null;
  const t = layout.f.t(x), two = layout.stepLanes;
  const inst = two ? (y < two.decode.y - 1 ? "prefill" : "decode") : null;
  for (let k = layout.i0; k < s.steps.length && s.steps[k].start <= t; k++) {
    const st = s.steps[k];
    if (st.kind !== "release" && st.start <= t && t <= st.end && (!inst || instanceOf(st) === inst)) return st;
  }
  return null;
}
