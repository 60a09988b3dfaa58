// First Token: the KV block grid. Every block of the paged KV cache (hello.cache_blocks) is a
// small square in block-number order: a running request's blocks in its colour and blocks
// held by more than one request (a shared prompt prefix) outlined, from the latest
// stats.block_tables; free blocks empty. Which free blocks still hold a cached prefix the
// engine counts (stats.cache_blocks_cached) but does not name, so only the text says it.
import {fitCanvas} from "ft/canvas";
import {palette as P, alpha, reqColor} from "ft/palette";

const C = {bg: P.panel2, free: alpha(P.overlay, 0.07), shared: P.text, muted: P.muted,
           inst: {prefill: P.instPrefill, decode: P.instDecode}};
const LABEL_H = 16;   // disaggregated: each instance's name over its half
const PAD = 4;
let drawn = null;   // what the canvas shows: {last, epoch, size, layout}; unchanged frames cost nothing

// Who holds each block: Map block -> [{id, index}] (index: its place in that request's table).
function holders(tables) {
  const by = new Map();
  for (const [id, blocks] of Object.entries(tables || {})) {
    blocks.forEach((b, index) => {
      if (!by.has(b)) by.set(b, []);
      by.get(b).push({id, index});
    });
  }
  return by;
}

// Square cells, as large as fit n of them in w × h.
function geometry(w, h, n) {
  let cell = Math.max(1, Math.floor(Math.sqrt((w * h) / n)));
  while (cell > 1 && Math.floor(w / cell) * Math.floor(h / cell) < n) cell--;
  return {cell, cols: Math.max(1, Math.floor(w / cell)), gap: cell >= 5 ? 1 : 0};
}

function drawCell(ctx, g, b, held, ox = 0, oy = 0) {
  const x = ox + PAD + (b % g.cols) * g.cell, y = oy + PAD + Math.floor(b / g.cols) * g.cell, size = g.cell - g.gap;
  if (!held) { ctx.fillStyle = C.free; ctx.fillRect(x, y, size, size); return; }
  ctx.fillStyle = reqColor(held[0].id);
  ctx.fillRect(x, y, size, size);
  if (held.length < 2) return;
  ctx.strokeStyle = C.shared;
  const lw = size >= 7 ? 2 : 1;
  ctx.lineWidth = lw;
  ctx.strokeRect(x + lw / 2, y + lw / 2, size - lw, size - lw);
}

// Disaggregated (hello.instances): the prefill instance's blocks on the left, the decode
// instance's on the right, each under its name, from each instance's own stats.
function drawInstances(ctx, s, w, h) {
  const parts = [], half = Math.floor(w / 2);
  ["prefill", "decode"].forEach((name, i) => {
    const ox = i * half, n = s.instances[name] ? s.instances[name].cache_blocks : 0;
    const last = name === "prefill" ? s.prefill.last : s.last;
    ctx.fillStyle = C.inst[name]; ctx.fillRect(ox + PAD, 3, 3, LABEL_H - 6);
    ctx.fillStyle = C.muted; ctx.font = "12px system-ui, sans-serif"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
    ctx.fillText(`${name} instance`, ox + PAD + 7, LABEL_H / 2);
    const bw = half - PAD * (i ? 2 : 3), bh = h - LABEL_H - 2 * PAD;
    if (!n || bw < 2 || bh < 2) return;
    const g = geometry(bw, bh, n), held = holders(last && last.block_tables);
    for (let b = 0; b < n; b++) drawCell(ctx, g, b, held.get(b), ox, LABEL_H);
    parts.push({name, ox, oy: LABEL_H, w: half, g, n, held});
  });
  return {parts};
}

export function drawBlocks(canvas, s) {
  const {ctx, w, h} = fitCanvas(canvas);
  const n = s.hello && s.hello.cache_blocks;
  const size = `${canvas.width}x${canvas.height}`;
  const P = s.instances ? s.prefill.last : null;
  if (drawn && drawn.last === s.last && drawn.p === P && drawn.epoch === s.epoch && drawn.size === size) return drawn.layout;
  ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
  let layout = null;
  if (s.instances && w > 4 * PAD && h > LABEL_H + 2 * PAD) layout = drawInstances(ctx, s, w, h);
  else if (n && w > 2 * PAD && h > 2 * PAD) {
    const g = geometry(w - 2 * PAD, h - 2 * PAD, n);
    const held = holders(s.last && s.last.block_tables);
    for (let b = 0; b < n; b++) drawCell(ctx, g, b, held.get(b));
    layout = {g, n, held};
  }
  drawn = {last: s.last, p: P, epoch: s.epoch, size, layout};
  return layout;
}

// The block under (x, y) and who holds it, or null.
export function hitBlocks(layout, x, y) {
  if (!layout) return null;
  if (layout.parts) {   // disaggregated: the instance's half under x
    const part = layout.parts.find((p) => x >= p.ox && x < p.ox + p.w);
    const hit = part && hitBlocks(part, x - part.ox, y - part.oy);
    return hit && Object.assign(hit, {instance: part.name});
  }
  const {cell, cols} = layout.g;
  const col = Math.floor((x - PAD) / cell), row = Math.floor((y - PAD) / cell);
  const b = row * cols + col;
  if (col < 0 || col >= cols || row < 0 || b >= layout.n) return null;
  return {block: b, held: layout.held.get(b) || []};
}
