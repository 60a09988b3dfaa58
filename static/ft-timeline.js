// First Token: the time-axis views drawn on <canvas> (timeline, KV cache, queue).
// They share one `view` (visible span and right edge, live or paused) so the three
// strips line up: a request queueing in the timeline sits over the queue rising
// below it, and over the KV cache that was full at that moment.
"use strict";
(function () {
  const FT = (window.FT = window.FT || {});

  const C = {
    bg: "#0e141b", grid: "rgba(255,255,255,0.07)", axis: "#8b98a5", text: "#dbe4ee", muted: "#7d8a97",
    tokenize: "#b083f0", queue: "#f2a93b", prefill: "#4aa3ff", prefillWait: "rgba(74,163,255,0.28)",
    firstSample: "#ff6b9a", decodeA: "#27b5a9", decodeB: "#1c8c83", decodeIdle: "rgba(39,181,169,0.16)",
    tick: "#f4f8fb", rejected: "#ff5a5a", select: "rgba(255,255,255,0.10)", now: "#ffd166",
    bandDecode: "rgba(255,255,255,0.035)", bandPrefill: "rgba(74,163,255,0.10)",
    capacity: "#ff5a5a", budget: "#ffd166", reserved: "#e6edf3", running: "#27b5a9",
  };
  FT.COLORS = C;

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
    ctx.fillStyle = C.axis; ctx.font = font; ctx.textAlign = "center"; ctx.textBaseline = "top";
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
  FT.drawTimeline = function (canvas, s, view, now, opts) {
    const {ctx, w, h} = FT.fitCanvas(canvas);
    const compact = w < 700;
    const f = frame(w, view, compact);
    const axisH = compact ? 16 : 24;
    const top = 4, plotH = h - axisH - top;
    ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);

    // Rows: requests alive somewhere in the window, oldest on top; the newest that fit.
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
    const barY = (i) => top + i * rowH + (rowH - barH) / 2;

    // Background bands: one per model forward, so a batch reads as a column shared by its rows,
    // and a prefill (blue) visibly stalls everybody's decoding.
    const steps = s.steps;
    const i0 = firstStepFrom(steps, f.left);
    for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
      const st = steps[i];
      if (st.kind === "release" || (st.kind === "decode" && st.n % 2)) continue;
      ctx.fillStyle = st.kind === "prefill" ? C.bandPrefill : C.bandDecode;
      rect(ctx, f, st.start, st.end, top, plotH);
    }
    timeAxis(ctx, f, top, top + plotH, `${compact ? 10 : 13}px system-ui, sans-serif`, true);

    if (opts.selected && rowOf.has(opts.selected)) {
      ctx.fillStyle = C.select;
      ctx.fillRect(0, top + rowOf.get(opts.selected) * rowH, w, rowH);
    }

    // Stage segments, one colour per pass (fewer canvas state changes).
    ctx.fillStyle = C.tokenize;
    shown.forEach((r, i) => { if (r.tokStart !== null) rect(ctx, f, r.tokStart, r.tokEnd, barY(i), barH); });
    ctx.fillStyle = C.queue;
    shown.forEach((r, i) => {
      if (r.rejected) return;
      const from = r.tokEnd !== null ? r.tokEnd : r.arrival;
      const to = r.prefills.length ? r.prefills[0].start : (r.end !== null ? r.end : now);
      rect(ctx, f, from, to, barY(i), barH);
    });
    // Admission (got a slot and KV blocks): the queue stage goes on until its prefill starts.
    ctx.fillStyle = C.tick;
    shown.forEach((r, i) => {
      if (r.admitted !== null && r.admitted >= f.left && r.admitted <= f.right) ctx.fillRect(f.x(r.admitted) - 0.5, barY(i), 1, barH);
    });
    ctx.fillStyle = C.prefillWait;
    shown.forEach((r, i) => {
      const p = r.prefills;
      if (p.length) rect(ctx, f, p[0].start, r.first !== null ? r.first : (r.end !== null ? r.end : now), barY(i), barH);
    });
    ctx.fillStyle = C.prefill;
    shown.forEach((r, i) => { for (const p of r.prefills) rect(ctx, f, p.start, p.end, barY(i), barH); });
    ctx.fillStyle = C.decodeIdle;
    shown.forEach((r, i) => { if (r.first !== null) rect(ctx, f, r.first, r.end !== null ? r.end : now, barY(i), barH); });
    for (const [color, parity] of [[C.decodeA, 0], [C.decodeB, 1]]) {
      ctx.fillStyle = color;
      for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
        const st = steps[i];
        if (st.kind !== "decode" || st.n % 2 !== parity) continue;
        for (const id of st.ids) {
          const row = rowOf.get(id);
          if (row !== undefined) rect(ctx, f, st.start, st.end, barY(row), barH);
        }
      }
    }
    ctx.fillStyle = C.rejected;
    shown.forEach((r, i) => { if (r.rejected) rect(ctx, f, r.arrival, Math.max(r.end, r.arrival + view.span / 200), barY(i), barH); });

    // A tick per token, the first one taller and in the first-sample colour.
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

    // Row labels when there is room to read them.
    if (rowH >= 11) {
      ctx.font = `${Math.min(compact ? 11 : 15, rowH - 2)}px ui-monospace, monospace`;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      shown.forEach((r, i) => {
        ctx.fillStyle = r.source === "page" ? C.now : r.source === "api" ? "#7fd3ff" : C.muted;
        ctx.fillText(r.id, f.gutter - 6, top + i * rowH + rowH / 2);
      });
    }
    if (!view.paused) {
      ctx.strokeStyle = C.now; ctx.lineWidth = 1.5;
      const x = Math.round(f.x(now)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + plotH); ctx.stroke();
    }
    if (rows.length > shown.length) {
      ctx.fillStyle = C.muted; ctx.textAlign = "left"; ctx.textBaseline = "top";
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillText(`+${rows.length - shown.length} older rows`, f.gutter + 4, top + 2);
    }
    return {f, shown, rowH, top, i0};
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
    return {ctx, w, h, compact, f: frame(w, view, compact), top, plotH: h - top - 4};
  }

  // ------------------------------------------------------------------ KV cache
  // Filled KV entries after every forward, stacked per request in the request's colour,
  // against the reserved blocks, the live budget and the physical capacity.
  FT.drawKV = function (canvas, s, view, now) {
    const {ctx, w, h, compact, f, top, plotH} = strip(canvas, view);
    if (!s.hello) return {f};
    const bs = s.hello.block_size;
    const capacity = s.hello.cache_blocks * bs;
    const steps = s.steps;
    const i0 = firstStepFrom(steps, f.left);
    // Scale to what is in view (a few requests hold little of a big cache); the budget and
    // capacity lines are drawn when they fall inside the scale and named when above it.
    let peak = 0;
    for (let i = Math.max(0, i0 - 1); i < steps.length && steps[i].end <= f.right; i++) {
      peak = Math.max(peak, steps[i].blocksUsed * bs, steps[i].cacheTokens);
    }
    let budget = s.last ? s.last.cache_blocks * bs : capacity;
    for (const st of s.stats) if (st.t >= f.left && st.t <= f.right) budget = Math.min(budget, st.blocks * bs);
    const want = Math.max(peak * 1.3, 64);
    const ymax = budget <= want * 2 ? Math.max(want, budget * 1.05) : want;
    const y = (tok) => top + plotH - (Math.min(tok, ymax) / ymax) * plotH;
    timeAxis(ctx, f, top, top + plotH, "", false);
    for (let i = Math.max(0, i0 - 1); i < steps.length && steps[i].end <= f.right; i++) {
      const st = steps[i];
      const until = i + 1 < steps.length ? steps[i + 1].end : now;
      let acc = 0;
      for (const [id, n] of st.stack) {
        ctx.fillStyle = FT.reqColor(id);
        const y0 = y(acc), y1 = y(acc + n);
        rect(ctx, f, st.end, until, y1, Math.max(1, y0 - y1));
        acc += n;
      }
    }
    // Reserved blocks (what admission counts) as a step line.
    ctx.strokeStyle = C.reserved; ctx.lineWidth = 1.5; ctx.setLineDash([5, 4]);
    ctx.beginPath();
    let started = false;
    for (let i = Math.max(0, i0 - 1); i < steps.length && steps[i].end <= f.right; i++) {
      const x0 = Math.max(f.gutter, f.x(steps[i].end));
      const x1 = Math.min(f.gutter + f.pw, f.x(i + 1 < steps.length ? steps[i + 1].end : now));
      const yy = y(steps[i].blocksUsed * bs);
      if (!started) { ctx.moveTo(x0, yy); started = true; } else ctx.lineTo(x0, yy);
      ctx.lineTo(x1, yy);
    }
    ctx.stroke(); ctx.setLineDash([]);
    // Budget (the cache-budget setting, from stats) and the physical capacity.
    ctx.strokeStyle = C.budget; ctx.lineWidth = 2;
    ctx.beginPath();
    started = false;
    for (const st of s.stats) {
      if (st.t < f.left - 5 || st.t > f.right) continue;
      const xx = Math.max(f.gutter, f.x(st.t)), yy = y(st.blocks * bs);
      if (!started) { ctx.moveTo(xx, yy); started = true; } else ctx.lineTo(xx, yy);
    }
    if (started && budget <= ymax) { ctx.lineTo(f.gutter + f.pw, y((s.last ? s.last.cache_blocks : 0) * bs)); ctx.stroke(); }
    if (capacity <= ymax) {
      ctx.strokeStyle = C.capacity; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(f.gutter, y(capacity) + 1); ctx.lineTo(f.gutter + f.pw, y(capacity) + 1); ctx.stroke();
    }
    ctx.fillStyle = C.axis; ctx.font = `${compact ? 10 : 12}px system-ui, sans-serif`;
    ctx.textAlign = "right"; ctx.textBaseline = "top";
    ctx.fillText(FT.fmtTokens(Math.round(ymax)), f.gutter - 6, top);
    const above = [];
    if (budget > ymax) above.push(`budget ${FT.fmtTokens(budget)}`);
    if (capacity > ymax) above.push(`capacity ${FT.fmtTokens(capacity)}`);
    if (above.length) {
      ctx.textAlign = "left"; ctx.fillStyle = C.budget;
      ctx.fillText(`↑ ${above.join(" · ")}: above this scale`, f.gutter + 6, top + 2);
    }
    ctx.textBaseline = "bottom";
    ctx.fillText("0", f.gutter - 6, top + plotH);
    return {f, capacity, top, plotH, i0};
  };

  // ------------------------------------------------------------------ queue
  FT.drawQueue = function (canvas, s, view, now) {
    const {ctx, w, h, compact, f, top, plotH} = strip(canvas, view);
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
    series("queue", "rgba(242,169,59,0.55)", null);
    series("running", null, C.running);
    ctx.fillStyle = C.axis; ctx.font = `${compact ? 10 : 12}px system-ui, sans-serif`;
    ctx.textAlign = "right"; ctx.textBaseline = "top";
    ctx.fillText(String(ymax), f.gutter - 6, top);
    ctx.textBaseline = "bottom";
    ctx.fillText("0", f.gutter - 6, top + plotH);
    return {f, pts};
  };

  FT.fmtTokens = function (n) {
    return n >= 10000 ? `${(n / 1000).toFixed(n >= 100000 ? 0 : 1)}k tok` : `${n} tok`;
  };
})();
