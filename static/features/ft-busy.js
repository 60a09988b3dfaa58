// First Token: "this machine is busy". Each decode forward's measured time against the roofline's
// estimate for it (step.predicted_s: its bytes and flops at the memory bandwidth and matmul rate
// the engine measured at start) is a ratio that stays about the same for a forward of any batch
// or length while the machine is as it was. The page keeps the lowest median ratio it has seen
// over WINDOW decode steps (this engine running alone: its own pace), and when the median over
// the latest steps is BUSY times that or more, the machine is busy: something else is using its
// cores (a second engine, a benchmark; two on two cores slow each other ~30-fold). The note says
// so above the timeline, with the measured times; the diagnosis names it as a suspect.
import {percentile} from "ft/state";
import {$, fmtS} from "ft/util";

const WINDOW = 12;      // decode steps per median
const BUSY = 4;         // this many times its quiet pace, or more: busy
const RECENT_S = 5;     // the latest steps: within this many seconds of engine time

// The quietest window's median ratio, the points read so far, and the state's epoch they were
// read in (`s`, the page state, is passed to each function below).
let best = null, seenTo = 0, epoch = -1;

// Decode steps timed and estimated, without guesses (a verifying forward's estimate is its own).
const timed = (pts) => pts.filter((p) => p.predMs > 0 && !p.guesses);
const ratio = (p) => p.ms / p.predMs;

// The quietest window's median ratio so far (updated as points arrive; a new server, a reset of
// the page's state, starts over).
function quiet(s) {
  if (s.epoch !== epoch) { epoch = s.epoch; best = null; seenTo = 0; }
  const pts = timed(s.points);
  if (seenTo > pts.length) seenTo = 0;   // the points were trimmed: read them again
  for (let i = Math.max(WINDOW, seenTo); i <= pts.length; i++) {
    const m = percentile(pts.slice(i - WINDOW, i).map(ratio), 50);
    if (best === null || m < best) best = m;
  }
  seenTo = pts.length;
  return best;
}

// How busy the machine was over engine time [t0, t1]: {factor, ms, usualMs, n}, the decode steps'
// median time there against what the same work took at the quiet pace; null with too few steps
// or no quiet pace known yet. `factor` >= BUSY: busy.
export function pace(s, t0, t1) {
  const q = quiet(s);
  const pts = timed(s.points).filter((p) => p.t >= t0 && p.t <= t1).slice(-WINDOW * 4);
  if (q === null || pts.length < WINDOW / 2) return null;
  const factor = percentile(pts.map(ratio), 50) / q;
  return {factor, ms: percentile(pts.map((p) => p.ms), 50), usualMs: percentile(pts.map((p) => p.predMs * q), 50),
          n: pts.length, busy: factor >= BUSY};
}

export function busyText(p) {
  return `This machine is busy: the engine's decode steps take ${p.factor.toFixed(1)}× as long as its own quiet pace ` +
    `here (median ${fmtS(p.ms / 1000)} over the last ${p.n}, where the same work took ${fmtS(p.usualMs / 1000)}; ` +
    "measured, scaled by the roofline estimate) — another program is likely using its cores.";
}

// A decode-cost sweep (a finished `measure` event) judged the same way: serving pauses while it
// runs, so no steps come then, but each of its decode points has the same ratio (measured ÷ the
// roofline's estimate). Against the quiet pace of the steps seen before (else the sweep's own
// quietest point), its median point, and the steps in the seconds before it began:
// {factor, against: "steps" | "sweep", slow: [its points that took BUSY× the pace or more],
// before: pace() just before it (or null), busy}; null with no point to judge.
export function sweepPace(s, ev) {
  const pts = (ev.decode || []).filter((p) => p.predicted_s > 0 && p.step_s > 0);
  if (!pts.length) return null;
  const r = (p) => p.step_s / p.predicted_s, q = quiet(s), ref = q !== null ? q : Math.min(...pts.map(r));
  const t0 = ev.t - (ev.seconds || 0), before = pace(s, t0 - RECENT_S, t0);
  const factor = percentile(pts.map(r), 50) / ref, slow = pts.filter((p) => r(p) >= BUSY * ref);
  return {factor, against: q !== null ? "steps" : "sweep", slow, before,
          busy: factor >= BUSY || !!(before && before.busy) || slow.length * 4 >= pts.length};
}

// The sweep's warning, in words: null when it ran at the machine's quiet pace.
export function sweepBusyText(p) {
  if (!p || !p.busy) return null;
  const what = p.against === "steps" ? "the engine's own quiet pace (its steps seen here, each against its roofline estimate)"
    : "its own quietest point (each against its roofline estimate; no quiet steps seen here to compare with)";
  const slow = p.slow.map((x) => `batch ${x.batch} × ${x.context}`);
  return `Taken while this machine was busy: ${p.before && p.before.busy ? `just before it, decode steps took ${p.before.factor.toFixed(1)}× ` +
    `the engine's quiet pace; ` : ""}its points ran a median ${p.factor.toFixed(1)}× ${what}` +
    (slow.length ? `, ${slow.length} of them ${BUSY}× or more (${slow.slice(0, 4).join(", ")}${slow.length > 4 ? ", …" : ""})` : "") +
    ". Another program was likely using its cores: these times are not this engine's own; measure again when the machine is quiet.";
}

// For the diagnosis: a sentence when the machine was busy while r was being decoded, else null.
export function busySuspect(s, r) {
  if (r.first === null || r.end === null) return null;
  const p = pace(s, r.first, r.end);
  if (!p || !p.busy) return null;
  return `A suspect beside these: this machine was busy while it ran — decode steps took ${p.factor.toFixed(1)}× ` +
    `the engine's own quiet pace (median ${fmtS(p.ms / 1000)} against ${fmtS(p.usualMs / 1000)}, measured), ` +
    "so another program sharing its cores would explain a slow answer as well as the engine's own stages.";
}

// The 4 Hz tick: the note above the timeline.
export function update(s) {
  const note = $("busy-note");
  if (!note) return;
  const p = s.hello && s.hello.mode !== "observe" ? pace(s, s.latestT - RECENT_S, s.latestT) : null;
  note.hidden = !(p && p.busy);
  if (!note.hidden) note.textContent = busyText(p);
}
