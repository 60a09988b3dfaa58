// Injected by the tour tests (tests/page/test_solo_tour_browser.py, test_presenter_tour_browser.py):
// what a person sees of a tour step, judged by what is drawn on top at each point
// (document.elementFromPoint), not by boxes meeting the window. Returns
//   {w, h, header: {top, bottom, rows}, text: {box, seen, points, covers}, spots: [{what, box, seenPx, allPx (seenPx were all of it uncovered), inHeader}]}
// - text: the explanation (#lesson-text): its box, how many of its sampled points show it (the
//   lesson banner is on top there, inside the window, below the header) of how many, and what
//   covers the others;
// - spots: each part the step outlines (headings aside: they go with their part), with the
//   height in px of the rows of it that show it: a row counts where most of its samples are
//   inside the window, below the header, outside the explanation's banner and hit the part
//   itself (not the empty-state card over the timeline, nor anything else on top);
// - header: its box, and how many rows of figures it has (their distinct tops).
(() => {
  const STEP = 4, COLS = 7, INSET = 3;
  const rect = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
  const name = (e) => e ? `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""}${e.className && typeof e.className === "string" ? "." + e.className.split(" ")[0] : ""}` : "nothing";
  const head = document.querySelector("header.top"), hb = rect(head);
  const headBottom = Math.max(0, hb.bottom);   // (a phone's header scrolls away)
  const lesson = document.getElementById("lesson"), textEl = document.getElementById("lesson-text");
  const shown = (e) => e && !e.hidden && e.getClientRects().length;
  const lb = shown(lesson) ? rect(lesson) : null;
  const xs = (b) => Array.from({length: COLS}, (_, i) => b.left + INSET + (i + 0.5) * (b.right - b.left - 2 * INSET) / COLS);
  const onScreen = (x, y) => x >= 0 && x < innerWidth && y >= 0 && y < innerHeight;

  // the explanation: every sample shows the banner (inside the window, below the header)
  let text = null;
  if (shown(lesson) && shown(textEl)) {
    const b = rect(textEl), covers = new Set();
    let seen = 0, points = 0;
    for (let y = b.top + INSET; y <= b.bottom - INSET; y += STEP) {
      for (const x of xs(b)) {
        points++;
        const hit = onScreen(x, y) && y >= headBottom ? document.elementFromPoint(x, y) : null;
        if (hit && lesson.contains(hit)) seen++;
        else covers.add(onScreen(x, y) ? (y < headBottom ? "the header" : name(hit)) : "off the window");
      }
    }
    text = {box: b, seen, points, covers: [...covers]};
  }

  const spots = [...document.querySelectorAll(".spot")].filter((e) => e.getClientRects().length)
    .filter((e) => !e.matches("h2, h3, .strip-head")).map((e) => {
      const b = rect(e), inHeader = !!e.closest("header.top");
      const covers = new Set();
      let rows = 0, all = 0;
      for (let y = b.top + INSET; y <= b.bottom - INSET; y += STEP) {
        all++;
        let ok = 0;
        for (const x of xs(b)) {
          const free = onScreen(x, y) && (inHeader || y >= headBottom) &&
            !(lb && x >= lb.left && x <= lb.right && y >= lb.top && y <= lb.bottom);
          const hit = free ? document.elementFromPoint(x, y) : null;
          if (hit && e.contains(hit) && !hit.closest(".start")) ok++;
          else if (onScreen(x, y)) covers.add(free ? name(hit) : "the header or the banner");
        }
        if (ok * 2 > COLS) rows++;
      }
      return {what: e.id || e.className, box: b, seenPx: rows * STEP, allPx: all * STEP, inHeader,
              covers: [...covers].slice(0, 4)};
    });
  const figs = [...head.querySelectorAll(".fig")].filter((f) => f.getClientRects().length);
  const rows = new Set(figs.map((f) => Math.round(f.getBoundingClientRect().top))).size;
  return {w: innerWidth, h: innerHeight, header: {top: hb.top, bottom: hb.bottom, rows,
          right: Math.max(0, ...figs.map((f) => f.getBoundingClientRect().right))}, text, spots};
})();
