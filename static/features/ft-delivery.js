// First Token: what lies between the server and this page (issue 21), drawn and measured from
// the page's state alone. The engine times a token (`token.t`); the page records when the frame
// carrying it arrived here, on the engine's clock (ft-connection.js's sync; `r.arrivals` in
// ft-state.js, page-side only, never in a saved trace). The difference is the way out: a
// buffering proxy (`buffer_ms`/`buffer_bytes`: real) and a network delay (`net_latency_ms`/
// `net_jitter_ms`: injected, and labelled so wherever its effect is drawn). Also the cold start:
// a `model_load` event's band on the timeline and the part of a request's wait it overlapped,
// and the forwards that were the first of their shape since the server started (step.first_shape).
// The timeline, the request panel, the diagnosis and the lessons call these; the only DOM it
// writes is the timeline legend's three items (#tl-way, #tl-load, #tl-shape).
import {palette as P, alpha} from "ft/palette";
import {percentile} from "ft/state";
import {rect} from "ft/timeline";
import {fmtS} from "ft/util";

const C = {
  arrive: P.accent, link: alpha(P.accent, 0.55), load: P.load, loadBand: alpha(P.load, 0.16),
  loadEdge: alpha(P.load, 0.8), noteBg: alpha(P.panel2, 0.85),
};

// The way out as the settings say it, or null when nothing sits between the server and you.
export function wayOut(settings) {
  const st = settings || {};
  const net = st.net_latency_ms || 0, jitter = st.net_jitter_ms || 0;
  const bufMs = st.buffer_ms || 0, bufBytes = st.buffer_bytes || 0;
  if (!net && !jitter && !bufMs && !bufBytes) return null;
  const parts = [];
  if (net || jitter) parts.push(`+${net}${jitter ? `–${net + jitter}` : ""} ms injected network delay`);
  if (bufMs || bufBytes) {
    parts.push(`a real buffering proxy lets go every ${[bufMs && `${bufMs} ms`, bufBytes && `${bufBytes} bytes`]
      .filter(Boolean).join(" or ")}`);
  }
  return {net, jitter, injected: !!(net || jitter), buffered: !!(bufMs || bufBytes), text: parts.join(" · ")};
}

// Time to first token as this page saw it: the first token's arrival here minus the request's
// arrival at the engine, both on the engine clock (null without a live arrival).
export function ttftHere(r) {
  const k = r.tokens.indexOf(r.first);
  const at = k >= 0 ? r.arrivals[k] : null;
  return at === null || at === undefined ? null : at - r.arrival;
}

// How clumped a request's arrivals here are, against its engine token times: the distinct
// arrival moments (frames within 20 ms count as one), the engine's own moments (its forwards
// that handed tokens out: speculative decoding hands out its accepted guesses with the model's
// token, at once), and the median gaps between those and between the arrival moments. Null
// without live arrivals.
export function clumps(r) {
  const at = r.arrivals.filter((a) => a !== null && a !== undefined);
  if (at.length < 3 || at.length !== r.tokens.length) return null;
  const moments = [at[0]];
  for (const a of at) if (a - moments[moments.length - 1] > 0.02) moments.push(a);
  const made = r.tokens.filter((t, k) => r.tokenSpec[k] !== "accepted");
  const gaps = (xs) => xs.slice(1).map((x, i) => x - xs[i]);
  return {tokens: at.length, made: made.length, clumps: moments.length, engineGap: percentile(gaps(made), 50),
          arrivalGap: moments.length > 1 ? percentile(gaps(moments), 50) : null,
          lag: percentile(at.map((a, i) => a - r.tokens[i]), 50)};
}

// The part of r's wait before its first prefill that overlapped a model load (measured: the
// `load` stage once it finished; until then, from the model_load events).
export function loadWait(r, s) {
  if (r.stages && typeof r.stages.load === "number") return r.stages.load;
  const until = r.prefills.length ? r.prefills[0].start : s.latestT;
  let sum = 0;
  for (const l of s.loads) sum += Math.max(0, Math.min(until, l.end) - Math.max(r.arrival, l.start));
  return sum;
}

