// First Token: the probabilities each token was chosen from (issue 42, protocol 14), from the
// events alone. Each `token` carries `p` (its probability under the distribution it was drawn from:
// temperature and top-p applied; greedy 1), `p_raw` (under the model's own, temperature 1) and, on
// a page that asked with the `view` message, `top`: the five most likely tokens [id, text, p,
// p_raw]. ft-state.js keeps them per token (`r.odds`). Here: which tokens are uncertain, the bars
// (the model's own probability and the drawn one, the chosen token marked) shown when a token is
// hovered or tapped on a timeline row or in the request's text, the marks on the rows and in the
// text, the request panel's line and the sampling lesson's figure. A page asks for them (`view`)
// only while they are used: the sampling lesson runs, or its reader turns them on (the checkbox
// over the output, off at first). They are not free: five candidates a token double what a page
// receives (bench/candidates.py: 44 -> 88 kB/s at 1,000 tokens/s, the budget 50), and the engine
// computes the odds only while a page shows them or a request asks (~8 % of a batch-1 step here).
import {fmtS} from "ft/util";

export const UNSURE = 0.3;     // a token the model itself gave under 30 % is marked uncertain
const NEAR_PX = 5;             // a token tick is hovered within this many pixels of the pointer (and alone there)

export const unsure = (o) => !!o && typeof o.raw === "number" && o.raw < UNSURE;
// A probability as a percentage to one decimal; one under 0.1 % (but not 0) as "< 0.1 %" (it read
// "0.0 %", as if the model had ruled the token out), its exact value (3 significant digits, as
// sent) from `exactPct`, which the hover box and a tap add.
const tiny = (x) => typeof x === "number" && x > 0 && x < 0.001;
export const pct = (x) => (x === null || x === undefined ? "—" : tiny(x) ? "< 0.1 %" : `${(100 * x).toFixed(1)} %`);
export const exactPct = (x) => `${Number((100 * x).toPrecision(3))} %`;
// The exact values of those of `xs` that `pct` shows as "< 0.1 %": " (exactly 0.0412 %)", or "".
export const exactly = (...xs) => (xs.some(tiny) ? ` (exactly ${xs.filter(tiny).map(exactPct).join(" and ")})` : "");
// A token's text as a chip shows it: spaces as ·, newlines as ⏎, nothing as ∅.
export const shown = (text) => (text || "").replace(/ /g, "·").replace(/\n/g, "⏎") || "∅";

// ------------------------------------------------------------------ what this page asks for
// `choice`: the reader's own (the checkbox), null until they touch it; `lesson`: the sampling
// lesson runs (a preset event; on the page that starts it, before its preset is sent, so its
// first tokens carry odds too), and every page watching sees the bars it is about. `pending`: the
// lesson this page has just started, until its preset event comes back: a preset event before it
// is an older lesson's still on its way (the stream runs behind on a busy machine), which must not
// switch the view back to that lesson's.
const LESSON = "sampling";
const view = {choice: null, lesson: false, sent: null, pending: null};

export const wanted = () => (view.choice !== null ? view.choice : view.lesson);

// Tell the server what this page shows, when it changed or on a new connection (`force`).
export function sync(send, force = false) {
  const want = wanted();
  if (!force && view.sent === want) return;
  if (send({type: "view", candidates: want})) view.sent = want;
  const box = document.getElementById("cand-on");
  if (box) box.checked = want;
}

// What it does on events: a new connection is told again; a lesson may switch a viewer's on. An
// error ends the wait for this page's own lesson (the server may have refused it).
export const reactions = (send, live) => ({
  hello() { view.sent = null; view.pending = null; if (live()) sync(send, true); },
  preset(ev) {
    if (view.pending !== null && ev.name !== view.pending) return;
    view.pending = null;
    lessonIs(ev.name, live() ? send : null);
  },
  error() { view.pending = null; },
});

// This page starts lesson `name` (ft-teach.js beforeApply, before its preset is sent), so the
// sampling lesson's first tokens carry their candidates too.
export function lessonStarts(name, send) {
  view.pending = name;
  lessonIs(name, send);
}

// Lesson `name` runs. The server is told unless there is none to tell (`send` null: a replay).
function lessonIs(name, send) {
  view.lesson = name === LESSON;
  if (send) sync(send);
}

// The checkbox over the request's output: the reader's own choice.
export function wire(send) {
  const box = document.getElementById("cand-on");
  if (!box) return;
  box.addEventListener("change", () => { view.choice = box.checked; sync(send); });
}

