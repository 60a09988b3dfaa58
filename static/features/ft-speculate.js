// First Token: speculative decoding on the page (issue 20), from the events alone (protocol 10).
// Each `step.spec` says, per request, how many guesses a forward verified and how many of them
// the model kept; each `token.spec` whether a token was one of those accepted guesses; each
// `finished` a request's drafts, guesses and accepted guesses. ft-state.js keeps them (a
// forward's `spec` and `out`, the tokens that followed it; a request's `specRuns`, `tokenSpec`
// and `specFinal`). Here: the figures (acceptance rate = accepted / guesses and mean acceptance
// length = 1 + accepted / drafts, vLLM's; tokens out per forward), the guesses drawn on the
// timeline's rows and lane, and the request panel's line. The headline, the lessons, the
// diagnosis and the comparison read these; it writes no DOM (pure functions and canvas drawing).
import {palette as P, alpha} from "ft/palette";
import {rect} from "ft/timeline";
import {fmtS} from "ft/util";

export const WINDOW_S = 30;   // the headline's window: goodput's (engine/timing/stats.py), the other figure over events

const C = {accepted: P.spec, rejected: P.bad, rejectedFill: alpha(P.bad, 0.85)};

// Counts over forwards: the forwards and the tokens they gave out, the positions they computed,
// and their drafts (a request verifying guesses in a forward), guesses and accepted guesses.
export function tally(steps, keep = () => true) {
  const c = {forwards: 0, out: 0, positions: 0, drafts: 0, proposed: 0, accepted: 0};
  for (const st of steps) {
    if (st.kind === "release" || !keep(st)) continue;
    c.forwards++; c.out += st.out; c.positions += st.tokens;
    for (const id in st.spec || {}) {
      c.drafts++; c.proposed += st.spec[id].proposed; c.accepted += st.spec[id].accepted;
    }
  }
  return c;
}

// Acceptance rate and mean acceptance length; null without a draft.
export const rates = (c) => (c.drafts ? {rate: c.accepted / c.proposed, length: 1 + c.accepted / c.drafts} : null);
export const pct = (x) => `${Math.round(x * 100)}%`;

// The forwards of the last WINDOW_S seconds (since a reset, if later: it empties the steps).
export function recent(s) {
  const from = s.latestT - WINDOW_S, steps = [];
  for (let i = s.steps.length - 1; i >= 0 && s.steps[i].end >= from; i--) steps.push(s.steps[i]);
  return tally(steps);
}

// Whether the page should speak of speculation: the setting is on, or guesses were verified.
export const speculating = (s, c) => (!!s.settings.speculation && s.settings.speculation !== "off") || c.drafts > 0;

// One request's counts: the engine's at its finish, else summed from the steps this page saw.
export function requestCounts(r) {
  const f = r.specFinal;
  if (f && r.end !== null) return {drafts: f.drafts, proposed: f.draftTokens, accepted: f.accepted, final: true};
  const c = {drafts: 0, proposed: 0, accepted: 0, final: false};
  for (const run of r.specRuns) {
    if (run.proposed === null) continue;
    c.drafts++; c.proposed += run.proposed; c.accepted += run.accepted;
  }
  return c;
}

// The request panel's line, or null when it verified no guesses.
export function requestLine(r) {
  const c = requestCounts(r), x = rates(c);
  if (!x) return null;
  return `speculative decoding: ${c.accepted} of ${c.proposed} guesses accepted (${pct(x.rate)}) in ${c.drafts} ` +
    `forward${c.drafts === 1 ? "" : "s"} · mean acceptance length ${x.length.toFixed(2)} tokens per forward ` +
    (c.final ? "(engine, at its finish)" : "(so far, from its steps)");
}

// A forward's hover line: what it gave out from what it computed, and its guesses; null without any.
export function stepLine(st) {
  const c = tally([st]);
  if (!c.drafts) return null;
  return `${st.out} token${st.out === 1 ? "" : "s"} out from ${st.tokens} positions computed · guesses: ` +
    `${c.proposed} verified, ${c.accepted} accepted, ${c.proposed - c.accepted} rejected`;
}

// ------------------------------------------------------------------ the timeline
// Tokens out per forward over the forwards in view, when any of them verified guesses (the
// lane's label and hover say it then); null otherwise.
function perForward(steps, i0, f) {
  const c = tally(steps.slice(i0).filter((st) => st.start <= f.right));
  return c.drafts ? {forwards: c.forwards, out: c.out, mean: c.out / c.forwards} : null;
}

