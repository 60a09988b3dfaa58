// First Token: the live page's boot file. It holds the shared state and wires the parts:
// the connection (ft-connection.js) feeds events into the state (ft-state.js), the
// controls (ft-controls.js) send settings, and the views draw on their own cadence:
// canvases once per animation frame (ft-canvases.js), DOM panels at 4 Hz (ft-panels.js) and
// plotly charts at 2 Hz (ft-charts.js), so a busy engine costs the page the same per
// second however many events it sends. Every event reaches the state through `show`: live
// ones via the replay module's log (ft-replay.js), which also plays traces and slow motion.
"use strict";
(function () {
  const FT = window.FT;

  const app = {
    embed: document.body.classList.contains("embed"),
    s: FT.createState(),
    view: {span: 20, right: 0, paused: false},
    ui: {selected: null, awaitOwn: false, layouts: {}, dirtyDom: true},
    perf: {frames: 0, fps: 0, drawMs: 0, windowStart: performance.now(), framesInWindow: 0,
           bytesInWindow: 0, bytesPerS: 0},
    select(id) { app.ui.selected = id; app.ui.dirtyDom = true; },
  };
  const {s, ui, perf} = app;

  const {connection, controls, panels, charts, canvases, replay, classroom} = FT;
  connection.init(app, replay.logLive);
  // The canvases' clock: the replay's virtual one while it plays, else the live engine's.
  Object.assign(app, {clock: connection.clock, send: connection.send, setConn: connection.setConn,
                      liveNow: connection.engineNow, stopLive: connection.stop, show,
                      engineNow: () => (replay.active() ? replay.now() : connection.engineNow())});
  for (const part of [controls, panels, charts, canvases, replay, classroom]) part.init(app);
  FT.teach.init(app);   // presets, tour, diagnosis, measure, compare, presenter (ft-teach.js)

  function show(events, at) {
    for (const ev of events) {
      FT.ingest(s, ev, at);
      FT.teach.onEvent(ev);   // before the controls: a URL's preset goes out before its settings
      if (ev.type === "hello") {
        ui.selected = null; panels.showModel(ev);
        if (!replay.active()) { controls.onHello(); classroom.onHello(ev); }   // a trace's page controls nothing
      }
      else if (ev.type === "error" && ev.fatal) stopped(ev);
      else if (ev.type === "error") FT.toast(`server: ${ev.field ? ev.field + ": " : ""}${ev.message}`);
      else if (ev.type === "request" && ev.source === "page" && ui.awaitOwn) { ui.awaitOwn = false; ui.selected = ev.id; }
      else if (ev.type === "settings" && !replay.active()) controls.onSettings();
      else if (ev.type === "dropped") FT.toast(`this page fell behind: the server dropped ${ev.count} events for it`);
    }
    ui.dirtyDom = true;
  }

  // The engine stopped (or the model failed to load): say so where the connection state is
  // shown, and keep saying it; /healthz answers 503 with the same reason.
  function stopped(ev) {
    app.setConn("failed", "engine stopped");
    FT.$("conn").title = ev.message;
    FT.toast(ev.message);
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

  let lastDom = 0, lastCharts = 0;
  function loop(ts) {
    countFrame(ts);
    const t0 = performance.now();
    canvases.draw();
    perf.drawMs = 0.9 * perf.drawMs + 0.1 * (performance.now() - t0);   // smoothed script time per frame
    if (ts - lastDom >= 250) { lastDom = ts; panels.update(); FT.teach.update(); }
    if (ts - lastCharts >= 500) { lastCharts = ts; charts.update(); }
    requestAnimationFrame(loop);
  }

  // Everything drawn now, not at its next tick: what a test reads is then the state's.
  function refresh() {
    canvases.draw(); panels.update(); FT.teach.update(); charts.update();
  }

  // For tests, benchmarks and the console.
  // layout(): what the canvases wrote and where (the layout tests read it; text on a canvas has no DOM box).
  const layout = () => ({timeline: ui.layouts.timeline ? ui.layouts.timeline.labels : []});
  window.firstToken = Object.assign({state: s, view: app.view, ui, clock: app.clock, perf, send: app.send,
                                     select: app.select, refresh, layout}, replay.api);
  controls.wire();
  canvases.wire();
  replay.wire();
  if (!replay.start()) connection.connect();   // a trace given with the page: no connection at all
  requestAnimationFrame(loop);
})();
