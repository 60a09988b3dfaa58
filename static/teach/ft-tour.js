// First Token: the guided tour for a classroom, along the article's path: tokens → prefill →
// decode → KV cache → batching → queueing → what to look at when it feels slow → speculation →
// the other suspects: a buffering proxy, a slow network, a cold start → choosing a token. Each step
// applies a preset, spots the part of the page that shows the idea (the rest is dimmed) and
// says what to notice, with the live figures inserted (ft-figures.js). Next/back with the
// banner's buttons or ←/→ (ft-present.js); `/?tour=N` opens step N.
import {diagnosis} from "ft/diagnose";
import {median, proofText} from "ft/figures";
import {selectedReq} from "ft/panels";
import {batchingWords} from "ft/relations";
import {pct, rates, recent} from "ft/speculate";
import {dockBottom} from "ft/stage";
import * as teach from "ft/teach";
import {$, fmtBytes, fmtS, seededText, toast} from "ft/util";
import * as weights from "ft/weights";

// The functions that read the page state take it as `s`, and its UI state (the selected
// request) as `ui`; a step's text() and live() take both.
export let index = -1;   // the step shown, -1 when the tour is off
let since = 0;       // engine time the step began (its figures count from the preset after it)
// Whether the person scrolled since the step began: until then the step keeps its parts in view
// as the page moves under them (its preset fills the panels, the banner's live line and the
// legends grow: the timeline drifted off the bottom seconds after it was scrolled to).
let scrolledByHand = false;

const t0 = (name) => (teach.active && teach.active.name === name ? teach.active.t : since);
const live = (s, name) => proofText(name, s, t0(name));