// ------------------------------------------------------------------ a request's figures
export function counts(r) {
  let known = 0, low = 0, top = 0;
  r.odds.forEach((o, i) => {
    if (!o) return;
    known++;
    if (unsure(o)) low++;
    if (o.top && o.top.length && o.top[0][0] !== null && o.top[0][0] === r.tokenIds[i]) top++;
  });
  return {known, low, top};
}

// The request panel's and the row's hover line; null when its tokens carry no odds.
export function requestLine(r) {
  const c = counts(r);
  if (!c.known) return wanted() ? null : "tick “candidates” for each token's probabilities (sent to this page only while ticked)";
  return `${c.low} of ${c.known} token${c.known === 1 ? "" : "s"} uncertain (the model gave them under ` +
    `${Math.round(UNSURE * 100)} %) · hover a token (in the output, or its tick: zoom in where ticks crowd) for its candidates`;
}

// ------------------------------------------------------------------ the bars
// One token's candidates as bars: each the model's own probability (temperature 1), the part it
// was drawn with over it, the chosen one marked; a chosen token outside the five listed, and a
// rejected guess (speculation), under them.
export function bars(s, r, i) {
  const o = r.odds[i], el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const box = el("div", "cand");
  box.dataset.req = r.id; box.dataset.index = String(i);
  const chosenText = r.text[i], id = r.tokenIds[i];
  box.append(el("div", "cand-head", `${r.label || r.id} · token ${i + 1} “${shown(chosenText)}”`));
  if (!o) { box.append(el("div", "cand-note", "no probabilities for this token (not sent by its server)")); return box; }
  box.append(el("div", "cand-sub", `chosen with ${pct(o.p)} as drawn · the model's own ${pct(o.raw)}` +
                                   exactly(o.p, o.raw) + (unsure(o) ? " · uncertain" : "")));
  const row = (text, p, raw, chosen) => {
    const line = el("div", `cand-row${chosen ? " chosen" : ""}`);
    const bar = el("span", "cand-bar");
    const own = el("i", "own"), drawn = el("i", "drawn");
    own.style.width = `${Math.max(0, Math.min(1, raw)) * 100}%`;
    drawn.style.width = p === null ? "0" : `${Math.max(0, Math.min(1, p)) * 100}%`;
    bar.append(own, drawn);
    line.append(el("span", "cand-mark", chosen ? "✓" : ""), el("span", "cand-text", shown(text)), bar,
                el("span", "cand-pct", p === null ? pct(raw) : `${pct(raw)} → ${pct(p)}`));
    return line;
  };
  if (o.top) {
    let listed = false;
    for (const [cid, text, p, raw] of o.top) {
      const chosen = cid !== null ? cid === id : text === chosenText;
      listed = listed || chosen;
      box.append(row(text, p, raw, chosen));
    }
    if (!listed) box.append(el("div", "cand-gap", "…"), row(chosenText, o.p, o.raw, true));
  } else box.append(el("div", "cand-note", "candidates not sent to this page (tick “candidates” over the output)"));
  if (o.rejected) {
    const [, text, p, raw] = o.rejected;
    box.append(el("div", "cand-note", `it replaced the guess “${shown(text)}”: the model's own ${pct(raw)}, ` +
                                      `kept with ${pct(p)} as drawn, so rejected`));
  }
  if (i === 0 && r.stages && typeof r.stages.first_sample === "number") {
    box.append(el("div", "cand-note", `choosing it was the TTFT's “first sample” stage: ${fmtS(r.stages.first_sample)} (measured)`));
  }
  box.append(el("div", "cand-legend", "bar: the model's own probability (temperature 1) · darker: as drawn (its temperature, top-p)"));
  return box;
}

// The floating box the bars show in; `owner`: who showed it ("text", "timeline"), so one's leave
// does not hide the other's.
let pop = null, popOwner = null, popKey = "";
export function show(s, r, i, x, y, owner) {
  if (!pop) {
    pop = document.createElement("div");
    pop.id = "cand-pop";
    pop.className = "cand-pop";
    pop.hidden = true;
    document.body.append(pop);
  }
  const key = `${r.id}:${i}:${r.odds.length}:${r.stages ? 1 : 0}`;
  if (key !== popKey) { pop.replaceChildren(bars(s, r, i)); popKey = key; }
  popOwner = owner;
  pop.hidden = false;
  // in window pixels (x, y are), then in the body's (presenter mode zooms it)
  const z = parseFloat(getComputedStyle(document.body).zoom) || 1, w = pop.offsetWidth * z, h = pop.offsetHeight * z;
  const left = Math.max(4, Math.min(window.innerWidth - w - 6, x + 14));
  const top = Math.max(4, y + 14 + h > window.innerHeight ? y - h - 10 : y + 14);
  pop.style.left = `${left / z}px`;
  pop.style.top = `${top / z}px`;
}

