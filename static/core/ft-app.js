// First Token: the live page's boot module. It holds the shared state and wires the parts:
// the connection (ft-connection.js) feeds events into the state (ft-state.js), the
// controls (ft-controls.js) send settings, and the views draw on their own cadence:
// canvases once per animation frame (ft-canvases.js), DOM panels at 4 Hz (ft-panels.js) and
// plotly charts at 2 Hz (ft-charts.js), so a busy engine costs the page the same per
// second however many events it sends. Every event reaches the state through `show`: live
// ones via the replay module's log (ft-replay.js), which also plays traces and slow motion.
//
// This file is the composition root: the shared objects (the state, the view, the UI state, the
// perf counters, the timeline with the features' layers, the dispatch of event reactions) are
// made here and passed to each part as arguments where it is called (`page` for the canvases
// and panels, `feed` for the replay); the lessons wire their buttons with them once, in init.
// A part imports the functions it calls from the modules that own them; the list of imports at
// the top of a file is everything it may touch.
import * as busy from "ft/busy";
import * as candidates from "ft/candidates";
import * as canvases from "ft/canvases";
import * as charts from "ft/charts";
import * as classroom from "ft/classroom";
import * as compare from "ft/compare";
import * as connection from "ft/connection";
import * as controls from "ft/controls";
import {timelineLayers as deliveryLayers} from "ft/delivery";
import {timelineLayers as disaggLayers} from "ft/disagg";
import * as diagnosis from "ft/diagnose";
import * as measure from "ft/measure";
import * as panels from "ft/panels";
import * as present from "ft/present";
import * as replay from "ft/replay";
import * as server from "ft/server";
import {timelineLayers as speculationLayers} from "ft/speculate";
import {createDispatch, createState, ingest} from "ft/state";
import {timelineLayers as sloLayers} from "ft/targets";
import * as teach from "ft/teach";
import {createTimeline} from "ft/timeline";
import * as tour from "ft/tour";
import * as weights from "ft/weights";
import {$, toast} from "ft/util";

const embed = document.body.classList.contains("embed");
const s = createState();
const view = {span: 20, liveSpan: 20, right: 0, paused: false, fitted: null};   // the strips' time window (ft-window.js)
const ui = {selected: null, awaitOwn: false, layouts: {}, dirtyDom: true};
const perf = {frames: 0, fps: 0, drawMs: 0, windowStart: performance.now(), framesInWindow: 0,
              bytesInWindow: 0, bytesPerS: 0};
const select = (id) => { ui.selected = id; ui.dirtyDom = true; };
// The timeline and what the features draw on it: speculation's guesses, the SLO marks, the
// way out and model loads, observe mode's client waits (each feature's timelineLayers). At one
// stage layers draw in this order: the guesses on the lane under the first-shape outlines, the SLO
// marks under the arrival marks. Disaggregated (protocol 13): the instances and the KV transfers.
const timeline = createTimeline();
for (const layer of [...speculationLayers, ...sloLayers, ...deliveryLayers, ...server.timelineLayers, ...disaggLayers,
                     ...candidates.timelineLayers]) timeline.addLayer(layer);
// The canvases' clock: the replay's virtual one while it plays, else the live engine's.
const engineNow = () => (replay.active() ? replay.now() : connection.engineNow(s));
// What the canvases and the panels read and write (ft-canvases.js draw and wire, ft-panels.js update).
// `lesson()`: the lesson running, whose requests the window fits (ft-teach.js lessonSpan).
const page = {s, view, ui, perf, select, engineNow, timeline, lesson: () => teach.lessonSpan(s)};

panels.wire(s);
// What the replay plays to (ft-replay.js): the state it resets in place, the UI state, and `show`.
const feed = {s, ui, show};
// Teaching: presets, banner and an embed's ?preset= (ft-teach.js); on the full page also the
// diagnosis, tour, measure, compare and presenter mode.
const lessons = embed ? [] : [diagnosis, tour, measure, compare];
if (!embed) {   // their buttons and sheets
  tour.init(s, ui); measure.init({s}); compare.init({s}); present.init(s, ui, feed);
}

