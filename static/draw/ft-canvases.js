// First Token: the canvas views on the page. Their shared time window (zoom with the
// buttons or the wheel, pause with the button or space, drag to pan while paused), the
// hover read-outs (measured numbers only), click-to-select on the timeline, and drawing
// the three time strips (ft-timeline.js, ft-strips.js) and the KV block grid (ft-blocks.js)
// once per animation frame.
import {drawBlocks, hitBlocks} from "ft/blocks";
import {hide as hideBars, hit as hitToken, requestLine as oddsLine, show as showBars} from "ft/candidates";
import {firstShapeText} from "ft/delivery";
import {hitTransfer, instanceLines, transferText} from "ft/disagg";
import {describeClient, drawServer, hitServer, observing} from "ft/server";
import {stepLine} from "ft/speculate";
import {traceStart} from "ft/replay";
import {prefillTime} from "ft/state";
import {rooflineText, sloText} from "ft/targets";
import {drawKV, drawQueue} from "ft/strips";
import {hitStep, hitTimeline} from "ft/timeline";
import {$, finishText, fmtBytes, fmtS, plural, sourceText} from "ft/util";
import {stepLine as weightsLine} from "ft/weights";
import {label as windowLabel, place as placeWindow} from "ft/window";

// `wire(page)` and `draw(page)` take the page: {s, view, ui, select, engineNow, timeline}, the
// page state, the shared time window (ft-window.js: span, right edge, paused, fitted), the UI state (selected
// request; the layouts drawn, which hover and click read), `select(id)`, `engineNow()`: the
// time the strips end at (live, or a replay's virtual clock), and the timeline with the
// features' layers (ft-timeline.js createTimeline).
let hover = null;
let tapTimer = null;
const TAP_TIP_MS = 2500;

// ------------------------------------------------------------ hover read-outs
function describeReq(s, r) {
  const lines = [`${r.id} · ${sourceText(r.source)} · ${r.promptTokens ?? "?"} prompt tokens → max ${r.maxNew ?? "?"} new`];
  if (r.rejected) { lines.push(`rejected: ${r.rejected}`); return lines; }
  if (r.tokEnd !== null) lines.push(`tokenise ${fmtS(r.tokEnd - r.tokStart)}`);
  const a = r.admits[0];
  if (a) {
    lines.push(`queued ${fmtS(r.queueS)} → slot ${a.slot}, ${a.blocks} KV blocks at admission` +
               (a.cachedTokens ? ` (${a.cachedTokens} prompt tokens from the prefix cache)` : ""));
  }
  const chunks = r.prefills.filter((p) => !p.recompute).length;
  // disaggregated: its prompt's chunks on the prefill instance, its last position again on the decode instance
  const there = s.instances ? r.prefills.filter((p) => !p.recompute && p.instance !== "prefill") : [];
  const here = chunks - there.length;
  if (chunks) lines.push(`prefill ${fmtS(prefillTime(r))} in ${here} chunk${here !== 1 ? "s" : ""}` + (s.instances ? " on the prefill instance" : "") +
                         (there.length ? `, ${there.reduce((a, p) => a + p.tokens, 0)} position recomputed on the decode instance` : ""));
  lines.push(...instanceLines(s, r));   // disaggregated: its two instances and its KV transfer
  if (r.preempts.length) {
    const again = r.prefills.length - chunks;
    lines.push(`preempted ${r.preempts.length}× · recompute ${fmtS(prefillTime(r, true))} ` +
               `in ${again} chunk${again === 1 ? "" : "s"}`);
  }
  if (r.ttft !== null) lines.push(`TTFT ${fmtS(r.ttft)} · per later token ${fmtS(r.tpot)} (mean) · e2e ${fmtS(r.e2e)}`);
  lines.push(`${plural(r.tokens.length, "token")} out${r.reason ? ` · ${finishText(r.reason)}` : " · running"}`);
  const slo = sloText(r);
  if (slo) lines.push(slo);
  const odds = oddsLine(r);
  if (odds) lines.push(odds);
  return lines;
}

// A forward: what it computed (a speculating one: the tokens it gave out and its guesses), its
// measured time, the roofline's estimate beside it, and whether it was the first of its shape
// since the server started.
function stepText(s, st) {
  const took = fmtS(st.end - st.start), n = st.ids.length;
  const what = st.kind === "decode" ? `decode step ${took} · batch of ${n}` :
    st.kind === "prefill" ? `prefill step ${took} · ${st.prefillTokens} prompt tokens of ${n} request${n > 1 ? "s" : ""}` :
    `mixed step ${took} · ${st.prefillTokens} prompt + ${plural(st.decodeTokens, "decode token")} of ${plural(n, "request")}`;
  const roof = rooflineText(st.end - st.start, st.predicted, st.bound);
  const where = s.instances ? `on the ${st.instance === "prefill" ? "prefill" : "decode"} instance` : null;
  return [what, where, stepLine(st), weightsLine(s, st), roof, st.firstShape && firstShapeText(st, s)].filter(Boolean).join("\n");
}

