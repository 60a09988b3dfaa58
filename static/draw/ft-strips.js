// First Token: the strips under the timeline, on its time axis (ft-timeline.js frame): the KV
// cache (filled entries per request, blocks in use, the budget and the capacity) and the queue
// (waiting and running requests over time).
import {fitCanvas} from "ft/canvas";
import {alpha, palette as P, reqColor} from "ft/palette";
import {running} from "ft/state";
import {firstFrom, frame, rect, stepPath, timeAxis} from "ft/timeline";
import {fmtTokens} from "ft/util";

// Canvas colours: the palette from ft.css, the queue's fill made translucent.
const C = {
  bg: P.panel2, muted: P.muted, queueFill: alpha(P.queue, 0.55),
  capacity: P.bad, budget: P.accent, inUse: P.text, running: P.decode,
};

// The strips under the timeline share its time axis, size and background.
function strip(canvas, view) {
  const {ctx, w, h} = fitCanvas(canvas);
  const compact = w < 700;
  const top = 6;
  ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
  return {ctx, compact, f: frame(w, view, compact), top, plotH: h - top - 4};
}

// A strip's scale labels: its maximum at the top, 0 at the bottom.
function scaleLabels(st, maxText) {
  const {ctx, f, top, plotH} = st;
  ctx.fillStyle = C.muted; ctx.font = `${st.compact ? 10 : 12}px system-ui, sans-serif`;
  ctx.textAlign = "right"; ctx.textBaseline = "top";
  ctx.fillText(maxText, f.gutter - 6, top);
  ctx.textBaseline = "bottom";
  ctx.fillText("0", f.gutter - 6, top + plotH);
}

// ------------------------------------------------------------------ KV cache
// The part of a time-ordered list a strip draws: from the item before the window (its state
// carries into view) to the last at or before its right edge, by `key`; [a, b).
function spanInView(list, f, key) {
  const a = Math.max(0, firstFrom(list, f.left, key) - 1);
  let b = a;
  while (b < list.length && list[b][key] <= f.right) b++;
  return {a, b};
}

// The forwards in view; until(i) is when step i's state gave way (next step, or now).
function stepsInView(steps, f, now) {
  const {a, b} = spanInView(steps, f, "end");
  return {a, b, until: (i) => (i + 1 < steps.length ? steps[i + 1].end : now)};
}

// Where a strip's lines end: now, or the window's right edge while paused.
const xNow = (f, view, now) => Math.min(f.gutter + f.pw, f.x(view.paused ? f.right : now));

const pointsInView = (list, f) => { const {a, b} = spanInView(list, f, "t"); return list.slice(a, b); };

// Scale to what is in view (a few requests hold little of a big cache); the budget and
// capacity lines are drawn when they fall inside the scale and named when above it.
function kvScale(s, steps, f, span, use, bs, capacity) {
  let peak = 0;
  for (let i = span.a; i < span.b; i++) peak = Math.max(peak, steps[i].cacheTokens);
  for (const p of use) peak = Math.max(peak, p.used * bs);
  let budget = s.last ? s.last.cache_blocks * bs : capacity;
  for (const st of s.stats) if (st.t >= f.left && st.t <= f.right) budget = Math.min(budget, st.blocks * bs);
  const want = Math.max(peak * 1.3, 64);
  return {budget, ymax: budget <= want * 2 ? Math.max(want, budget * 1.05) : want};
}

// Filled entries after each forward, stacked per request in the request's colour.
function drawKVStacks(ctx, f, steps, span, y) {
  for (let i = span.a; i < span.b; i++) {
    let acc = 0;
    for (const [id, n] of steps[i].stack) {
      ctx.fillStyle = reqColor(id);
      const y0 = y(acc), y1 = y(acc + n);
      rect(ctx, f, steps[i].end, span.until(i), y1, Math.max(1, y0 - y1));
      acc += n;
    }
  }
}

// Blocks in use (as tokens: blocks × block size), as every step and stats event said, dashed.
function drawInUse(ctx, f, use, y, bs, xEnd) {
  ctx.strokeStyle = C.inUse; ctx.lineWidth = 1.5; ctx.setLineDash([5, 4]);
  ctx.beginPath();
  stepPath(ctx, f, use, (p) => y(p.used * bs), xEnd);
  ctx.stroke(); ctx.setLineDash([]);
}

