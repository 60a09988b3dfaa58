// First Token: traces, replay and slow motion. The page logs every event it receives (hello
// first; bounded) and "Save trace" downloads that log as a trace, the JSON array
// `[hello, ...events]` of docs/events.schema.json. A trace (a file, `?trace=URL` on this
// origin, or the `#ft-trace` JSON block inlined by `app.py export`) plays through the same
// `show` -> ingest path and the same views as a live stream, on a virtual engine clock
// (`now()`, which the canvases use instead of the live clock): play, pause, speed, scrub.
// Scrubbing back resets the state object in place and re-ingests from the start.
// Slow motion replays the last seconds of the live log slowly while the connection keeps
// logging; back to live rebuilds the state from the whole log.
import {engineNow as liveNow, setConn, stop as stopLive} from "ft/connection";
import {createState, firstOf, startsRun, typed} from "ft/state";
import {$, toast} from "ft/util";

const KEEP_EVENTS = 200000;   // the live log's bound: events...
const KEEP_SECONDS = 1800;    // ...and engine seconds (30 minutes)
const SLOW_SECONDS = 10;      // slow motion starts this far behind live
// The functions that play take `feed`, the page they play to: {s, ui, show}: its state (reset
// in place to replay), its UI state, and `show(events, at)`, the boot's one path from events
// to the state and the views.

// The live log: events as received (sync excluded) and each one's arrival on the engine clock.
const log = {events: [], at: []};
// What the view shows: "live" (the connection), "slow" (the live log, slowly) or "trace".
export const player = {mode: "live", events: null, at: null, i: 0, vt: 0, t0: 0, t1: 0, speed: 1,
                       playing: false, lastTs: null, name: "", error: null, endedAt: null};
// A trace's page parameters (an export opened as file:///…html?loop=1 takes them too).
const params = new URLSearchParams(location.search);
const LOOP = ["1", "true"].includes(params.get("loop")), AUTOPLAY = params.get("autoplay") !== "0";
const LOOP_HOLD_MS = 1500;
let raf = null;

// ------------------------------------------------------------ the live log
export function logLive(feed, events, at) {
  let restarted = false;
  for (const ev of events) {
    if (startsRun(ev)) { log.events = []; log.at = []; restarted = true; }
    if (!log.events.length && !startsRun(ev)) continue;   // `loading` before a hello
    log.events.push(ev); log.at.push(at);
  }
  trimLog();
  if (player.mode === "live") feed.show(events, at);
  else if (player.mode === "slow" && restarted) live(feed);   // a new server: its log starts afresh
}

// Oldest events go first (hello stays), in chunks, past either bound.
function trimLog() {
  const ev = log.events;
  if (ev.length < 2) return;
  let cut = ev.length > KEEP_EVENTS * 1.1 ? ev.length - KEEP_EVENTS : 1;
  const oldest = ev[ev.length - 1].t - KEEP_SECONDS;
  if (ev[1].t < oldest - 60) while (cut < ev.length - 1 && ev[cut].t < oldest) cut++;
  if (cut <= 1) return;
  ev.splice(1, cut - 1); log.at.splice(1, cut - 1);
  if (player.mode === "slow") player.i = Math.max(1, player.i - (cut - 1));
}

function traceText(events) {
  return "[\n" + events.map((ev) => JSON.stringify(ev)).join(",\n") + "\n]\n";
}