export function hide(owner) {
  if (pop && (!owner || owner === popOwner)) { pop.hidden = true; popOwner = null; }
}

// ------------------------------------------------------------------ the request's text
// The output as one span per token, an uncertain one marked; hovering or tapping one shows its bars.
let textKey = "";
export function renderText(box, r, epoch) {
  const key = `${epoch}:${r.id}:${r.text.length}:${r.odds.filter(Boolean).length}`;
  if (key === textKey && box.childElementCount) return;
  textKey = key;
  box.replaceChildren(...r.text.map((text, i) => {
    const span = document.createElement("span");
    span.className = unsure(r.odds[i]) ? "tok-out unsure" : "tok-out";
    span.dataset.i = String(i);
    span.textContent = text;
    return span;
  }));
  box.dataset.req = r.id;
}

// The text box's hover and tap (it names its request: renderText).
export function wireText(box, s) {
  if (!box) return;
  const at = (e) => {
    const span = e.target.closest && e.target.closest(".tok-out");
    const r = span && s.reqs.get(box.dataset.req);
    if (!r) return;
    const rect = span.getBoundingClientRect();
    show(s, r, Number(span.dataset.i), rect.left, rect.bottom - 10, "text");
  };
  box.addEventListener("mouseover", at);
  box.addEventListener("click", at);       // a tap on a phone or tablet
  box.addEventListener("mouseleave", () => hide("text"));
}

// ------------------------------------------------------------------ the timeline
// The token tick under the pointer on a request's row, {req, index}, when it carries odds and no
// other tick is as near (where they are denser the row's read-out shows, and says to zoom in); else null.
export function hit(layout, s, x, y) {
  if (!layout || y < layout.top) return null;
  const lane = layout.lanes[Math.floor((y - layout.top) / layout.rowH)];
  if (!lane) return null;
  let best = null, near = 0;
  for (const r of lane.reqs) {
    for (let k = 0; k < r.tokens.length; k++) {
      const d = Math.abs(layout.f.x(r.tokens[k]) - x);
      if (d > NEAR_PX) continue;
      near++;
      if (!best || d < best.d) best = {req: r, index: k, d};
    }
  }
  return best && near === 1 && best.req.odds[best.index] ? {req: best.req, index: best.index} : null;
}

// A layer (ft-timeline.js): a small mark over the tick of each uncertain token; returns them.
const unsureColor = () => getComputedStyle(document.documentElement).getPropertyValue("--c-unsure").trim() || "#f0b429";
function drawUnsure({ctx, f, g}) {
  const marks = [];
  ctx.fillStyle = unsureColor();
  for (const r of g.reqs) {
    const y = g.barY(r);
    for (let k = 0; k < r.tokens.length; k++) {
      const t = r.tokens[k];
      if (t < f.left || t > f.right || !unsure(r.odds[k])) continue;
      const x = f.x(t);
      ctx.fillRect(x - 2, y - 3, 4, 3);
      marks.push({id: r.id, index: k, x, y});
    }
  }
  return marks;
}
export const timelineLayers = [{name: "unsure", at: "marks", draw: drawUnsure}];

// ------------------------------------------------------------------ the sampling lesson
// Its figure, over the lesson's rows since t0: how often each took the top bar, how tall the bar
// it drew from was against the model's own, and the first sampling, a measured stage of TTFT.
export function proof(s, t0) {
  const rows = [];
  for (const id of s.order) {
    const r = s.reqs.get(id);
    if (r.arrival < t0 || !r.label || !r.odds.some((o) => o && o.top)) continue;
    const with_ = r.odds.filter((o) => o && o.top && o.top.length);
    const mean = (f) => with_.reduce((a, o) => a + f(o), 0) / with_.length;
    rows.push({r, c: counts(r), drawn: mean((o) => o.top[0][2] ?? o.top[0][3]), own: mean((o) => o.top[0][3])});
  }
  if (!rows.length) return null;
  const took = rows.map(({r, c, drawn, own}) => `${r.label} ${c.top}/${c.known}` +
    (r.label === "greedy" ? "" : ` (${Math.round(drawn * 100)}/${Math.round(own * 100)} %)`)).join(" · ");
  const first = rows.find(({r}) => r.stages);
  return `took the top bar (its height as drawn / the model's own): ${took}` +
    (first ? ` · first sample ${fmtS(first.r.stages.first_sample)} of TTFT ${fmtS(first.r.ttft)}` : "");
}