// The lane of forwards: the one under the pointer, the tokens out per forward in view while
// they speculate (the lane's label), and the step-time target's cap while it is on.
function laneText(s, st, perFwd) {
  const lines = [stepText(s, st)];
  if (perFwd) lines.push(`forwards in view: ${perFwd.out} tokens out from ${perFwd.forwards} forwards = ${perFwd.mean.toFixed(2)} per forward`);
  const cap = s.last && s.last.prefill_cap, target = s.settings.max_step_ms;
  if (target) lines.push(`step-time target ${target} ms: a mixed step now takes at most ${cap ?? "— (not known yet)"} prompt tokens`);
  return lines;
}

// The last item of a time-ordered list at or before t (by `key`), or null.
function lastAtOrBefore(list, key, t) {
  let found = null;
  for (const x of list) { if (x[key] <= t) found = x; else break; }
  return found;
}

// Each returns the tooltip's lines for the pointer at (h.x, h.y) on its canvas, or null.
const HOVER = {
  timeline(s, layouts, h) {
    const st = hitStep(layouts.timeline, s, h.x, h.y);
    if (st) return laneText(s, st, layouts.timeline.perFwd);
    const hit = hitTimeline(layouts.timeline, s, h.x, h.y);
    if (!hit) return null;
    const x = hitTransfer(layouts.timeline, h.x, h.y);   // disaggregated: the transfer under the pointer first
    const xfer = x && s.transfers.find((t) => t.id === x.id && t.start === x.start);
    if (xfer) {
      const first = transferText(xfer);
      return [first, ...describeReq(s, s.reqs.get(xfer.id) || hit.req).filter((l) => l !== first)];
    }
    const lines = observing(s) ? describeClient(s, hit.req) : describeReq(s, hit.req);
    if (hit.step) lines.push(stepText(s, hit.step));
    return lines;
  },
  kv(s, layouts, h) {
    const f = layouts.kv && layouts.kv.f;
    if (!f || !s.hello) return null;
    const steps = s.instances ? s.steps.filter((x) => x.instance !== "prefill") : s.steps;   // the decode instance's cache
    const t = f.t(h.x), st = lastAtOrBefore(steps, "end", t), u = lastAtOrBefore(s.blockUse, "t", t);
    if (!st || !u) return null;
    const bpt = s.hello.kv_bytes_per_token, bs = s.hello.block_size;
    return [`t = ${(t - f.origin).toFixed(2)} s, ${st.kind === "release" ? `after ${st.ids[0]} left` : `after a ${st.kind} step`}`,
            `filled ${plural(st.cacheTokens, "token")} (${fmtBytes(st.cacheTokens * bpt)}) by ${plural(st.stack.length, "request")}`,
            `${plural(u.used, "block")} in use = ${plural(u.used * bs, "token")} (${fmtBytes(u.used * bs * bpt)})`];
  },
  blocks(s, layouts, h) {
    const hit = hitBlocks(layouts.blocks, h.x, h.y);
    if (!hit) return null;
    if (!hit.held.length) return [`${hit.instance ? `${hit.instance} instance ` : ""}block ${hit.block}: free`];
    const bs = s.hello.block_size;
    const who = hit.held.map(({id, index}) => `${id} (its tokens ${index * bs}–${(index + 1) * bs - 1})`);
    const where = hit.instance ? `${hit.instance} instance ` : "";
    return [`${where}block ${hit.block}: ${hit.held.length > 1 ? "shared by " : ""}${who.join(", ")}`];
  },
  server(s, layouts, h) { return hitServer(layouts.server, s, h.x, h.y); },   // observe mode (ft-server.js)
  queue(s, layouts, h) {
    const f = layouts.queue && layouts.queue.f;
    const p = f && lastAtOrBefore(s.stats, "t", f.t(h.x));
    return p ? [`t = ${(p.t - f.origin).toFixed(2)} s`, `${p.queue} waiting · ${p.running} running · ${p.tps.toFixed(1)} tokens/s`] : null;
  },
};

function showTip(lines, hover) {
  const tip = $("tip");
  if (!lines) { tip.hidden = true; return; }
  tip.textContent = lines.join("\n");
  tip.hidden = false;
  const x = Math.min(window.innerWidth - tip.offsetWidth - 8, hover.cx + 14);
  const y = Math.min(window.innerHeight - tip.offsetHeight - 8, hover.cy + 14);
  tip.style.left = `${x}px`; tip.style.top = `${y}px`;
}