// ------------------------------------------------------------------ the timeline
// Under everything on the rows: a band over the whole plot for each model load in view.
function drawLoadBands({ctx, f, s, g}) {
  ctx.fillStyle = C.loadBand;
  for (const l of s.loads) rect(ctx, f, l.start, l.end, g.top, g.plotH);
}

// On each request's row, the part of its queue stage that waited for a load, in the load colour.
function drawLoadWaits({ctx, f, s, g, now}) {
  if (!s.loads.length) return;
  ctx.fillStyle = C.load;
  for (const r of g.reqs) {
    const until = r.prefills.length ? r.prefills[0].start : (r.end !== null ? r.end : now);
    for (const l of s.loads) {
      const a = Math.max(r.arrival, l.start), b = Math.min(until, l.end);
      if (b > a) rect(ctx, f, a, b, g.barY(r), g.barH);
    }
  }
}

// On the lane of forwards, an outline round each that was the first of its shape since the server
// started, in the load colour (a cold cost, as the load is) and at least 5 px wide, so a forward
// of a few ms still shows at any zoom. Returns the marks drawn (the tests read them).
// (Disaggregated: on its own instance's lane, `byInstance`.)
function drawFirstShapes({ctx, f, s, i0, lane: one, byInstance}) {
  const marks = [], steps = s.steps;
  ctx.strokeStyle = C.load; ctx.lineWidth = 1.5;
  for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
    const st = steps[i];
    if (!st.firstShape) continue;
    const x0 = Math.max(f.gutter, f.x(st.start)), x1 = Math.min(f.gutter + f.pw, Math.max(f.x(st.end), x0 + 5));
    if (x1 <= x0) continue;
    const lane = byInstance ? byInstance[st.instance === "prefill" ? "prefill" : "decode"] : one;
    ctx.strokeRect(x0, lane.y - 1.5, x1 - x0, lane.h + 3);
    marks.push({start: st.start, x0, x1});
  }
  return marks;
}

// Each token's arrival here: a mark at the row's lower edge, linked to its tick at engine time
// when they are apart (with nothing set between the server and the page, only marks visibly
// apart are drawn). Then the loads' labels; the timeline's legend says what is between (the
// injected delay named injected), and names the first-shape outline while `shapes` (the marks
// drawFirstShapes drew, an earlier layer) are in view. Returns what it wrote (the lessons' tests read it).
function drawArrivals({ctx, f, s, g, compact, out: {shapes}}) {
  const way = wayOut(s.settings);
  const out = {marks: 0, apart: 0, loads: [], note: way ? `arrival here: ${way.text}` : null};
  const inX = (x) => x >= f.gutter && x <= f.gutter + f.pw;
  const dot = Math.max(1.5, Math.min(3, g.rowH * 0.12));
  for (const r of g.reqs) {
    const y = g.barY(r), yTok = y + g.barH * 0.5, yArr = Math.min(y + g.barH + dot * 0.5, g.top + g.plotH - dot);
    ctx.strokeStyle = C.link; ctx.lineWidth = 1;
    ctx.beginPath();
    for (let k = 0; k < r.tokens.length; k++) {
      const a = r.arrivals[k];
      if (a === null || a === undefined) continue;
      const xt = f.x(r.tokens[k]), xa = f.x(a);
      if (Math.abs(xa - xt) >= 2 && (inX(xt) || inX(xa))) {
        ctx.moveTo(Math.max(f.gutter, Math.min(f.gutter + f.pw, xt)), yTok); ctx.lineTo(xa, yArr); out.apart++;
      }
    }
    ctx.stroke();
    ctx.fillStyle = C.arrive;
    for (let k = 0; k < r.tokens.length; k++) {
      const a = r.arrivals[k];
      if (a === null || a === undefined || !inX(f.x(a))) continue;
      if (!way && Math.abs(f.x(a) - f.x(r.tokens[k])) < 3) continue;   // nothing between: the tick says it all
      const big = r.tokens[k] === r.first ? 1.6 : 1;
      ctx.beginPath(); ctx.arc(f.x(a), yArr, dot * big, 0, 2 * Math.PI); ctx.fill();
      out.marks++;
    }
  }
  const px = compact ? 11 : 13;
  ctx.font = `${px}px system-ui, sans-serif`; ctx.textBaseline = "top"; ctx.textAlign = "left";
  for (const l of s.loads) {
    const x0 = Math.max(f.gutter, f.x(l.start)), x1 = Math.min(f.gutter + f.pw, f.x(l.end));
    if (x1 <= f.gutter || x0 >= f.gutter + f.pw) continue;
    ctx.strokeStyle = C.loadEdge; ctx.lineWidth = 1.5;
    for (const x of [f.x(l.start), f.x(l.end)]) {
      if (inX(x)) { ctx.beginPath(); ctx.moveTo(x, g.top); ctx.lineTo(x, g.top + g.plotH); ctx.stroke(); }
    }
    const text = `model loading (${l.reason || "reload"}): ${fmtS(l.seconds)}`;
    const w = ctx.measureText(text).width, x = Math.min(x0 + 4, f.gutter + f.pw - w - 4), y = g.top + g.plotH - px - 6;
    ctx.fillStyle = C.noteBg; ctx.fillRect(x - 3, y - 2, w + 6, px + 4);
    ctx.fillStyle = C.load; ctx.fillText(text, x, y);
    out.loads.push({text, left: x, top: y, right: x + w, bottom: y + px});
  }
  legend(way, s.loads.length > 0, shapes.length > 0);
  return out;
}