// What the page does on an event besides folding it into the state: teaching first (a URL's
// preset goes out before its settings), then the lessons, then the page's own reactions.
const dispatch = createDispatch(s);
dispatch.on(teach.reactions(embed));
dispatch.on(candidates.reactions(connection.send, () => !replay.active()));   // asks for candidates (`view`)
teach.beforeApply((name) => { if (!replay.active()) candidates.lessonStarts(name, connection.send); });
if (!embed) for (const table of [tour.reactions(ui), measure.reactions, compare.reactions]) dispatch.on(table);
dispatch.on({
  hello(ev) {
    ui.selected = null; panels.showModel(s, ev);
    if (!replay.active()) { controls.onHello(s, embed); classroom.onHello(ev, embed); }   // a trace's page controls nothing
  },
  error(ev) {
    if (ev.fatal) stopped(ev);
    else toast(`server: ${ev.field ? ev.field + ": " : ""}${ev.message}`);
  },
  request(ev) { if (ev.source === "page" && ui.awaitOwn) { ui.awaitOwn = false; ui.selected = ev.id; } },
  settings() { if (!replay.active()) controls.onSettings(s, embed); },
  dropped(ev) { toast(`this page fell behind: the server dropped ${ev.count} events for it`); },
});

function show(events, at) {
  for (const ev of events) {
    ingest(s, ev, at);
    dispatch.emit(ev);
  }
  ui.dirtyDom = true;
}

// The engine stopped (or the model failed to load): say so where the connection state is
// shown, and keep saying it; /healthz answers 503 with the same reason.
function stopped(ev) {
  connection.setConn("failed", "engine stopped");
  $("conn").title = ev.message;
  toast(ev.message);
}

// Frames per second and websocket bytes per second, over windows of about a second.
function countFrame(ts) {
  perf.frames++; perf.framesInWindow++;
  if (ts - perf.windowStart < 1000) return;
  const dt = (ts - perf.windowStart) / 1000;
  perf.fps = perf.framesInWindow / dt;
  perf.bytesPerS = perf.bytesInWindow / dt;
  perf.framesInWindow = 0; perf.bytesInWindow = 0; perf.windowStart = ts;
}

// The panels and figures written, then the header's row fitted to them (in that order: a fit
// before the figures' new text left the widest one clipped until the next tick).
function updateDom() {
  panels.update(page); server.update(s, engineNow()); teach.update(page, lessons, embed); weights.update(s); classroom.update(); busy.update(s);
  if (!embed) present.update();
}

let lastDom = 0, lastCharts = 0;
function loop(ts) {
  countFrame(ts);
  const t0 = performance.now();
  canvases.draw(page);
  perf.drawMs = 0.9 * perf.drawMs + 0.1 * (performance.now() - t0);   // smoothed script time per frame
  if (ts - lastDom >= 250) {
    lastDom = ts; updateDom();
  }
  if (ts - lastCharts >= 500) { lastCharts = ts; charts.update(s); }
  requestAnimationFrame(loop);
}

// Everything drawn now, not at its next tick: what a test reads is then the state's.
function refresh() {
  canvases.draw(page); updateDom(); charts.update(s);
}

// For tests, benchmarks and the console.
// layout(): what the canvases wrote and where (the layout tests read it; text on a canvas has no DOM box).
// sloMarks: each finished request's met/missed mark on the timeline, as drawn; server: observe mode's lanes.
const layout = () => ({timeline: ui.layouts.timeline ? ui.layouts.timeline.labels : [],
                       sloMarks: ui.layouts.timeline ? ui.layouts.timeline.slo : [],
                       server: ui.layouts.server ? ui.layouts.server.lanes.map(({id, label, y, h}) => ({id, label, y, h})) : [],
                       kvNote: ui.layouts.kv ? ui.layouts.kv.note : null,   // the KV strip's "↑ budget …: above this scale"
                       older: ui.layouts.timeline ? ui.layouts.timeline.older : null,   // "+N older rows", above the rows
                       // disaggregated: the transfers drawn on the rows and the two lanes of forwards
                       transfers: ui.layouts.timeline ? ui.layouts.timeline.transfers || [] : [],
                       transferLinks: ui.layouts.timeline ? ui.layouts.timeline.transferLinks || [] : [],
                       stepLanes: ui.layouts.timeline ? ui.layouts.timeline.stepLanes || null : null,
                       // the uncertain tokens marked on the rows (ft-candidates.js)
                       unsure: ui.layouts.timeline ? ui.layouts.timeline.unsure || [] : []});
window.firstToken = Object.assign({state: s, view, ui, clock: connection.clock, perf, send: connection.send,
                                   select, refresh, layout}, replay.api(feed));
// `firstToken.traceCharts = true`: each plotly draw is named on the console (ft-charts.js trace).
Object.defineProperty(window.firstToken, "traceCharts", {set: (on) => { charts.trace.on = !!on; }, get: () => charts.trace.on});
controls.wire(s, ui, embed);
candidates.wire(connection.send);
classroom.wire();
canvases.wire(page);
replay.wire(feed);
if (!replay.start(feed)) connection.connect({s, perf, onEvents: (events, at) => replay.logLive(feed, events, at)});   // a trace given with the page: no connection at all
requestAnimationFrame(loop);