function save() {
  if (!log.events.length) { toast("nothing to save yet: no hello from the server"); return; }
  const blob = new Blob([traceText(log.events)], {type: "application/json"});
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `first-token-trace-${new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ------------------------------------------------------------ playing
// The state object is shared by every part of the page: reset it in place. Counters the
// connection keeps and the versions views compare against carry on (monotonic).
function resetState({s, ui}) {
  const keep = {frames: s.frames, bytes: s.bytes, version: s.version + 1, epoch: s.epoch + 1};
  Object.assign(s, createState(), keep);
  ui.dirtyDom = true;
}

// Show the events from player.i whose time has come (hello at once), one batch per frame
// of the same arrival, as the connection delivered them.
function advance(feed, T) {
  const evs = player.events;
  const due = (ev) => startsRun(ev) || !(ev.t > T);
  while (player.i < evs.length && due(evs[player.i])) {
    const start = player.i, at = player.at ? player.at[start] : null;
    while (player.i < evs.length && due(evs[player.i]) &&
           (player.at ? player.at[player.i] : null) === at) player.i++;
    feed.show(evs.slice(start, player.i), at);
  }
  player.vt = T;
}

function seek(feed, T) {
  T = Math.max(player.t0, Math.min(end(feed.s), T));
  if (T < player.vt) { resetState(feed); player.i = 0; }
  advance(feed, T);
  showPosition(feed.s);
}

// The end of what can be played: the trace's last event, or (slow motion) live now.
const end = (s) => (player.mode === "slow" ? liveNow(s) : player.t1);

function frame(feed, ts) {
  raf = null;
  if (player.mode === "live") return;
  if (player.playing && player.lastTs !== null) {
    const T = Math.min(end(feed.s), player.vt + ((ts - player.lastTs) / 1000) * player.speed);
    advance(feed, T);
    if (player.mode === "trace" && T >= player.t1) {
      // ?loop=1 (an article's replay): hold the end a moment, then play from the start again
      if (!LOOP) setPlaying(feed, false);
      else if (player.endedAt === null) player.endedAt = ts;
      else if (ts - player.endedAt > LOOP_HOLD_MS) { player.endedAt = null; seek(feed, player.t0); }
    }
  }
  player.lastTs = ts;
  showPosition(feed.s);
  loop(feed);
}

function loop(feed) {
  if (raf === null && player.mode !== "live") raf = requestAnimationFrame((ts) => frame(feed, ts));
}

function setPlaying(feed, on) {
  player.playing = on;
  player.lastTs = null;
  $("rp-play").textContent = on ? "Pause" : "Play";
  if (on && player.mode === "trace" && player.vt >= player.t1) seek(feed, player.t0);   // play again from the start
  loop(feed);
}

function setSpeed(x) {
  player.speed = x;
  const sel = $("rp-speed");
  if (![...sel.options].some((o) => +o.value === x)) sel.append(new Option(`${x}×`, String(x)));
  sel.value = String(x);
}

function showPosition(s) {
  const span = end(s) - player.t0;
  $("rp-scrub").value = String(span > 0 ? Math.round(((player.vt - player.t0) / span) * 1000) : 0);
  $("rp-time").textContent = player.mode === "slow"
    ? `${(end(s) - player.vt).toFixed(1)} s behind live`
    : `${(player.vt - player.t0).toFixed(1)} / ${span.toFixed(1)} s`;
}

function showPanel(on) {
  document.body.classList.toggle("replaying", on);
  document.body.classList.toggle("trace", player.mode === "trace");
  $("replay").hidden = !on;
  $("rp-live").hidden = player.mode !== "slow";
}

// ------------------------------------------------------------ traces
// Why `trace` is not a trace (null when it is one): checked before anything changes.
function problem(trace) {
  if (!Array.isArray(trace)) return "a trace is a JSON array of events";
  if (!trace.length || !trace[0] || !startsRun(trace[0])) return "a trace starts with a hello event";
  for (let i = 0; i < trace.length; i++) {
    const ev = trace[i];
    if (!ev || typeof ev !== "object" || !typed(ev) || typeof ev.t !== "number" || !isFinite(ev.t)) {
      return `event ${i} has no type and time`;
    }
  }
  return null;
}

function describe(trace, name) {
  const h = trace[0];
  const date = typeof h.server_time === "number" ? new Date(h.server_time * 1000).toISOString().slice(0, 10) : "?";
  $("rp-title").textContent = `Replay${name ? `: ${name}` : ""}`;
  const srv = h.mode === "observe" ? h.server || (firstOf(trace, "stats", (ev) => ev.server && ev.server.title) || {}).server : null;
  $("rp-credit").textContent = h.mode === "observe"
    ? `Recorded by First Token observing ${srv ? `${srv.title}${srv.version ? ` ${srv.version}` : ""}` : h.target} ` +
      `(${String(h.model ?? "?").split("/").pop()}) from the client's side, ${date}`
    : `Recorded with First Token on ${h.model ?? "?"}, ${h.device ?? "?"}, ${date}`;
  const preset = firstOf(trace, "preset");
  $("rp-preset").hidden = !preset;
  if (preset) $("rp-preset-title").textContent = preset.title || preset.name;   // its explanation: the lesson banner
}

// Play `trace` from its start; the live connection (if any) is closed for good: a page in
// replay sends nothing to a server. A bad trace changes nothing and throws with the reason.
function load(feed, trace, name) {
  const why = problem(trace);
  if (why) throw new Error(`not a First Token trace: ${why}`);
  stopLive();
  setConn("replay", "replay");
  let t0 = Infinity, t1 = -Infinity;
  for (const ev of trace) { t0 = Math.min(t0, ev.t); t1 = Math.max(t1, ev.t); }
  Object.assign(player, {mode: "trace", events: trace, at: null, i: 0, vt: t0, t0, t1, name: name || "", error: null});
  resetState(feed);
  feed.ui.selected = null;
  describe(trace, name);
  showPanel(true);
  advance(feed, t0);
  setPlaying(feed, AUTOPLAY);
}

function fail(message) {
  player.error = message;
  setConn("failed", "trace not loaded");
  $("conn").title = message;
  toast(message);
}

