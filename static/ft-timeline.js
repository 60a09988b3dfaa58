// First Token: the time-axis views drawn on <canvas> (timeline, KV cache, queue).
// They share one `view` (visible span and right edge, live or paused) so the three
// strips line up: a request queueing in the timeline sits over the queue rising
// below it, and over the KV cache that was full at that moment.
"use strict";
(function () {
  const FT = (window.FT = window.FT || {});

  // Canvas colours: the palette from ft.css (FT.palette), some made translucent.
  const P = FT.palette, alpha = FT.alpha;
  const C = {
    bg: P.panel2, grid: P.grid, muted: P.muted, api: P.api,
    tokenize: P.tokenize, queue: P.queue, queueFill: alpha(P.queue, 0.55),
    prefill: P.prefill, prefillWait: alpha(P.prefill, 0.28), firstSample: P.first,
    decodeA: P.decode, decodeB: P.decodeAlt, decodeIdle: alpha(P.decode, 0.16),
    tick: P.tick, rejected: P.bad, select: alpha(P.overlay, 0.10), now: P.accent,
    bandDecode: alpha(P.overlay, 0.035), bandPrefill: alpha(P.prefill, 0.10),
    capacity: P.bad, budget: P.accent, reserved: P.text, running: P.decode,
  };

  // A request's own colour (KV stack, slots): spread hues by the golden angle on its number.
  // Cached: the KV chart sets it for every stacked rectangle of every frame.
  const colorCache = new Map();
  FT.reqColor = function (id) {
    let c = colorCache.get(id);
    if (!c) {
      if (colorCache.size > 4096) colorCache.clear();
      const n = parseInt(String(id).replace(/\D/g, ""), 10) || 0;
      c = `hsl(${(n * 137.508) % 360}, 62%, 58%)`;
      colorCache.set(id, c);
    }
    return c;
  };

  // Keep a canvas's backing store at device pixels; returns a context scaled to CSS pixels.
  FT.fitCanvas = function (canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return {ctx, w, h};
  };

  function niceStep(span, px, minPx) {
    const steps = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300];
    for (const s of steps) if ((s / span) * px >= minPx) return s;
    return steps[steps.length - 1];
  }

  // Geometry shared by the strips: left gutter for labels, plot width, x(t).
  function frame(w, view, compact) {
    const gutter = compact ? 46 : 78;
    const pw = Math.max(10, w - gutter - 10);
    const left = view.right - view.span;
    return {gutter, pw, left, right: view.right,
            x: (t) => gutter + ((t - left) / view.span) * pw,
            t: (x) => left + ((x - gutter) / pw) * view.span};
  }

  function timeAxis(ctx, f, top, bottom, font, labels) {
    const step = niceStep(f.right - f.left, f.pw, 90);
    ctx.strokeStyle = C.grid; ctx.lineWidth = 1;
    ctx.fillStyle = C.muted; ctx.font = font; ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (let t = Math.ceil(f.left / step) * step; t <= f.right; t += step) {
      const x = Math.round(f.x(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
      if (labels) ctx.fillText(`${+t.toFixed(2)} s`, x, bottom + 3);
    }
  }

  // First index whose `end` is >= t (steps are in time order).
  function firstStepFrom(steps, t) {
    let lo = 0, hi = steps.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (steps[mid].end < t) lo = mid + 1; else hi = mid; }
    return lo;
  }

  function rect(ctx, f, a, b, y, h) {
    const x0 = Math.max(f.gutter, f.x(a)), x1 = Math.min(f.gutter + f.pw, f.x(b));
    if (x1 > x0) ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
  }

  // ------------------------------------------------------------------ timeline
  // Rows: requests alive somewhere in the window, oldest on top; the newest that fit.
  function layoutRows(s, f, now, top, plotH, compact) {
    const rows = [];
    for (const id of s.order) {
      const r = s.reqs.get(id);
      const end = r.end === null ? now : r.end;
      if (r.arrival <= f.right && end >= f.left) rows.push(r);
    }
    const maxRows = Math.floor(plotH / 2);
    const shown = rows.length > maxRows ? rows.slice(rows.length - maxRows) : rows;
    const rowH = shown.length ? Math.min(compact ? 18 : 30, plotH / shown.length) : 0;
    const rowOf = new Map();
    shown.forEach((r, i) => rowOf.set(r.id, i));
    const barH = rowH >= 6 ? rowH * 0.72 : rowH;
    return {hidden: rows.length - shown.length, shown, rowH, rowOf, barH, top, plotH,
            barY: (i) => top + i * rowH + (rowH - barH) / 2};
  }

  // Background bands: one per model forward, so a batch reads as a column shared by its rows,
  // and a prefill (blue) visibly stalls everybody's decoding.
  function drawBands(ctx, f, steps, i0, g) {
    for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
      const st = steps[i];
      if (st.kind === "release" || (st.kind === "decode" && st.n % 2)) continue;
      ctx.fillStyle = st.kind === "prefill" ? C.bandPrefill : C.bandDecode;
      rect(ctx, f, st.start, st.end, g.top, g.plotH);
    }
  }

  // Stage segments up to decoding, one colour per pass (fewer canvas state changes).
  function drawStages(ctx, f, g, now) {
    const {shown, barY, barH} = g;
    const endOr = (t, r) => (t !== null ? t : (r.end !== null ? r.end : now));
    ctx.fillStyle = C.tokenize;
    shown.forEach((r, i) => { if (r.tokStart !== null) rect(ctx, f, r.tokStart, r.tokEnd, barY(i), barH); });
    ctx.fillStyle = C.queue;
    shown.forEach((r, i) => {
      if (r.rejected) return;
      const from = r.tokEnd !== null ? r.tokEnd : r.arrival;
      rect(ctx, f, from, endOr(r.prefills.length ? r.prefills[0].start : null, r), barY(i), barH);
    });
    // Admission (got a slot and KV blocks): the queue stage goes on until its prefill starts.
    ctx.fillStyle = C.tick;
    shown.forEach((r, i) => {
      if (r.admitted !== null && r.admitted >= f.left && r.admitted <= f.right) ctx.fillRect(f.x(r.admitted) - 0.5, barY(i), 1, barH);
    });
    ctx.fillStyle = C.prefillWait;
    shown.forEach((r, i) => { if (r.prefills.length) rect(ctx, f, r.prefills[0].start, endOr(r.first, r), barY(i), barH); });
    ctx.fillStyle = C.prefill;
    shown.forEach((r, i) => { for (const p of r.prefills) rect(ctx, f, p.start, p.end, barY(i), barH); });
    ctx.fillStyle = C.decodeIdle;
    shown.forEach((r, i) => { if (r.first !== null) rect(ctx, f, r.first, endOr(null, r), barY(i), barH); });
  }

  // Each decode step on the row of every request in its batch, alternating two shades.
  function drawDecodeSteps(ctx, f, steps, i0, g) {
    for (const [color, parity] of [[C.decodeA, 0], [C.decodeB, 1]]) {
      ctx.fillStyle = color;
      for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
        const st = steps[i];
        if (st.kind !== "decode" || st.n % 2 !== parity) continue;
        for (const id of st.ids) {
          const row = g.rowOf.get(id);
          if (row !== undefined) rect(ctx, f, st.start, st.end, g.barY(row), g.barH);
        }
      }
    }
  }

  // Rejections, then a tick per token, the first one taller and in the first-sample colour.
  function drawOutcomes(ctx, f, g, view) {
    const {shown, barY, barH, rowH, top} = g;
    ctx.fillStyle = C.rejected;
    shown.forEach((r, i) => { if (r.rejected) rect(ctx, f, r.arrival, Math.max(r.end, r.arrival + view.span / 200), barY(i), barH); });
    const tickW = rowH >= 8 ? 2 : 1;
    ctx.fillStyle = C.tick;
    shown.forEach((r, i) => {
      const y = barY(i);
      for (let k = 1; k < r.tokens.length; k++) {
        const t = r.tokens[k];
        if (t >= f.left && t <= f.right) ctx.fillRect(f.x(t) - tickW / 2, y, tickW, barH);
      }
    });
    ctx.fillStyle = C.firstSample;
    shown.forEach((r, i) => {
      if (r.first !== null && r.first >= f.left && r.first <= f.right) {
        ctx.fillRect(f.x(r.first) - tickW, top + i * rowH, tickW * 2, rowH);
      }
    });
  }

  // Row labels when there is room to read them, the "now" line, and how many rows did not fit.
  function drawLabels(ctx, f, g, compact, view, now) {
    const {shown, rowH, top, plotH} = g;
    if (rowH >= 11) {
      ctx.font = `${Math.min(compact ? 11 : 15, rowH - 2)}px ui-monospace, monospace`;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      shown.forEach((r, i) => {
        ctx.fillStyle = r.source === "page" ? C.now : r.source === "api" ? C.api : C.muted;
        ctx.fillText(r.id, f.gutter - 6, top + i * rowH + rowH / 2);
      });
    }
    if (!view.paused) {
      ctx.strokeStyle = C.now; ctx.lineWidth = 1.5;
      const x = Math.round(f.x(now)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + plotH); ctx.stroke();
    }
    if (g.hidden > 0) {
      ctx.fillStyle = C.muted; ctx.textAlign = "left"; ctx.textBaseline = "top";
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText(`+${g.hidden} older rows`, f.gutter + 4, top + 2);
    }
  }

  FT.drawTimeline = function (canvas, s, view, now, opts) {
    const {ctx, w, h} = FT.fitCanvas(canvas);
    const compact = w < 700;
    const f = frame(w, view, compact);
    const axisH = compact ? 16 : 24;
    const top = 4, plotH = h - axisH - top;
    ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
    const g = layoutRows(s, f, now, top, plotH, compact);
    const i0 = firstStepFrom(s.steps, f.left);
    drawBands(ctx, f, s.steps, i0, g);
    timeAxis(ctx, f, top, top + plotH, `${compact ? 10 : 13}px system-ui, sans-serif`, true);
    if (opts.selected && g.rowOf.has(opts.selected)) {
      ctx.fillStyle = C.select;
      ctx.fillRect(0, top + g.rowOf.get(opts.selected) * g.rowH, w, g.rowH);
    }
    drawStages(ctx, f, g, now);
    drawDecodeSteps(ctx, f, s.steps, i0, g);
    drawOutcomes(ctx, f, g, view);
    drawLabels(ctx, f, g, compact, view, now);
    return {f, shown: g.shown, rowH: g.rowH, top, i0};
  };

  FT.hitTimeline = function (layout, s, x, y) {
    const i = Math.floor((y - layout.top) / layout.rowH);
    const r = layout.shown[i];
    if (!r) return null;
    const t = layout.f.t(x);
    let step = null;
    for (let k = layout.i0; k < s.steps.length && s.steps[k].start <= t; k++) {
      const st = s.steps[k];
      if (st.kind !== "release" && st.start <= t && t <= st.end && st.ids.includes(r.id)) step = st;
    }
    return {req: r, t, step};
  };

  // The strips under the timeline share its time axis, size and background.
  function strip(canvas, view) {
    const {ctx, w, h} = FT.fitCanvas(canvas);
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
  // The forwards a strip draws: from the one before the window (its state carries into view)
  // to the last that ended inside it; until(i) is when step i's state gave way (next step, or now).
  function stepsInView(steps, f, now) {
    const a = Math.max(0, firstStepFrom(steps, f.left) - 1);
    let b = a;
    while (b < steps.length && steps[b].end <= f.right) b++;
    return {a, b, until: (i) => (i + 1 < steps.length ? steps[i + 1].end : now)};
  }

  // Scale to what is in view (a few requests hold little of a big cache); the budget and
  // capacity lines are drawn when they fall inside the scale and named when above it.
  function kvScale(s, f, span, bs, capacity) {
    let peak = 0;
    for (let i = span.a; i < span.b; i++) peak = Math.max(peak, s.steps[i].blocksUsed * bs, s.steps[i].cacheTokens);
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
        ctx.fillStyle = FT.reqColor(id);
        const y0 = y(acc), y1 = y(acc + n);
        rect(ctx, f, steps[i].end, span.until(i), y1, Math.max(1, y0 - y1));
        acc += n;
      }
    }
  }

  // Reserved blocks (what admission counts) as a dashed step line.
  function drawReserved(ctx, f, steps, span, y, bs) {
    ctx.strokeStyle = C.reserved; ctx.lineWidth = 1.5; ctx.setLineDash([5, 4]);
    ctx.beginPath();
    for (let i = span.a; i < span.b; i++) {
      const x0 = Math.max(f.gutter, f.x(steps[i].end));
      const x1 = Math.min(f.gutter + f.pw, f.x(span.until(i)));
      const yy = y(steps[i].blocksUsed * bs);
      if (i === span.a) ctx.moveTo(x0, yy); else ctx.lineTo(x0, yy);
      ctx.lineTo(x1, yy);
    }
    ctx.stroke(); ctx.setLineDash([]);
  }

  // The budget (the cache-budget setting, from stats) and the physical capacity.
  function drawLimits(ctx, f, s, y, scale, bs, capacity) {
    ctx.strokeStyle = C.budget; ctx.lineWidth = 2;
    ctx.beginPath();
    let started = false;
    for (const st of s.stats) {
      if (st.t < f.left - 5 || st.t > f.right) continue;
      const xx = Math.max(f.gutter, f.x(st.t)), yy = y(st.blocks * bs);
      if (!started) { ctx.moveTo(xx, yy); started = true; } else ctx.lineTo(xx, yy);
    }
    if (started && scale.budget <= scale.ymax) { ctx.lineTo(f.gutter + f.pw, y((s.last ? s.last.cache_blocks : 0) * bs)); ctx.stroke(); }
    if (capacity <= scale.ymax) {
      ctx.strokeStyle = C.capacity; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(f.gutter, y(capacity) + 1); ctx.lineTo(f.gutter + f.pw, y(capacity) + 1); ctx.stroke();
    }
  }

  // Filled KV entries after every forward, stacked per request in the request's colour,
  // against the reserved blocks, the live budget and the physical capacity.
  FT.drawKV = function (canvas, s, view, now) {
    const st = strip(canvas, view);
    const {ctx, f, top, plotH} = st;
    if (!s.hello) return {f};
    const bs = s.hello.block_size, capacity = s.hello.cache_blocks * bs;
    const span = stepsInView(s.steps, f, now);
    const scale = kvScale(s, f, span, bs, capacity);
    const y = (tok) => top + plotH - (Math.min(tok, scale.ymax) / scale.ymax) * plotH;
    timeAxis(ctx, f, top, top + plotH, "", false);
    drawKVStacks(ctx, f, s.steps, span, y);
    drawReserved(ctx, f, s.steps, span, y, bs);
    drawLimits(ctx, f, s, y, scale, bs, capacity);
    scaleLabels(st, FT.fmtTokens(Math.round(scale.ymax)));
    const above = [];
    if (scale.budget > scale.ymax) above.push(`budget ${FT.fmtTokens(scale.budget)}`);
    if (capacity > scale.ymax) above.push(`capacity ${FT.fmtTokens(capacity)}`);
    if (above.length) {
      ctx.textAlign = "left"; ctx.textBaseline = "top"; ctx.fillStyle = C.budget;
      ctx.fillText(`↑ ${above.join(" · ")}: above this scale`, f.gutter + 6, top + 2);
    }
    return {f};
  };

  // ------------------------------------------------------------------ queue
  FT.drawQueue = function (canvas, s, view, now) {
    const st = strip(canvas, view);
    const {ctx, f, top, plotH} = st;
    timeAxis(ctx, f, top, top + plotH, "", false);
    const pts = s.stats.filter((p) => p.t >= f.left - 2 && p.t <= f.right + 2);
    let ymax = 4;
    for (const p of pts) ymax = Math.max(ymax, p.queue, p.running);
    const y = (v) => top + plotH - (v / ymax) * plotH;
    const series = (key, fill, stroke) => {
      if (!pts.length) return;
      ctx.beginPath();
      ctx.moveTo(Math.max(f.gutter, f.x(pts[0].t)), y(0));
      let prev = y(0);
      for (const p of pts) {
        const xx = Math.max(f.gutter, Math.min(f.gutter + f.pw, f.x(p.t)));
        ctx.lineTo(xx, prev); prev = y(p[key]); ctx.lineTo(xx, prev);
      }
      const xe = Math.min(f.gutter + f.pw, f.x(view.paused ? f.right : now));
      ctx.lineTo(xe, prev);
      if (fill) { ctx.lineTo(xe, y(0)); ctx.closePath(); ctx.fillStyle = fill; ctx.fill(); }
      else { ctx.strokeStyle = stroke; ctx.lineWidth = 2; ctx.stroke(); }
    };
    series("queue", C.queueFill, null);
    series("running", null, C.running);
    scaleLabels(st, String(ymax));
    return {f};
  };
})();
