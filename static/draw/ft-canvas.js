// First Token: what every canvas view does first: keep the canvas's backing store at device
// pixels (sharp on a high-DPI screen) and draw in CSS pixels; and the striped fill they share.

// The canvas's 2D context, scaled to CSS pixels, and its size in CSS pixels.
export function fitCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return {ctx, w, h};
}

// A repeated tile of one diagonal stripe (`width` px of `stroke`, over `fill` if given): the
// hatching views draw with. One pattern per canvas context and look, made on first use.
const patterns = new WeakMap();
export function diagonalStripes(ctx, size, stroke, width, fill = null) {
  const key = `${size} ${stroke} ${width} ${fill}`;
  let made = patterns.get(ctx);
  if (!made) patterns.set(ctx, made = new Map());
  if (!made.has(key)) {
    const tile = document.createElement("canvas");
    tile.width = tile.height = size;
    const g = tile.getContext("2d");
    if (fill) { g.fillStyle = fill; g.fillRect(0, 0, size, size); }
    g.strokeStyle = stroke; g.lineWidth = width;
    g.beginPath(); g.moveTo(-1, size + 1); g.lineTo(size + 1, -1); g.stroke();
    made.set(key, ctx.createPattern(tile, "repeat"));
  }
  return made.get(key);
}
