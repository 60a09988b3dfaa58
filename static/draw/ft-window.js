// First Token: the time window the timeline and the strips under it share (`view`: its span, its
// right edge, paused or not). Live, it shows the last `view.liveSpan` seconds (20) up to the
// engine's clock. Left to itself it fits the latest run of requests
// instead, so that what a person just started fills the strip: a lone request (a newcomer's first
// prompt, 0.8 s, was a 15-px sliver of the 20-s window, and a reloaded page showed the request
// panel's newest request beside an empty timeline), or a lesson's requests while its banner talks
// about them (they scrolled out of the 20-s window about 8 s after they ended). It gives the live
// window back once load runs: the load generator on, or a run longer than MAX_FIT_S. Zooming a
// fitted window pauses it where it is (ft-canvases.js); the Live button lets it fit again.

const GAP_S = 2;         // requests further apart than this (one's end to the next's arrival) are two runs
const MIN_S = 0.25;      // the narrowest fitted window (the tiny test model answers in ~70 ms)
const MAX_FIT_S = 120;   // a longer run is load, shown by the live window
const PAD = 0.04;        // a fitted run's margin at each end, as a share of the window
const LIVE_LEAD = 0.03;  // the live window's room after now, as a share of it

// The latest run of requests, {start, end, ids, live} (engine time; `live`: one still runs, and
// `end` is now), or null: the newest request and every earlier one chained to it by overlapping or
// following within GAP_S, and during a lesson (`lesson`: {t, last}, when it was applied and its last timed burst)
// also every request its bursts sent, with the lesson's own start (a cold start's load begins there).
export function latestRun(s, now, lesson) {
  const ids = [];
  let start = Infinity, end = -Infinity, live = false;
  const sent = (r) => lesson && r.arrival >= lesson.t && r.arrival <= lesson.last + GAP_S;
  for (let i = s.order.length - 1; i >= 0; i--) {
    const r = s.reqs.get(s.order[i]);
    if (!r) continue;
    // a finished request's run lasts until its last token arrived here: behind a buffering proxy
    // a short answer's tokens all arrive after its end, and a window ending there drew none of them
    const until = r.end === null ? now : Math.max(r.end, lastArrival(r));
    if (ids.length && until < start - GAP_S && !sent(r)) break;
    ids.push(r.id);
    start = Math.min(start, r.arrival, sent(r) ? lesson.t : Infinity);
    end = Math.max(end, until);
    live = live || r.end === null;
  }
  return ids.length ? {start, end, ids, live} : null;
}

const lastArrival = (r) => r.arrivals.reduce((m, a) => (a === null ? m : Math.max(m, a)), -Infinity);

// Where the window is for this frame (a paused one stays where it was). Sets view.span and
// view.right, and view.fitted: the run it fits, or null for the live window.
export function place(view, s, now, lesson) {
  if (view.paused) return;
  const run = s.settings.load ? null : latestRun(s, now, lesson);
  if (!run || run.end - run.start > MAX_FIT_S) {
    view.fitted = null;
    view.span = view.liveSpan;
    view.right = now + view.span * LIVE_LEAD;
    return;
  }
  view.fitted = run;
  view.span = Math.max(MIN_S, (run.end - run.start) / (1 - 2 * PAD));
  // a run still going grows from the left; a finished one shorter than the window sits in its middle
  view.right = run.live ? run.start - PAD * view.span + view.span : (run.start + run.end + view.span) / 2;
}

// The span's label beside the zoom buttons, and its tooltip.
export function label(view) {
  const secs = `${+view.span.toFixed(view.span < 10 ? 1 : 0)} s`;
  if (!view.fitted) return {text: secs, title: view.paused ? "paused" : `the last ${secs}, live`};
  const n = view.fitted.ids.length;
  return {text: `${secs}, fitted`, title: `fitted to the latest ${n > 1 ? `run of ${n} requests` : "request"} ` +
    `(the live window, the last ${+view.liveSpan.toFixed(1)} s, comes back once load runs)`};
}
