// First Token: the KV block grid. Every block of the paged KV cache (hello.cache_blocks) is a
// small square in block-number order: a running request's blocks in its colour and blocks
// held by more than one request (a shared prompt prefix) outlined, from the latest
// stats.block_tables; free blocks empty. Which free blocks still hold a cached prefix the
// engine counts (stats.cache_blocks_cached) but does not name, so only the text says it.
import {fitCanvas} from "ft/canvas";
import {palette as P, alpha, reqColor} from "ft/palette";

const C = {bg: P.panel2, free: alpha(P.overlay, 0.07), shared: P.text};
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

function drawCell(ctx, g, b, held) {
  const x = PAD + (b % g.cols) * g.cell, y = PAD + Math.floor(b / g.cols) * g.cell, size = g.cell - g.gap;
  if (!held) { ctx.fillStyle = C.free; ctx.fillRect(x, y, size, size); return; }
  ctx.fillStyle = reqColor(held[0].id);
  ctx.fillRect(x, y, size, size);
  if (held.length < 2) return;
  ctx.strokeStyle = C.shared;
  const lw = size >= 7 ? 2 : 1;
  ctx.lineWidth = lw;
  ctx.strokeRect(x + lw / 2, y + lw / 2, size - lw, size - lw);
}

export function drawBlocks(canvas, s) {
  const {ctx, w, h} = fitCanvas(canvas);
  const n = s.hello && s.hello.cache_blocks;
  const size = `${canvas.width}x${canvas.height}`;
  if (drawn && drawn.last === s.last && drawn.epoch === s.epoch && drawn.size === size) return drawn.layout;
  ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
  let layout = null;
  if (n && w > 2 * PAD && h > 2 * PAD) {
    const g = geometry(w - 2 * PAD, h - 2 * PAD, n);
    const held = holders(s.last && s.last.block_tables);
    for (let b = 0; b < n; b++) drawCell(ctx, g, b, held.get(b));
    layout = {g, n, held};
  }
  drawn = {last: s.last, epoch: s.epoch, size, layout};
  return layout;
}

// The block under (x, y) and who holds it, or null.
export function hitBlocks(layout, x, y) {
  if (!layout) return null;
  const {cell, cols} = layout.g;
  const col = Math.floor((x - PAD) / cell), row = Math.floor((y - PAD) / cell);
  const b = row * cols + col;
  if (col < 0 || col >= cols || row < 0 || b >= layout.n) return null;
  return {block: b, held: layout.held.get(b) || []};
}