export const STEPS = [
  {key: "tokens", title: "Tokens", preset: "idle", focus: "detail", spot: ["#d-chips"],
   watch: "the prompt's token chips (piece and id) in the request panel",
   text(s, ui) {
     const r = selectedReq(s, ui);
     const n = r && r.promptTokens;
     return "The model never sees text, only token ids. The tokenizer cuts the prompt into pieces and looks each up " +
       "in its vocabulary" + (n ? `: this prompt became ${n} token${n === 1 ? "" : "s"}, in ${fmtS(r.tokEnd - r.tokStart)}.` : ".") +
       " Everything after this — prefill, the KV cache, each step — is counted in tokens.";
   }, live: (s, ui) => { const r = selectedReq(s, ui); return r && r.promptTokens ? `${r.promptTokens} prompt tokens · ${s.hello.vocab} in the vocabulary` : ""; }},
  {key: "prefill", title: "Prefill", preset: "long-document", focus: "timeline", spot: [".timeline-wrap", ".fig:has(#h-ttft50)"],
   watch: "the blue prefill bar on each row, and TTFT",
   text: () => "Before the first token, the model reads the whole prompt in one forward pass: prefill (blue). " +
     "Its cost grows with the prompt's length, so a long document waits longer for its first word.",
   live: (s) => live(s, "long-document")},
  {key: "decode", title: "Decode", preset: "idle", focus: "steps", spot: [".timeline-wrap", "#chart-steps"],
   watch: "one tick per token, and the measured step time against the bandwidth floor",
   text(s) {
     const fl = weights.floorOf(s);   // the copy of the weights read now, and its floor (an estimate)
     return "After the first token each model step adds one token per running request (the ticks). Every step reads " +
       `all the weights (${fl ? weights.mb(fl.bytes) : "?"}${fl && fl.fmt ? `, ${weights.name(s, fl.fmt)}` : ""})` +
       (fl ? `, so it cannot beat ${fmtS(fl.floorS)} (estimate: memory-bandwidth floor)` : "") + ".";
   },
   live(s) {
     const one = s.points.filter((p) => p.batch === 1).map((p) => p.ms);
     return one.length ? `measured: median decode step ${median(one).toFixed(1)} ms at batch 1 (${one.length} steps)` : "";
   }},
  // The same model in two copies (ft-weights.js): the file's 4-bit blocks and their fp32 values.
  {key: "weights", title: "Fewer bytes to read, faster decode", preset: "weights", focus: "steps",
   spot: [".timeline-wrap", "#chart-steps", ".fig:has(#h-weights)"],
   watch: "the request's ticks closing up at the switch, and the step-time chart's two clouds against their floors",
   text(s) {
     const f = weights.formats(s), q = f && f.dequantised, k = f && f.stored;
     if (!k) return "A decode step is bound by reading the weights: fewer bytes, faster steps. This server holds one copy " +
       "of the weights only, so the lesson cannot switch here" + (s.hello.weights && s.hello.weights.why ? ` (${s.hello.weights.why}).` : ".");
     return "A decode step reads every weight once, so its time is bound by bytes, not by arithmetic. The model file " +
       `stores its weights as ${weights.name(s, "stored", "short")} blocks (${weights.mb(k.decode_bytes)} a step); ` +
       `dequantised to ${weights.name(s, "dequantised", "short")} they are ${weights.mb(q.decode_bytes)} — the same numbers. ` +
       "This request reads the fp32 copy first, then, a few seconds in, the blocks: watch its ticks close up.";
   },
   live: (s) => live(s, "weights")},
  {key: "kv", title: "The KV cache", preset: "kv-cache-off", focus: "steps", spot: ["#chart-steps", ".timeline-wrap"],
   watch: "decode step time against sequence length, with the cache off (the chart in the request panel)",
   text: () => "The KV cache keeps each token's keys and values so a step computes only the new token. " +
     "Turned off, every step recomputes the whole sequence: steps get slower as the text gets longer.",
   live: (s) => live(s, "kv-cache-off")},
  {key: "batching", title: "Batching", preset: "many-users", focus: "slots", spot: [".slots-row", ".fig:has(#h-tps)", ".fig:has(#h-itl50)"],
   watch: "total tokens/s against each stream's speed",
   // how much each stream slows, and where the ridge is: measured here (ft-relations.js), never a fixed claim
   text: (s) => `Many requests share each step: one read of the weights serves the whole batch. ${batchingWords(s)}`,
   live: (s) => live(s, "many-users")},
  {key: "queueing", title: "Queueing", preset: "queueing", focus: "queue", spot: [".queue-wrap", ".fig:has(#h-ttft50)", ".fig:has(#h-waiting)"],
   watch: "TTFT against the prefill time, and the queue",
   text: () => "With every slot busy, new requests wait in the queue. Their prefill takes as long as ever — the model " +
     "did not get slower — but the time to first token grows with the wait.",
   live: (s) => live(s, "queueing")},
  // Only the diagnosis is spotted: it ends with the request's measured stages itself, and on a busy
  // machine it adds a suspect of its own, which pushed the TTFT bar below it out of a 1366x768
  // presenter window (the fresh-clone run beside busy loops failed there).
  {key: "slow", title: "When it feels slow", preset: null, focus: "detail", spot: ["#d-why"],
   watch: "the request panel: its measured stages and the largest one",
   text: () => "Click a request on the timeline. Its time is split into measured stages; the largest names the " +
     "likely fix: queueing (more slots, less load), prefill (shorter prompt), decode (fewer tokens), or waiting " +
     "behind others' prefill (chunked prefill).",
   // the diagnosis itself is in the request panel, outlined: the banner names its suspect only
   live(s, ui) {
     const d = diagnosis(s, ui), r = selectedReq(s, ui);
     return d && r ? `${r.label || r.id}: the suspect is ${d.cause} — the request panel gives its measured stages` : "";
   }},
  {key: "speculation", title: "Speculative decoding", preset: "speculative", focus: "timeline",
   spot: [".timeline-wrap", ".fig:has(#h-spec)"],
   watch: "the guesses on the request's row (filled: accepted, hollow: rejected) and the share of guesses accepted",
   text(s) {
     const x = rates(recent(s));
     return "A decode step reads all the weights to make one token per request. Speculative decoding guesses the next few " +
       "tokens cheaply (here by finding the last few tokens earlier in the prompt, which this request copies) and checks " +
       "them all in one forward; the model keeps the guesses it agrees with, plus one token of its own" +
       (x ? `: ${pct(x.rate)} of the guesses were accepted, ${x.length.toFixed(1)} tokens per forward for the request.` : ".") +
       " With many users each forward is already full, so the guesses are extra work: compare both to see where it stops paying.";
   },
   live: (s) => live(s, "speculative")},
  // The other suspects, between the engine and the user or before it runs (ft-delivery.js); the
  // timeline's legend (its head) names what lies between and the load.
  {key: "proxy", title: "A buffering proxy", preset: "buffered-proxy", focus: "timeline",
   spot: [".timeline-wrap", ".strip-head:has(#legend-engine)"],
   watch: "the arrival dots under each row against the engine's ticks",
   text: () => "A proxy between the server and the user may hold a streamed answer and let it go in pieces. The " +
     "engine still makes each token at a steady pace (the ticks); this page gets them in clumps (the dots under each row).",
   live: (s) => live(s, "buffered-proxy")},
  {key: "network", title: "A slow network", preset: "slow-network", focus: "timeline",
   spot: [".timeline-wrap", ".strip-head:has(#legend-engine)", ".fig:has(#h-ttft50)"],
   watch: "time to first token here against the engine's",
   text: () => "A slow network delays every token on its way to the user, the first included: the engine's time to " +
     "first token (the headline) does not change, the user's does. This delay is injected, and the legend says so.",
   live: (s) => live(s, "slow-network")},
  {key: "cold", title: "A cold start", preset: "cold-start", focus: "timeline",
   spot: [".timeline-wrap", ".strip-head:has(#legend-engine)"],
   watch: "the model-loading band, and the first requests' wait for it on their rows",
   text: () => "A server that has just started, or reloaded its model, answers nobody until the weights are in " +
     "memory: requests that arrive meanwhile wait (their 'load' stage). The first forward of each new shape also " +
     "sets up its kernels (outlined on the top lane); a reload keeps those.",
   live: (s) => live(s, "cold-start")},
  // The article's decode loop: "choose a token from the probabilities (greedily or by sampling)"
  // (ft-candidates.js: every token's candidates from its event). Last, so the steps before keep their numbers.
  // The rows and the TTFT bar are outlined (the output is further down the request panel: a
  // 1366x768 projector does not hold both).
  {key: "sampling", title: "Choosing a token", preset: "sampling", focus: "detail",
   spot: [".timeline-wrap", ".acc-ttft"],
   watch: "a hovered token's bars, the top bar each row took, and the TTFT's first sample",
   text: (s) => "Each step gives every request's next token a probability and the sampler picks one. One question, " +
     "five ways: greedy always takes the tallest bar, temperature 0.7 sharpens the bars, 1.5 flattens them, top-p " +
     "0.5 keeps the few that make half the mass. Underlined: tokens the model gave under 30 %." +
     seededText(teach.preset(s, "sampling")),
   live: (s) => live(s, "sampling")},
];