// On the lane of forwards, over each speculating forward's decode part, its guessed positions
// at the foot in proportion to the tokens it computed: accepted, then rejected (the rows'
// colours). Returns perForward over the forwards in view.
function drawLaneGuesses({ctx, f, s, i0, lane}) {
  const steps = s.steps;
  for (let i = i0; i < steps.length && steps[i].start <= f.right; i++) {
    const st = steps[i];
    if (st.kind === "release" || !st.tokens || !st.spec) continue;   // most forwards: nothing to count
    const c = tally([st]);
    const ah = (lane.h * c.accepted) / st.tokens, rh = (lane.h * (c.proposed - c.accepted)) / st.tokens;
    ctx.fillStyle = C.accepted;
    rect(ctx, f, st.start, st.end, lane.y + lane.h - ah - rh, ah);
    ctx.fillStyle = C.rejected;
    rect(ctx, f, st.start, st.end, lane.y + lane.h - rh, rh);
  }
  return perForward(steps, i0, f);
}

// On each request's row, over each forward in which it verified guesses, a column at the bar's
// foot: one filled cell per accepted guess (a token of its own: its `token.spec` said so), then
// one hollow cell per rejected guess (proposed − accepted, as the `step` said), all cells one
// height in view so that a column's height counts guesses. Narrow columns fill the cells
// without gaps (rejected filled, nearly opaque). Returns the marks drawn, {id, t, accepted, rejected}.
function drawGuesses({ctx, f, g}) {
  const marks = [];
  const inView = (run) => run.end >= f.left && run.start <= f.right;
  let most = 1;
  for (const r of g.reqs) for (const run of r.specRuns) if (inView(run)) most = Math.max(most, run.proposed ?? run.tokens);
  const cell = g.barH / most;
  for (const r of g.reqs) {
    if (!r.specRuns.length) continue;
    const foot = g.barY(r) + g.barH;
    for (const run of r.specRuns) {
      if (!inView(run)) continue;
      const x0 = Math.max(f.gutter, f.x(run.start)), w = Math.max(2, Math.min(f.gutter + f.pw, f.x(run.end)) - x0);
      const rejected = run.proposed === null ? 0 : run.proposed - run.accepted;
      const top = foot - run.tokens * cell;
      if (w >= 4 && cell >= 4) {
        ctx.fillStyle = C.accepted;
        for (let k = 1; k <= run.tokens; k++) ctx.fillRect(x0 + 0.5, foot - k * cell + 0.5, w - 1, cell - 1);
        ctx.strokeStyle = C.rejected; ctx.lineWidth = 1;
        for (let k = 1; k <= rejected; k++) ctx.strokeRect(x0 + 1, top - k * cell + 1, w - 2, cell - 2);
      } else {
        ctx.fillStyle = C.accepted; ctx.fillRect(x0, top, w, run.tokens * cell);
        ctx.fillStyle = C.rejectedFill; ctx.fillRect(x0, top - rejected * cell, w, rejected * cell);
      }
      marks.push({id: r.id, t: run.end, accepted: run.tokens, rejected});
    }
  }
  return marks;
}

// The timeline's layers (ft-timeline.js createTimeline): the guesses on the lane of forwards
// (`perFwd`, the lane's label while forwards in view verified guesses) and on the rows
// (`guesses`: the marks drawn).
export const timelineLayers = [
  {name: "perFwd", at: "lane", draw: drawLaneGuesses, laneLabel: (perFwd) => perFwd && `${perFwd.mean.toFixed(1)} tok/fwd`},
  {name: "guesses", at: "steps", draw: drawGuesses},
];

// The lesson banner's figure for both presets, over the forwards since the preset (t0): guesses
// accepted, tokens out per forward, and `throughput` (ft-figures.js) of the requests finished since.
export function lessonFigure(s, t0, throughput) {
  const c = tally(s.steps, (st) => st.start >= t0), x = rates(c);
  if (!c.forwards) return null;
  // (no guesses yet with speculation on: say so, not "off": the prompt's forward comes first)
  const on = s.settings.speculation && s.settings.speculation !== "off";
  const guessed = x ? `${c.accepted} of ${c.proposed} guesses accepted (${pct(x.rate)}), ${x.length.toFixed(1)} tokens per ` +
    "speculating forward" : on ? `speculation ${s.settings.speculation}: no guesses verified yet` : "speculation off: no guesses";
  return `${guessed} · ${(c.out / c.forwards).toFixed(1)} tokens out per forward` +
    (throughput ? ` · ${throughput.tps.toFixed(1)} tokens/s over ${throughput.n} finished (${fmtS(throughput.span)})` : "");
}