// The timeline's legend: the arrival mark with what lies between the server and this page, the
// model load's swatch and the first-shape outline, each shown when it applies (written only when
// it changes).
let legendKey = null;
function legend(way, loads, shapes) {
  const key = `${way ? way.text : ""}|${loads}|${shapes}`;
  if (key === legendKey || typeof document === "undefined") return;
  legendKey = key;
  const wayEl = document.getElementById("tl-way"), loadEl = document.getElementById("tl-load");
  const shapeEl = document.getElementById("tl-shape");
  if (wayEl) {
    wayEl.hidden = !way;
    wayEl.querySelector(".way-text").textContent = way ? `arrival here (${way.text})` : "arrival here";
  }
  if (loadEl) loadEl.hidden = !loads;
  if (shapeEl) shapeEl.hidden = !shapes;
}

// The timeline's layers (ft-timeline.js createTimeline): the loads behind everything, the
// first-shape outlines on the lane of forwards, the loads' part of each row's wait over its
// stages, and each token's arrival here over its tick (`delivery`: what it wrote).
export const timelineLayers = [
  {name: "loadBands", at: "behind", draw: drawLoadBands},
  {name: "shapes", at: "lane", draw: drawFirstShapes},
  {name: "loadWaits", at: "stages", draw: drawLoadWaits},
  {name: "delivery", at: "marks", draw: drawArrivals},
];

// ------------------------------------------------------------------ a new shape's first forward
// What a forward that was the first of its shape took against the later forwards like it in the
// page's history: of the same kind, token count and requests, none the first of its shape (a step
// event does not carry its logit rows; without guesses these fix them). Null while there are none.
export function firstShapeCost(st, s) {
  const like = s.steps.filter((x) => x.start > st.start && !x.firstShape && x.kind === st.kind &&
                                     x.tokens === st.tokens && x.ids.length === st.ids.length);
  if (!like.length) return null;
  const took = st.end - st.start, usual = percentile(like.map((x) => x.end - x.start), 50);
  return {took, usual, n: like.length, extra: took - usual};
}

// The hover's line for a forward that was the first of its shape.
export function firstShapeText(st, s) {
  const c = firstShapeCost(st, s);
  return `first forward of its shape (${st.tokens} token${st.tokens === 1 ? "" : "s"}) since the server started: ` +
    "its kernels were set up now" + (c ? ` (${fmtS(c.took)}; ${c.n} forward${c.n === 1 ? "" : "s"} like it ` +
    `since: median ${fmtS(c.usual)})` : "");
}

