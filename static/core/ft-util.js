// First Token: small helpers every page shares: number formatting, building DOM nodes with
// text only, and the footer toast. (The colours are ft-palette.js.)

// ------------------------------------------------------------ text widths
// About how wide a character of the charts' 13 px text is (legend items, tick labels, axis
// titles): what their margins and short titles are sized by, without laying plotly out twice.
export const CHAR_PX = 7.5;

// ------------------------------------------------------------ formatting
export function fmtS(v) {
  if (v === null || v === undefined || !isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a >= 10) return `${v.toFixed(1)} s`;
  if (a >= 1) return `${v.toFixed(2)} s`;
  if (a >= 0.01) return `${(v * 1000).toFixed(0)} ms`;
  return `${(v * 1000).toFixed(1)} ms`;
}

export function fmtBytes(b) {
  if (b >= 1e9) return `${(b / 1e9).toFixed(2)} GB`;
  if (b >= 1e6) return `${(b / 1e6).toFixed(1)} MB`;
  if (b >= 1e3) return `${(b / 1e3).toFixed(1)} kB`;
  return `${b} B`;
}

export function fmtTokens(n) {
  return n >= 10000 ? `${(n / 1000).toFixed(n >= 100000 ? 0 : 1)}k tok` : `${n} tok`;
}

// "1 token", "2 tokens": a count with its noun, singular or plural.
export const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

// A request's finish reason (`finished.reason`, docs/protocol.md) in plain words; an observed
// server's own reason (another vocabulary) as it said it.
const FINISH = {length: "stopped at the token limit", stop: "finished its answer", stop_string: "stopped at a stop string",
                cancelled: "cancelled", error: "failed with an error", rejected: "refused"};
export const finishText = (reason) => FINISH[reason] || reason || "";

// Who sent a request (`request.source`, docs/protocol.md) in words: "r69 · greedy · load" read like
// a model load, not the load generator's (a lesson's) request.
const SOURCE = {page: "from a page", load: "load generator", api: "OpenAI API", observe: "observe mode's load",
                join: "a student's phone"};
export const sourceText = (source) => SOURCE[source] || source || "";

// What a lesson that samples (a `hello.presets` entry whose questions draw at a temperature over 0:
// the sampling lesson's rows, the priority lesson's batch jobs) owes its reader: its draws are
// seeded, so a rerun gives the same "random" text byte for byte. "" for a lesson that draws nothing.
export function seededText(preset) {
  const drawn = ((preset && preset.actions) || []).filter((a) => a.prompt && a.temperature > 0);
  const n = drawn.reduce((sum, a) => sum + (a.burst || 0), 0);
  if (!n) return "";
  return ` Its ${n === 1 ? "sampled request is" : `${n} sampled requests are`} seeded: each ` +
    "draws the same random numbers every run, so running the lesson again repeats them token for token.";
}

// ------------------------------------------------------------ DOM
export const $ = (id) => document.getElementById(id);

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;   // never innerHTML: prompts and outputs are untrusted
  return e;
}

let toastTimer = null;
export function toast(msg) {
  const t = $("toast");
  t.textContent = msg;
  t.classList.add("show");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => t.classList.remove("show"), 6000);
}
