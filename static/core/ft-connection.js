// First Token: the connection. One websocket to /ws that reconnects with backoff, an
// NTP-style clock sync over it (page seconds = engine t + offset; the round trip with the
// smallest RTT wins), and `send` for control messages (docs/protocol.md).
import {clockSync} from "ft/state";
import {$, toast} from "ft/util";

const pageNow = () => performance.now() / 1000;

// The engine clock's offset from this page's (seconds), and the round trip it was measured with.
export const clock = {offset: null, rtt: null, best: Infinity, timer: null};
let ws = null, retries = 0;
let stopped = false;   // replaying a trace: no connection, no reconnects, nothing sent

export function send(msg) {
  if (stopped) return false;
  if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(msg)); return true; }
  toast("not connected: the message was not sent");
  return false;
}

export function setConn(state, text) {
  const c = $("conn");
  c.dataset.state = state;
  c.textContent = text;
}

function syncRound() {
  for (let i = 0; i < 5; i++) setTimeout(() => send({type: "sync", client_t: performance.now()}), i * 60);
}

function onSync(ev, arrived) {
  const sent = ev.client_t / 1000;
  const rtt = arrived - sent;
  if (rtt < 0 || rtt > clock.best * 4 + 0.05) return;
  const offset = (sent + arrived) / 2 - ev.t;
  if (rtt <= clock.best || clock.offset === null) { clock.best = rtt; clock.rtt = rtt; clock.offset = offset; }
}

function opened() {
  retries = 0;
  setConn("connected", "live");
  $("conn").title = "";
  // A new connection may be a new server whose clock restarted at 0: sync afresh.
  clock.offset = null; clock.best = Infinity;
  // Rounds soon after connect (a busy server or page skews the first), then every 30 s for drift.
  for (const delay of [0, 2000, 8000]) setTimeout(syncRound, delay);
  clearInterval(clock.timer);
  clock.timer = setInterval(syncRound, 30000);
}

// One frame: counted in the page state `s` and its `perf` counters; its events except `sync` go
// to `onEvents(events, at)`, with `at` the frame's arrival on the engine clock (null until synced).
function received({s, perf, onEvents}, e) {
  const arrived = pageNow();
  s.frames++; s.bytes += e.data.length; perf.bytesInWindow += e.data.length;
  let events;
  try { events = JSON.parse(e.data); } catch (err) { toast(`bad frame from server: ${err}`); return; }
  const at = clock.offset === null ? null : arrived - clock.offset;
  for (const ev of events) if (clockSync(ev)) onSync(ev, arrived);
  onEvents(events.filter((ev) => !clockSync(ev)), at);
}

function closed(sink) {
  clearInterval(clock.timer);
  if (stopped) return;
  const wait = Math.min(5000, 300 * 2 ** retries++);
  setConn("down", `reconnecting in ${(wait / 1000).toFixed(1)} s`);
  setTimeout(() => connect(sink), wait);
}

// Replaying a trace: stop listening for good. The page tells the server (`leave`), which then
// sends nothing more, and neither side closes the socket: a close under Werkzeug's server
// shows in Chromium as an "Invalid frame header" console error. Frames on the way are dropped.
export function stop() {
  stopped = true;
  clearInterval(clock.timer);
  if (!ws) return;
  ws.onmessage = null; ws.onclose = null;
  const leave = () => ws.send(JSON.stringify({type: "leave"}));
  if (ws.readyState === WebSocket.OPEN) leave();
  else if (ws.readyState === WebSocket.CONNECTING) ws.onopen = leave;
}

// `sink`: {s, perf, onEvents}, where each frame goes (received); a reconnect keeps it.
export function connect(sink) {
  const proto = location.protocol === "https:" ? "wss://" : "ws://";
  ws = new WebSocket(proto + location.host + "/ws");
  ws.onopen = opened;
  ws.onmessage = (e) => received(sink, e);
  ws.onclose = () => closed(sink);
}

// Engine time now: from the synced clock, else the newest time any event in `s` carried.
export const engineNow = (s) => (clock.offset === null ? s.latestT : pageNow() - clock.offset);