// A first token slowed by new shapes: what the forwards that computed r's prompt and were the
// first of their shape took over forwards like them (measured, firstShapeCost), said when that
// is a tenth of its TTFT or more. A sentence for the diagnosis, or null.
export function firstShapeNote(r, s) {
  if (r.ttft === null || r.first === null) return null;
  let extra = 0, n = 0;
  for (const st of s.steps) {
    if (!st.firstShape || st.start < r.arrival || st.end > r.first || !st.ids.includes(r.id)) continue;
    const c = firstShapeCost(st, s);
    if (c && c.extra > 0) { extra += c.extra; n++; }
  }
  if (!n || extra < 0.1 * r.ttft) return null;
  return `${fmtS(extra)} of its time to first token was the setting up of kernels: ` +
    `${n === 1 ? "a forward it was in was" : `${n} forwards it was in were`} the first of their shape since the ` +
    "server started (measured against the forwards like them since) — a server that runs its usual batch shapes " +
    "once before it takes requests would not make it pay that.";
}

// ------------------------------------------------------------------ the lessons' figures
// Requests that arrived at or after t0 with arrivals here for all their tokens.
function liveSince(s, t0) {
  const out = [];
  for (const id of s.order) {
    const r = s.reqs.get(id);
    if (r.arrival >= t0 && r.end !== null && r.tokens.length && r.arrivals.every((a) => a !== null)) out.push(r);
  }
  return out;
}

export const proof = {
  "buffered-proxy"(s, t0) {
    const c = liveSince(s, t0).map(clumps).filter(Boolean);
    if (!c.length) return null;
    const n = c.reduce((a, x) => a + x.tokens, 0), k = c.reduce((a, x) => a + x.clumps, 0);
    return `${n} tokens made ${fmtS(percentile(c.map((x) => x.engineGap), 50))} apart arrived here in ${k} clumps ` +
      `(median ${fmtS(percentile(c.map((x) => x.lag), 50))} after the engine made them)`;
  },
  "slow-network"(s, t0) {
    const done = liveSince(s, t0).filter((r) => r.ttft !== null && ttftHere(r) !== null);
    if (!done.length) return null;
    const here = percentile(done.map(ttftHere), 50), eng = percentile(done.map((r) => r.ttft), 50);
    return `TTFT here ${fmtS(here)} vs the engine's ${fmtS(eng)}: +${fmtS(here - eng)} on the way ` +
      `(injected network delay: ${s.settings.net_latency_ms || 0} ms` +
      `${s.settings.net_jitter_ms ? ` + up to ${s.settings.net_jitter_ms} ms jitter` : ""})`;
  },
  // Counted as the rows are drawn (drawLoadWaits): every request whose wait overlapped the load,
  // finished or still waiting, not only the finished ones ("0 requests waited" beside two rows
  // waiting in the load colour). Their TTFT and load stage once they have them.
  "cold-start"(s, t0) {
    const l = s.loads[s.loads.length - 1];
    if (!l || l.start < t0 - 1) return null;
    const since = [];
    for (const id of s.order) { const r = s.reqs.get(id); if (r.arrival >= t0 && !r.rejected) since.push(r); }
    const waited = since.filter((r) => loadWait(r, s) > 0), after = since.filter((r) => r.stages && !(loadWait(r, s) > 0));
    const done = waited.filter((r) => r.stages && r.ttft !== null), still = waited.length - done.length;
    return `model load ${fmtS(l.seconds)} · ${waited.length} request${waited.length === 1 ? "" : "s"} waited for it` +
      (still ? ` (${still} still waiting)` : "") +
      (done.length ? ` (TTFT ${fmtS(percentile(done.map((r) => r.ttft), 50))}, load stage ` +
        `${fmtS(percentile(done.map((r) => r.stages.load || loadWait(r, s)), 50))})` : "") +
      (after.length ? ` · later: TTFT ${fmtS(percentile(after.map((r) => r.ttft), 50))}, no load` : "");
  },
};