// An exported replay (`app.py export`) in a short window, an article's 640x400 frame, takes the
// embed's compact layout (ft.css's small-frame rules: the headline's main figures, the banner's
// title and live figure, the replay controls in one row), so its timeline is above the fold; the
// full page's layout again when the window grows. A phone held upright keeps the full page (it
// scrolls through every panel). (Only the CSS: the page's parts stay the full page's, ft-app.js
// read that at boot; the query lies inside ft.css's small-frame one.)
function compactWhenSmall() {
  const small = matchMedia("(max-height: 520px), (max-width: 760px) and (max-height: 700px)");
  const apply = () => {
    document.body.classList.toggle("embed", small.matches);
    document.body.classList.toggle("full", !small.matches);
  };
  apply();
  small.addEventListener("change", apply);
}

// A trace given with the page (export: a JSON block {name, events} with id ft-trace; ?trace=URL,
// same origin only): true when there is one (the caller then opens no connection).
export function start(feed) {
  const inlined = $("ft-trace");
  if (inlined) {
    compactWhenSmall();
    try {
      const {name, events} = JSON.parse(inlined.textContent);
      load(feed, events, name);
    } catch (e) { fail(e.message); }
    return true;
  }
  const param = new URLSearchParams(location.search).get("trace");
  if (param === null) return false;
  stopLive();
  let url;
  try { url = new URL(param, location.href); } catch (e) { fail(`trace: ${param} is not a URL`); return true; }
  if (url.origin !== location.origin) { fail(`trace: only this site's traces load here, not ${url.origin}`); return true; }
  const name = url.pathname.split("/").pop();
  fetch(url).then((r) => {
    if (!r.ok) throw new Error(`trace ${name}: HTTP ${r.status}`);
    return r.json();
  }).then((trace) => load(feed, trace, name)).catch((e) => fail(e.message));
  return true;
}

function loadFile(feed, file) {
  file.text().then((text) => load(feed, JSON.parse(text), file.name))
    .catch((e) => toast(`${file.name}: ${e.message}`));
}

// ------------------------------------------------------------ slow motion
// The last seconds of the live log again at `speed` (view only: the engine keeps real time
// and the connection keeps logging). False when there is nothing to watch.
export function slowMotion(feed, speed = 0.25, seconds = SLOW_SECONDS) {
  if (player.mode === "trace" || !log.events.length) return false;
  const now = liveNow(feed.s);
  Object.assign(player, {mode: "slow", events: log.events, at: log.at, i: 0, t0: log.events[0].t, vt: -Infinity});
  for (const ev of log.events) player.t0 = Math.min(player.t0, ev.t);
  resetState(feed);
  $("rp-title").textContent = "Slow motion";
  $("rp-credit").textContent = "";
  $("rp-preset").hidden = true;
  showPanel(true);
  advance(feed, Math.max(player.t0, now - seconds));
  setSpeed(speed);
  setPlaying(feed, true);
  return true;
}

// Back to live: the state rebuilt from the whole log, then live events as they come.
export function live(feed) {
  if (player.mode !== "slow") return false;
  player.mode = "live";
  player.playing = false;
  resetState(feed);
  showPanel(false);
  Object.assign(player, {events: log.events, at: log.at, i: 0});
  advance(feed, Infinity);
  Object.assign(player, {events: null, at: null});
  return true;
}

export function wire(feed) {
  $("rp-play").addEventListener("click", () => setPlaying(feed, !player.playing));
  $("rp-speed").addEventListener("change", (e) => setSpeed(+e.target.value));
  $("rp-scrub").addEventListener("input", (e) => seek(feed, player.t0 + (+e.target.value / 1000) * (end(feed.s) - player.t0)));
  $("rp-live").addEventListener("click", () => live(feed));
  if ($("btn-save-trace")) {
    $("btn-save-trace").addEventListener("click", save);
    $("trace-file").addEventListener("change", (e) => { if (e.target.files[0]) loadFile(feed, e.target.files[0]); e.target.value = ""; });
    $("btn-slow").addEventListener("click", () => slowMotion(feed, 0.25));
  }
}

// Whether the view shows a trace or slow motion (not the live stream), and its virtual clock.
export const active = () => player.mode !== "live";
export const now = () => player.vt;
// Where a trace's time axis starts: its first event (a page's saved trace holds the history the
// server sent before its hello, so counting from the hello put a 25-s lesson at "−95 s … −80 s");
// null unless a trace plays.
export const traceStart = () => (player.mode === "trace" ? player.t0 : null);

// For window.firstToken (tests, the console), playing to `feed`.
export const api = (feed) => ({
  slowMotion: (speed, seconds) => slowMotion(feed, speed, seconds), live: () => live(feed), trace: () => log.events.slice(),
  replay: {player, load: (trace, name) => load(feed, trace, name), seek: (T) => seek(feed, T),
           play: () => setPlaying(feed, true), pause: () => setPlaying(feed, false), setSpeed, save},
});
