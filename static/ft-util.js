// First Token: small helpers every view shares. The palette (read once from ft.css),
// number formatting, building DOM nodes with text only, and the footer toast.
"use strict";
(function () {
  const FT = (window.FT = window.FT || {});

  // ------------------------------------------------------------ palette
  // Each colour is defined once, as a `--c-<name>` custom property in ft.css; canvas and
  // plotly code read FT.palette.<camelName>. Read once: the stylesheet precedes the scripts.
  const PALETTE = ["bg", "panel2", "text", "text2", "muted", "accent", "bad", "overlay", "queue", "tokenize",
                   "prefill", "first", "delivery", "other", "decode", "decode-alt", "tick", "api"];
  const css = getComputedStyle(document.documentElement);
  FT.palette = {};
  for (const name of PALETTE) {
    const value = css.getPropertyValue(`--c-${name}`).trim();
    if (!/^#[0-9a-f]{6}$/i.test(value)) throw new Error(`ft.css: --c-${name} should be a #rrggbb colour, got "${value}"`);
    FT.palette[name.replace(/-(\w)/g, (_, c) => c.toUpperCase())] = value;
  }

  // A palette colour made translucent: alpha("#4aa3ff", 0.28) -> "rgba(74,163,255,0.28)".
  FT.alpha = function (hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
  };
  FT.palette.grid = FT.alpha(FT.palette.overlay, 0.07);   // grid lines, canvases and charts alike

  // The TTFT stages as `finished.stages` names them, with their labels; a stage's colour is
  // --c-<key> (first_sample: --c-first), in the accounting bar and the stages chart alike.
  FT.STAGES = [["queue", "queue"], ["tokenize", "tokenise"], ["prefill", "prefill"],
               ["first_sample", "first sample"], ["delivery", "delivery (server)"], ["other", "other"]];
  FT.stageColor = (key) => FT.palette[key === "first_sample" ? "first" : key];

  // ------------------------------------------------------------ formatting
  FT.fmtS = function (v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a >= 10) return `${v.toFixed(1)} s`;
    if (a >= 1) return `${v.toFixed(2)} s`;
    if (a >= 0.01) return `${(v * 1000).toFixed(0)} ms`;
    return `${(v * 1000).toFixed(1)} ms`;
  };

  FT.fmtBytes = function (b) {
    if (b >= 1e9) return `${(b / 1e9).toFixed(2)} GB`;
    if (b >= 1e6) return `${(b / 1e6).toFixed(1)} MB`;
    if (b >= 1e3) return `${(b / 1e3).toFixed(1)} kB`;
    return `${b} B`;
  };

  FT.fmtTokens = function (n) {
    return n >= 10000 ? `${(n / 1000).toFixed(n >= 100000 ? 0 : 1)}k tok` : `${n} tok`;
  };

  // ------------------------------------------------------------ DOM
  FT.$ = (id) => document.getElementById(id);

  FT.el = function (tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;   // never innerHTML: prompts and outputs are untrusted
    return e;
  };

  let toastTimer = null;
  FT.toast = function (msg) {
    const t = FT.$("toast");
    t.textContent = msg;
    t.classList.add("show");
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => t.classList.remove("show"), 6000);
  };
})();