// Shown only when the server is disaggregated (hello.instances): after "When it feels slow", whose
// breakdown of a later token it changes. STEPS stays the colocated tour; stepsFor(s) is the one run.
export const DISAGG_STEP = {
  key: "disaggregation", title: "Prompts on one instance, streams on another", preset: "disaggregation", focus: "timeline",
  spot: [".timeline-wrap", ".strip-head:has(#legend-engine)"],
  watch: "the two lanes of forwards, the yellow KV transfer on each row, and the later-token bar of a finished request",
  text(s) {
    const x = s.transfers[s.transfers.length - 1];
    return "Two engines: the top lane is the prefill instance's forwards (prompts), the one under it the decode " +
      "instance's (tokens). Each prompt's keys and values are copied from one to the other (yellow, on its row and " +
      `between the lanes${x ? `: ${fmtBytes(x.bytes)} in ${fmtS(x.end - x.start)}` : ""}). Streams no longer wait for ` +
      "others' prompts: a later token has no 'waiting: others' prefill' part.";
  },
  live: (s) => live(s, "disaggregation"),
};
export const stepsFor = (s) => {
  if (!s || !s.instances) return STEPS;
  const at = STEPS.findIndex((x) => x.key === "slow") + 1;
  return [...STEPS.slice(0, at), DISAGG_STEP, ...STEPS.slice(at)];
};
let shown = STEPS;   // the steps of the tour running (stepsFor when it started or moved)

function spot(step) {
  for (const e of document.querySelectorAll(".spot")) e.classList.remove("spot");
  document.body.classList.toggle("touring", !!step);
  if (!step) return;
  mark(step);
  scrolledByHand = false;
  requestAnimationFrame(() => scrollToSpots(step));
}

// The step's parts outlined (each with its heading); again on every tick, as a panel that
// redraws (the request panel's accounting) makes its parts anew, without the outline.
function mark(step) {
  for (const sel of step.spot) {
    for (const e of document.querySelectorAll(sel)) {
      e.classList.add("spot");
      const head = e.previousElementSibling;   // its heading is part of it
      if (head && head.matches("h2, h3, .strip-head")) head.classList.add("spot");
    }
  }
}

// What the step points at is on screen, below the header and the banner docked under it
// (ft-stage.js): each part scrolled into its panel's view and the page's, the step's first part
// last, so that it wins where they cannot all be shown (a 1024-px window's one column); the
// header's figures are always on screen (scrolling to one scrolled the page back up, and the
// queue strip scrolled to before it ended below the window). Again at every tick while the
// step is shown, until the person scrolls (scrolledByHand). On a phone nothing stays on screen: the banner
// is scrolled to the top, the explanation first, and the parts follow it down the page.
function scrollToSpots(step) {
  if (index < 0) return;   // ended before this frame
  const top = dockBottom(), banner = $("lesson");
  document.documentElement.style.scrollPaddingTop = `${top}px`;
  document.documentElement.style.scrollPaddingBottom = "8px";   // the outline too
  if (!top) { banner.scrollIntoView({block: "start"}); return; }
  for (const sel of [...step.spot].reverse()) {
    for (const e of document.querySelectorAll(sel)) {
      if (e.closest("header.top")) continue;
      // its heading (outlined with it) at the top where both fit, the part whole where they do not
      const head = e.previousElementSibling;
      if (head && head.classList.contains("spot")) reveal(head, "start");
      reveal(e, "nearest");
    }
  }
}

