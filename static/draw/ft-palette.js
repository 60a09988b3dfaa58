// First Token: the page's colours. Each is defined once, as a `--c-<name>` custom property in
// ft.css; canvas and plotly code import `palette.<camelName>` from here. Read when this module
// is first imported: module scripts run after the stylesheets before them have loaded.

const NAMES = ["bg", "panel2", "text", "text2", "muted", "accent", "bad", "overlay", "queue", "tokenize",
               "prefill", "first", "delivery", "other", "load", "decode", "decode-alt", "tick", "api",
               "slo-met", "slo-missed", "spec", "transfer", "inst-prefill", "inst-decode"];

export const palette = {};
const css = getComputedStyle(document.documentElement);
for (const name of NAMES) {
  const value = css.getPropertyValue(`--c-${name}`).trim();
  if (!/^#[0-9a-f]{6}$/i.test(value)) throw new Error(`ft.css: --c-${name} should be a #rrggbb colour, got "${value}"`);
  palette[name.replace(/-(\w)/g, (_, c) => c.toUpperCase())] = value;
}

// A palette colour made translucent: alpha("#4aa3ff", 0.28) -> "rgba(74,163,255,0.28)".
export function alpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
}
palette.grid = alpha(palette.overlay, 0.07);   // grid lines, canvases and charts alike

// The TTFT stages as `finished.stages` names them, with their labels; a stage's colour is
// --c-<key> (first_sample: --c-first), in the accounting bar and the stages chart alike; `load`
// (a cold start: the wait for the model, protocol 9) first, as it comes first; `transfer` (protocol
// 13: its keys and values copied from the prefill instance to the decode instance) after prefill.
// `load` and `transfer` are 0 on most runs (always 0 colocated): OPTIONAL, drawn only when > 0.
export const STAGES = [["load", "model load"], ["queue", "queue"], ["tokenize", "tokenise"], ["prefill", "prefill"],
                       ["transfer", "KV transfer"], ["first_sample", "first sample"], ["delivery", "delivery (server)"],
                       ["other", "other"]];
export const OPTIONAL_STAGES = new Set(["load", "transfer"]);
// The stages drawn for these requests' `finished.stages`: an optional one only where one of them had it.
// (`optional`: the stages to leave out where nobody had them; the stages chart keeps `load` always.)
export const stagesOf = (reqs, optional = OPTIONAL_STAGES) =>
  STAGES.filter(([k]) => !optional.has(k) || reqs.some((r) => r.stages && r.stages[k] > 0));
export const stageColor = (key) => palette[key === "first_sample" ? "first" : key];

// A request's own colour (KV stack, block grid, slot chips): hues spread by the golden angle on
// its number. Cached: the KV chart asks for it for every stacked rectangle of every frame.
const colorCache = new Map();
export function reqColor(id) {
  let c = colorCache.get(id);
  if (!c) {
    if (colorCache.size > 4096) colorCache.clear();
    const n = parseInt(String(id).replace(/\D/g, ""), 10) || 0;
    c = `hsl(${(n * 137.508) % 360}, 62%, 58%)`;
    colorCache.set(id, c);
  }
  return c;
}