// Zooming a window fitted to a run (ft-window.js) pauses it where it is: the person looks closer.
function setSpan(view, span, anchorT) {
  const old = view.span;
  if (view.fitted && !view.paused) setPaused(view, true);
  view.span = Math.min(600, Math.max(view.fitted ? 0.05 : 1, span));
  if (!view.fitted) view.liveSpan = view.span;
  const anchor = anchorT !== undefined ? anchorT : view.right - old / 2;
  if (view.paused) view.right = anchor + (view.right - anchor) * (view.span / old);
  showSpan(view);
}

let spanShown = "";
function showSpan(view) {
  const {text, title} = windowLabel(view), box = $("span-label");
  if (text + title === spanShown) return;
  spanShown = text + title;
  box.textContent = text;
  box.title = title;
}

function setPaused(view, p) {
  view.paused = p;
  $("btn-pause").textContent = p ? "Live" : "Pause";
  $("btn-pause").classList.toggle("primary", p);
}

// While paused, dragging pans the window.
function pan(view, e, f) {
  if (!view.paused) return;
  const startX = e.clientX, startRight = view.right;
  const move = (m) => { view.right = startRight - ((m.clientX - startX) / f.pw) * view.span; };
  const up = () => { window.removeEventListener("pointermove", move); window.removeEventListener("pointerup", up); };
  window.addEventListener("pointermove", move);
  window.addEventListener("pointerup", up);
}

// Every canvas has hover read-outs; the time strips also zoom (wheel) and pan (drag).
function wireCanvas({view, ui}, id) {
  const c = $(id);
  if (!c) return;
  const frameOf = () => ui.layouts[id] && ui.layouts[id].f;
  if (id !== "blocks") {
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const f = frameOf();
      setSpan(view, view.span * (e.deltaY > 0 ? 1.25 : 0.8), f ? f.t(e.offsetX) : undefined);
    }, {passive: false});
    c.addEventListener("pointerdown", (e) => pan(view, e, frameOf()));
  }
  c.addEventListener("mousemove", (e) => { hover = {id, x: e.offsetX, y: e.offsetY, cx: e.clientX, cy: e.clientY}; });
  c.addEventListener("mouseleave", hideTip);
  // A tap (touch) has no "leave": its read-out goes after a moment, or as the page scrolls.
  c.addEventListener("pointerup", (e) => {
    if (e.pointerType !== "mouse") { clearTimeout(tapTimer); tapTimer = setTimeout(hideTip, TAP_TIP_MS); }
  });
}

function hideTip() { hover = null; $("tip").hidden = true; hideBars("timeline"); }

export function wire(page) {
  const {s, view, ui, select} = page;
  window.addEventListener("scroll", hideTip, {passive: true});
  $("btn-zoom-in").addEventListener("click", () => setSpan(view, view.span * 0.8));
  $("btn-zoom-out").addEventListener("click", () => setSpan(view, view.span * 1.25));
  $("btn-pause").addEventListener("click", () => setPaused(view, !view.paused));
  document.addEventListener("keydown", (e) => {
    if (e.code === "Space" && !["TEXTAREA", "INPUT", "BUTTON"].includes(document.activeElement.tagName)) {
      e.preventDefault(); setPaused(view, !view.paused);
    }
  });
  for (const id of Object.keys(HOVER)) wireCanvas(page, id);
  $("timeline").addEventListener("click", (e) => {
    const layout = ui.layouts.timeline;
    const h = layout && hitTimeline(layout, s, e.offsetX, e.offsetY);
    if (h) select(h.req.id);
  });
}

// `lesson`: the lesson running ({t, last}: ft-teach.js lessonSpan) or null, whose requests the window fits.
export function draw({s, view, ui, engineNow, timeline, lesson}) {
  const now = engineNow();
  placeWindow(view, s, now, lesson());
  showSpan(view);
  view.origin = traceStart() ?? (s.connectT || 0);   // the axes count from this page's start (a trace's: its first event)
  ui.layouts.timeline = timeline.draw($("timeline"), s, view, now, {selected: ui.selected});
  // The strips the page has (an /embed shows those its `panels` parameter asked for).
  if ($("kv")) ui.layouts.kv = drawKV($("kv"), s, view, now);
  if ($("queue")) ui.layouts.queue = drawQueue($("queue"), s, view, now);
  if ($("blocks")) ui.layouts.blocks = drawBlocks($("blocks"), s);
  if ($("server") && observing(s)) ui.layouts.server = drawServer($("server"), s, view, now);
  if (!hover) return;
  // a token's tick on a row: its candidates as bars (ft-candidates.js), else the read-out
  const tok = hover.id === "timeline" && hitToken(ui.layouts.timeline, s, hover.x, hover.y);
  if (tok) { $("tip").hidden = true; showBars(s, tok.req, tok.index, hover.cx, hover.cy, "timeline"); return; }
  hideBars("timeline");
  showTip(HOVER[hover.id](s, ui.layouts, hover), hover);
}