// `e` scrolled into view ("start": at the top; "nearest": the least scroll that shows it, its top
// where it is too tall) inside the side panel that scrolls it when that panel stays on screen
// (sticky, ft.css): only the panel moves (scrollIntoView scrolled the page too, and took the
// centre's part off the screen); else in the page.
const EDGE = 8;   // px clear of the panel's edges (the outline)
function reveal(e, block) {
  const panel = e.parentElement && e.parentElement.closest(".panel");
  if (!panel || getComputedStyle(panel).position !== "sticky") { e.scrollIntoView({block, inline: "nearest"}); return; }
  const p = panel.getBoundingClientRect(), r = e.getBoundingClientRect();
  const up = r.top - p.top - EDGE, down = r.bottom - p.bottom + EDGE;
  panel.scrollTop += block === "start" || up < 0 ? up : down > 0 ? Math.min(down, up) : 0;
}

function go(s, ui, i) {
  shown = stepsFor(s);
  if (i < 0 || i >= shown.length) return;
  index = i;
  since = s.latestT;
  const step = shown[i];
  if (step.preset && teach.preset(s, step.preset)) teach.apply(s, step.preset);
  else if (step.preset) toast(`this server has no "${step.preset}" preset: the step runs on the current settings`);
  lesson(s, ui);
  document.body.dataset.focus = teach.focus();   // now, not at the next tick: what it shows decides the scroll
  spot(step);
}

function lesson(s, ui) {
  const step = shown[index], n = shown.length;
  teach.setLesson({kicker: `tour ${index + 1} / ${n}`, title: step.title, text: step.text(s, ui), watch: step.watch,
                   live: step.live(s, ui) || "", focus: step.focus});
  $("tour-pos").textContent = `${index + 1} / ${n}`;
  $("tour-prev").disabled = index === 0;
  $("tour-next").disabled = index === n - 1;
}

// The tour started from the keyboard: the banner takes the focus (its first enabled button, "Next →"
// on step 1, is one Tab away; it took 43), and ending it gives the focus back to what started it.
let opener = null;
export function start(s, ui, i = 0) {
  opener = document.activeElement;
  go(s, ui, i);
  if (index < 0) return;
  teach.banner(s);
  $("lesson").focus({preventScroll: true});   // (the step scrolls to its own parts)
}

export function stop() {
  const hadFocus = $("lesson").contains(document.activeElement);
  index = -1; teach.setLesson(null); spot(null);
  if (!hadFocus) return;
  for (const e of [opener, $("btn-tour"), $("btn-tour-present")]) {
    if (e && e.isConnected) e.focus({preventScroll: true});
    if (document.activeElement === e) return;
  }
}
export const next = (s, ui) => go(s, ui, index < 0 ? 0 : index + 1);
export const prev = (s, ui) => go(s, ui, index < 0 ? 0 : index - 1);

let urlDone = false;
// Its buttons, with the page state and UI state the steps read.
export function init(s, ui) {
  for (const id of ["btn-tour", "btn-tour-present"]) $(id).addEventListener("click", () => (index < 0 ? start(s, ui) : stop()));
  $("tour-prev").addEventListener("click", () => prev(s, ui));
  $("tour-next").addEventListener("click", () => next(s, ui));
  $("tour-end").addEventListener("click", stop);
  // the person's own scrolling (not the step's): the tour leaves the page where they put it
  const byHand = () => { scrolledByHand = true; };
  for (const type of ["wheel", "touchmove"]) window.addEventListener(type, byHand, {passive: true, capture: true});
  window.addEventListener("keydown", (e) => {
    if (["ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End", " "].includes(e.key)) byHand();
  }, {capture: true});
}

// What it does on events, with the UI state a step reads (ft-state.js createDispatch gives the state).
export const reactions = (ui) => ({
  // `/?tour=N` opens step N once the presets are known.
  hello(ev, s) {
    if (index >= 0 || urlDone) return;
    urlDone = true;
    const n = parseInt(new URLSearchParams(location.search).get("tour"), 10);
    if (n >= 1 && n <= stepsFor(s).length) go(s, ui, n - 1);
  },
});

export function update({s, ui}) {
  for (const id of ["btn-tour", "btn-tour-present"]) $(id).textContent = index < 0 ? "Guided tour" : "End tour";
  if (index >= 0 && index >= shown.length) stop();   // a new hello with fewer steps
  if (index >= 0) { lesson(s, ui); mark(shown[index]); }
  // (after this tick's banner is written: its height decides where the parts go)
  if (index >= 0 && !scrolledByHand) { const step = shown[index]; requestAnimationFrame(() => scrollToSpots(step)); }
}
