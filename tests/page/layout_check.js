// Injected by the browser layout tests (tests/page/test_layout_browser.py): what a person would see
// wrong on this screen, read from the page's own boxes. Returns
//   {strips: [{id, h}], overlaps: [[a, b]], clipped: [what], small: [what], labels: {...}}
// - strips: every visible canvas and plotly chart with its CSS height;
// - overlaps: pairs of visible text boxes (DOM text and chart SVG text) that intersect;
// - clipped: text cut off by an ancestor that hides overflow, or past the side of a panel that
//   scrolls (nobody scrolls one sideways), or by a page that cannot scroll;
// - small: visible key text under the minimum size (12 CSS px; presenter mode 18 on screen).
// The canvases report their own text (timeline rows, strip scales) through firstToken.layout().
(() => {
  const TOL = 1;   // px of touching allowed between boxes
  const visible = (el) => {
    if (!el.getClientRects().length) return false;
    for (let e = el; e; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.visibility === "hidden" || cs.display === "none" || +cs.opacity === 0) return false;
    }
    return true;
  };
  const name = (el) => {
    const id = el.id || (el.closest("[id]") && el.closest("[id]").id) || "";
    return `${el.tagName.toLowerCase()}${id ? "#" + id : ""}:"${(el.textContent || "").trim().slice(0, 40)}"`;
  };
  const hit = (a, b) => a.left < b.right - TOL && b.left < a.right - TOL && a.top < b.bottom - TOL && b.top < a.bottom - TOL;
  // CSS zoom (presenter mode) scales what is drawn: sizes below are on-screen CSS px.
  const zoomOf = (el) => { let z = 1; for (let e = el; e; e = e.parentElement) z *= +getComputedStyle(e).zoom || 1; return z; };

  // The part of the window an element's text can show: inside the element itself when it scrolls
  // its overflow (a <pre class="out"> with a max-height), and inside every ancestor that does.
  function shownPart(el) {
    let v = {left: 0, top: -Infinity, right: innerWidth, bottom: Infinity};
    for (let e = el; e && e !== document.body; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (!["auto", "scroll"].includes(cs.overflowY) && !["auto", "scroll"].includes(cs.overflowX)) continue;
      const c = e.getBoundingClientRect();
      v = {left: Math.max(v.left, c.left), top: Math.max(v.top, c.top), right: Math.min(v.right, c.right), bottom: Math.min(v.bottom, c.bottom)};
    }
    return v;
  }
  function cut(r, v) {
    const left = Math.max(r.left, v.left), right = Math.min(r.right, v.right);
    const top = Math.max(r.top, v.top), bottom = Math.min(r.bottom, v.bottom);
    return right - left >= 1 && bottom - top >= 1 ? {left, right, top, bottom, width: right - left, height: bottom - top} : null;
  }

  // Text boxes: one per DOM element holding its own text (its direct text nodes' extent).
  const boxes = [];
  const sideways = [];   // every visible text's whole boxes, scrolled into view or not (below)
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Map();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.textContent.trim()) continue;
    const el = n.parentElement;
    if (!el || el.closest("script, style, #tip, option, select, textarea") || !visible(el)) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    const view = shownPart(el);
    sideways.push({el, rects: [...range.getClientRects()]});
    for (const whole of range.getClientRects()) {
      const r = cut(whole, view);   // the part not scrolled out of a scrolling panel
      if (!r) continue;
      if (!seen.has(el)) { seen.set(el, boxes.length); boxes.push({el, rects: []}); }
      boxes[seen.get(el)].rects.push(r);
    }
  }
  // Charts' SVG text (plotly: tick labels, titles, legends, annotations).
  for (const t of document.querySelectorAll(".js-plotly-plot svg text")) {
    if (!t.textContent.trim() || !visible(t)) continue;
    const r = t.getBoundingClientRect();
    if (r.width >= 1 && r.height >= 1) boxes.push({el: t, rects: [r], svg: t.closest(".js-plotly-plot")});
  }

  const related = (a, b) => a.contains(b) || b.contains(a);
  const overlaps = [];
  for (let i = 0; i < boxes.length; i++) {
    for (let j = i + 1; j < boxes.length; j++) {
      const A = boxes[i], B = boxes[j];
      if (related(A.el, B.el)) continue;
      // only text that shares a stacking layer can cover each other: a fixed sheet covers the page on purpose
      const layer = (e) => e.closest(".sheet, .help, .tip, .cr-panel") || document.body;
      if (layer(A.el) !== layer(B.el)) continue;
      if (A.rects.some((a) => B.rects.some((b) => hit(a, b)))) overlaps.push([name(A.el), name(B.el)]);
    }
  }

  // Clipped: a text box outside an ancestor whose overflow is hidden/clip, or outside the
  // viewport when the document cannot scroll that way.
  const clipped = [];
  const docScrollsY = () => {
    const cs = getComputedStyle(document.body), hs = getComputedStyle(document.documentElement);
    return ![cs.overflowY, hs.overflowY].includes("hidden") || document.scrollingElement.scrollHeight <= innerHeight;
  };
  const canScrollY = docScrollsY();
  for (const b of boxes) {
    const r = b.rects.reduce((u, x) => ({left: Math.min(u.left, x.left), right: Math.max(u.right, x.right),
                                         top: Math.min(u.top, x.top), bottom: Math.max(u.bottom, x.bottom)}));
    let cut = null;
    if (b.svg) {
      const s = b.svg.getBoundingClientRect();
      if (r.left < s.left - TOL || r.right > s.right + TOL || r.top < s.top - TOL || r.bottom > s.bottom + TOL) cut = "its chart";
    }
    for (let e = b.el.parentElement; e && !cut && e !== document.body; e = e.parentElement) {
      const cs = getComputedStyle(e);
      const hidesX = ["hidden", "clip"].includes(cs.overflowX), hidesY = ["hidden", "clip"].includes(cs.overflowY);
      if (!hidesX && !hidesY) continue;
      const c = e.getBoundingClientRect();
      if ((hidesX && (r.left < c.left - TOL || r.right > c.right + TOL)) ||
          (hidesY && (r.top < c.top - TOL || r.bottom > c.bottom + TOL))) cut = name(e);
    }
    if (!cut && (r.right > innerWidth + TOL || r.left < -TOL)) cut = "the window's width";
    if (!cut && !canScrollY && r.bottom > innerHeight + TOL) cut = "the window's height";
    // text-overflow: ellipsis on the element itself
    const el = b.el;
    if (!cut && !b.svg && el.scrollWidth > el.clientWidth + TOL && getComputedStyle(el).overflowX !== "visible"
        && getComputedStyle(el).overflowX !== "auto") cut = "itself";
    if (cut) clipped.push(`${name(b.el)} by ${cut}`);
  }

  // Past the side of a panel that scrolls up and down, in view or scrolled out of it: nobody
  // scrolls such a panel sideways ("100 ms/to", "0 = greed" in the controls).
  for (const {el, rects} of sideways) {
    for (let e = el.parentElement; e && e !== document.body; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (!["auto", "scroll"].includes(cs.overflowX) || e.scrollWidth <= e.clientWidth + TOL) continue;
      const c = e.getBoundingClientRect();
      if (rects.some((w) => w.right > c.right + TOL || w.left < c.left - TOL)) {
        clipped.push(`${name(el)} by ${name(e)}'s width (it scrolls sideways)`);
        break;
      }
    }
  }

  // Type size: key text (not the footer's fine print) at least 12 px, 18 in presenter mode.
  const present = document.body.classList.contains("present");
  const min = present ? 18 : 12;
  const small = [];
  for (const b of boxes) {
    if (b.el.closest("#foot, .foot, .tip, .legend, .muted, .note, .tid, .applies, .rp-credit, .key, .prompt-text")) continue;
    const px = parseFloat(getComputedStyle(b.el).fontSize) * zoomOf(b.el);
    if (px < min - 0.5) small.push(`${name(b.el)} ${px.toFixed(1)}px`);
  }

  const strips = [];
  for (const el of document.querySelectorAll("canvas, .chart")) {
    if (!visible(el)) continue;
    strips.push({id: el.id, h: el.getBoundingClientRect().height / 1, css: el.clientHeight});
  }
  const labels = window.firstToken && firstToken.layout ? firstToken.layout() : null;
  return {strips, overlaps, clipped, small, labels, present, scrollH: document.scrollingElement.scrollHeight,
          innerH: innerHeight, innerW: innerWidth};
})();