// The budget (the cache-budget setting, from stats) and the physical capacity.
function drawLimits(ctx, f, s, y, scale, bs, capacity) {
  if (scale.budget <= scale.ymax) {
    ctx.strokeStyle = C.budget; ctx.lineWidth = 2;
    ctx.beginPath();
    stepPath(ctx, f, pointsInView(s.stats, f), (p) => y(p.blocks * bs), f.gutter + f.pw);
    ctx.stroke();
  }
  if (capacity <= scale.ymax) {
    ctx.strokeStyle = C.capacity; ctx.lineWidth = 2;
    ctx.beginPath(); ctx.moveTo(f.gutter, y(capacity) + 1); ctx.lineTo(f.gutter + f.pw, y(capacity) + 1); ctx.stroke();
  }
}

// Filled KV entries after every forward, stacked per request in the request's colour,
// against the blocks in use, the live budget and the physical capacity.
export function drawKV(canvas, s, view, now) {
  const st = strip(canvas, view);
  if (!s.hello || !s.hello.cache_blocks) return {f: st.f};
  const bs = s.hello.block_size, capacity = s.hello.cache_blocks * bs;
  // disaggregated: the decode instance's cache (the prefill instance's blocks: the block grid)
  const steps = s.instances ? s.steps.filter((x) => x.instance !== "prefill") : s.steps;
  const span = stepsInView(steps, st.f, now), use = pointsInView(s.blockUse, st.f);
  const scale = kvScale(s, steps, st.f, span, use, bs, capacity);
  const above = [];
  if (scale.budget > scale.ymax && scale.budget === capacity) above.push(`budget = capacity ${fmtTokens(capacity)}`);
  else {
    if (scale.budget > scale.ymax) above.push(`budget ${fmtTokens(scale.budget)}`);
    if (capacity > scale.ymax) above.push(`capacity ${fmtTokens(capacity)}`);
  }
  // A band above the plot for that note, so no line or stack is drawn through it.
  if (above.length) { st.top += 16; st.plotH -= 16; }
  const {ctx, f, top, plotH} = st;
  const y = (tok) => top + plotH - (Math.min(tok, scale.ymax) / scale.ymax) * plotH;
  timeAxis(ctx, f, top, top + plotH, "", false);
  drawKVStacks(ctx, f, steps, span, y);
  drawInUse(ctx, f, use, y, bs, xNow(f, view, now));
  drawLimits(ctx, f, s, y, scale, bs, capacity);
  scaleLabels(st, fmtTokens(Math.round(scale.ymax)));
  let note = null;
  if (above.length) {
    ctx.textAlign = "left"; ctx.textBaseline = "bottom"; ctx.fillStyle = C.budget;
    // the longest wording that fits the plot's width (a phone's cut "capacity 16.4k tok: above this")
    const room = f.pw - 12, fits = (t) => ctx.measureText(t).width <= room;
    const say = [`↑ ${above.join(" · ")}: above this scale`, `↑ ${above.join(" · ")}: above`, `↑ ${above.join(" · ")}`]
      .find(fits) || `↑ ${above[above.length - 1]}`;
    ctx.fillText(say, f.gutter + 6, top - 2);
    note = {text: say, w: ctx.measureText(say).width, room};
  }
  return {f, note};   // note: the limits above the scale, as written (the layout tests read it)
}

// ------------------------------------------------------------------ queue
export function drawQueue(canvas, s, view, now) {
  const st = strip(canvas, view);
  const {ctx, f, top, plotH} = st;
  timeAxis(ctx, f, top, top + plotH, "", false);
  // The stats samples, then the queue as the page's state holds it now (the header's and the
  // slots' figure): a long forward holds the next sample back, not the requests' events.
  const pts = pointsInView(s.stats, f);
  if (!view.paused && s.hello) pts.push({t: now, queue: s.waiting.length, running: running(s)});
  let ymax = 4;
  for (const p of pts) ymax = Math.max(ymax, p.queue, p.running);
  const y = (v) => top + plotH - (v / ymax) * plotH;
  const xe = xNow(f, view, now);
  if (pts.length) {
    ctx.beginPath();
    stepPath(ctx, f, pts, (p) => y(p.queue), xe);
    ctx.lineTo(xe, y(0)); ctx.lineTo(Math.max(f.gutter, f.x(pts[0].t)), y(0)); ctx.closePath();
    ctx.fillStyle = C.queueFill; ctx.fill();
    ctx.beginPath();
    stepPath(ctx, f, pts, (p) => y(p.running), xe);
    ctx.strokeStyle = C.running; ctx.lineWidth = 2; ctx.stroke();
  }
  scaleLabels(st, String(ymax));
  return {f};
}