// ------------------------------------------------------------------ the diagnosis
// Whether the way out or a cold start explains r better than the engine's own stages: a first
// token late *here* while the engine's TTFT was short (network or buffering, named from the
// settings), arrivals in clumps while the engine's steps were steady (buffering), or a wait for
// the model (its `load` stage). Returns {cause, text, numbers} or null.
// `largest`: the largest engine-measured part of r's time (queue, prefill, decode ...): with nothing
// set between, a late first token is the story only when it outweighs that part too (a page on a
// busy machine reads its frames late; that must not hide a request that queued for seconds).
export function diagnoseDelivery(r, s, largest = 0) {
  if (!r.stages || r.ttft === null) return null;
  const load = r.stages.load || 0;
  if (load > 0 && load >= 0.3 * r.ttft) {
    const l = s.loads.find((x) => x.start <= r.arrival + r.ttft && x.end >= r.arrival);
    return {cause: "cold start", numbers: {load, ttft: r.ttft},
      text: `A cold start: ${fmtS(load)} of its ${fmtS(r.ttft)} to first token was waiting for the model to load` +
        (l ? ` (the load took ${fmtS(l.seconds)}, measured)` : "") + " — a server kept warm, or loaded before it takes " +
        "requests, would not make it wait; once loaded, later requests pay nothing for it."};
  }
  const here = ttftHere(r), way = wayOut(s.settings), c = clumps(r);
  if (here === null) return null;
  const lag = here - r.ttft;
  // Clumped: a few arrival moments for many engine moments (forwards that handed tokens out),
  // a tenth of a second or more apart and well apart from the engine's steps (the page's own
  // frames group events for a few ms), or all at once while the settings say a proxy buffers.
  const bunched = c && c.clumps <= Math.max(2, c.made / 2) && (c.arrivalGap === null ? !!(way && way.buffered)
    : c.arrivalGap >= 0.1 && c.arrivalGap > 2 * c.engineGap);
  // With nothing set between, clumps this page saw (a busy machine's websocket can clump too)
  // are the story only when they also made the first token late by a fifth of what it saw.
  if (bunched && (way ? way.buffered : lag >= 0.1 && lag >= 0.2 * here && lag >= largest)) {
    return {cause: "buffering", numbers: {ttft: r.ttft, ttftHere: here, delivery: lag},
      text: `Buffering: the engine made its ${c.tokens} tokens steadily (${c.made < c.tokens ? `in ${c.made} forwards, ` : ""}` +
        `${fmtS(c.engineGap)} apart) but they ` +
        `arrived here in ${c.clumps === 1 ? "one clump" : `${c.clumps} clumps, ${fmtS(c.arrivalGap)} apart`} — a buffering proxy holds tokens and lets them ` +
        `go together (engine TTFT ${fmtS(r.ttft)}, here ${fmtS(here)}). Turning response buffering off ` +
        "(nginx: proxy_buffering off) would let each token through as it is made."};
  }
  // Late here: a tenth of a second or more, and (nothing set between) a fifth of what the page saw.
  if (lag >= 0.1 && (way || (lag >= 0.2 * here && lag >= largest))) {
    const why = way && way.injected && !way.buffered ? "injected network delay" :
      way && way.buffered && !way.injected ? "a buffering proxy holds tokens" :
      way ? "injected network delay and a buffering proxy that holds tokens" : "the network between the server and you";
    return {cause: way && way.buffered && !way.injected ? "buffering" : "network", numbers: {ttft: r.ttft, ttftHere: here, delivery: lag},
      text: `Its first token was late here, not in the engine: the engine's own TTFT was ${fmtS(r.ttft)}, ` +
        `this page saw it at ${fmtS(here)}, ${fmtS(lag)} later — ${why}` +
        (way && way.injected ? ` (${way.net} ms injected${way.jitter ? ` + up to ${way.jitter} ms jitter` : ""})` : "") + "."};
  }
  return null;
}
