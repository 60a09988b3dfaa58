// First Token: observe mode's own drawing (`hello.mode === "observe"`, docs/protocol.md
// "Observe mode"). The page then watches another server from the client's side, so every
// figure says who measured it (`stats.measured_by`): the server's own gauges, rates and slots
// (`stats.server`, read from its /metrics every 0.5 s, each placed at the time of its scrape,
// `scraped_t`, and held until the next one), or this client (time to first chunk, gaps).
//
// What it draws: the header ("observing {title} {version} · {model}") and the measured-by tag
// under each headline figure; the server strip (running/waiting, KV usage, prompt and
// generated tokens/s per scrape interval, llama.cpp's slots), its scrape line and its gauges;
// the client rows' wait for their first chunk (its timeline layer, `clientWaits`); the request
// panel's client-side accounting and the client-side diagnosis. The shared modules call in
// here only where observe mode differs; everything is drawn from events, so a recorded
// observe trace replays the same.
import {diagonalStripes, fitCanvas} from "ft/canvas";
import {palette as P, alpha, reqColor} from "ft/palette";
import {fitText, frame, rect, stepPath, timeAxis} from "ft/timeline";
import {$, el, finishText, fmtS, plural, sourceText} from "ft/util";

// Every function here that reads the page state takes it as `s`; those that say how old a scrape
// is now take `now`, the engine time the page shows (live, or a replay's virtual clock).
export const observing = (s) => !!(s && s.hello && s.hello.mode === "observe");

const C = {
  bg: P.panel2, muted: P.muted, text: P.text2, running: P.decode, waiting: P.queue, waitingFill: alpha(P.queue, 0.35),
  kv: P.accent, kvFill: alpha(P.accent, 0.25), prompt: P.prefill, generated: P.decode, other: alpha(P.muted, 0.45),
  clientWait: alpha(P.other, 0.75), labelBg: alpha(P.panel2, 0.8),
};
const NOT_EXPOSED = "not exposed by this server";

// ------------------------------------------------------------ who the server is
// Its profile as the newest word says: a scrape's title/version, else hello.server.
function profile(s) {
  const h = s.hello, v = s.last && s.last.server, hs = h && h.server;
  const kind = v ? v.profile : hs ? hs.kind : null;
  return {kind, title: (v && v.title) || (hs && hs.title) || null,
          version: (v && v.version) || (hs && hs.version) || null,
          exposed: hs && hs.kind === kind ? hs.exposed : null, slots: !!((hs && hs.slots) || (v && v.slots))};
}

// The names this server fills (hello.server.exposed), or, when hello came before the server was
// recognised, the names any scrape so far has filled.
function exposedOf(s, group) {
  const p = profile(s);
  if (p.exposed) return new Set(p.exposed[group]);
  const seen = new Set();
  for (const x of s.scrapes) if (x.server) for (const [k, v] of Object.entries(x.server[group] || {})) if (v !== null) seen.add(k);
  return seen;
}
const notes = (s) => (profile(s).exposed ? profile(s).exposed.notes : {}) || {};

const shortModel = (m) => (m ? String(m).split("/").pop() : "model not named yet");

export function modelLine(s) {
  const h = s.hello, p = profile(s);
  if (p.title) return `observing ${p.title}${p.version ? ` ${p.version}` : ""} · ${shortModel(h.model)}`;
  const readable = s.last ? !!s.last.server : h.metrics;
  return `observing ${h.target} · ${shortModel(h.model)} · ` +
    (readable ? "its /metrics has no names First Token knows" : "its /metrics is not readable");
}

// ------------------------------------------------------------ measured-by tags
// How old the server's latest scrape is now (its age at the stats event, plus the time since).
function ageNow(L, now) {
  const v = L && L.server;
  return v ? v.age_s + Math.max(0, now - L.t) : null;
}

// Whether the server's latest scrape is older than twice its period: its figures are not the
// server's now (shown greyed, "stale"; a scrape that answers late, or not again).
function stale(L, now) {
  const v = L && L.server;
  return !!v && ageNow(L, now) > 2 * (v.period_s || v.every_s);
}

function tag(s, name, now) {
  const L = s.last, by = L && L.measured_by ? L.measured_by[name] : null;
  if (by === "server") {
    return L.server ? `server, ${ageNow(L, now).toFixed(1)} s ago${stale(L, now) ? " · stale" : ""}` : "server: /metrics not readable";
  }
  if (by === "client") return "this client";
  return "";
}

// Each headline figure's value element -> the stats field whose measurer it shows.
const FIGS = {"h-ttft50": "ttft", "h-ttft99": "ttft", "h-itl50": "itl", "h-itl99": "itl", "h-tps": "tokens_per_s",
              "h-running": "running", "h-waiting": "queue", "h-policy": "in_flight", "h-delivery": null};
const saved = {};   // the engine page's labels, put back when a trace from an engine is loaded
let labelled = false;   // whether this page's headline carries observe mode's labels now

function byTag(fig) {
  let t = fig.querySelector(".by");
  if (!t) { t = el("span", "by"); fig.append(t); }
  return t;
}

function headline(s, on, now) {
  if (!on && !labelled) return;   // an engine's page: the panels' own labels, untouched
  labelled = on;
  for (const id of Object.keys(FIGS)) {
    const v = $(id);
    if (!v) continue;
    const fig = v.parentElement, k = fig.querySelector(".k"), t = byTag(fig);
    if (!(id in saved)) saved[id] = k.textContent;
    t.hidden = !on;
    if (!on) { k.textContent = saved[id]; fig.dataset.stale = "false"; continue; }
    t.textContent = FIGS[id] ? tag(s, FIGS[id], now) : "this page";
    t.dataset.by = FIGS[id] ? (s.last && s.last.measured_by ? s.last.measured_by[FIGS[id]] || "" : "") : "page";
    fig.dataset.stale = String(t.dataset.by === "server" && stale(s.last, now));   // greyed (ft.css)
  }
  if (!on) return;
  const L = s.last, v = L && L.server, n = v && v.slots ? v.slots.length : null;
  $("h-tps").previousElementSibling.textContent = "chunks/s";
  $("h-policy").previousElementSibling.textContent = "in flight";
  $("h-running").textContent = L && L.running !== null ? String(L.running) : "—";
  $("h-waiting").textContent = L && L.queue !== null ? String(L.queue) : "—";
  $("h-policy").textContent = L && L.in_flight !== null ? String(L.in_flight) : "—";
  if (n) byTag($("h-running").parentElement).textContent = `of ${n} slots · ${tag(s, "running", now)}`;
  const missing = (g) => (v && !v.profile ? "server: no names First Token knows" : v && v.gauges[g] === null ? NOT_EXPOSED : null);
  for (const [id, g] of [["h-running", "running"], ["h-waiting", "waiting"]]) {
    if (missing(g)) byTag($(id).parentElement).textContent = missing(g);
  }
}

// ------------------------------------------------------------ the scrape line and the gauges
const pct = (x) => (x === null || x === undefined ? "—" : `${(x * 100).toFixed(x < 0.1 ? 1 : 0)}%`);
const num = (x, d = 1) => (x === null || x === undefined ? "—" : x.toFixed(d));
const GAUGES = [["gauges", "batch_size", "batch size", (x) => num(x, 2)],
                ["gauges", "prefix_hit_rate", "prefix-cache hit rate", pct],
                ["gauges", "spec_accept_rate", "speculative acceptance", pct],
                ["gauges", "spec_accept_length", "accepted per step", (x) => num(x, 2)],
                ["ratios", "prefix_hit_ratio", "prefix hits / lookups, per interval", pct],
                ["ratios", "spec_acceptance", "drafts accepted, per interval", pct],
                ["ratios", "tokens_per_step", "tokens per step, per interval", (x) => num(x, 1)],
                ["rates", "preemptions_per_s", "preemptions/s", (x) => num(x, 2)],
                ["rates", "prefix_hits_per_s", "prefix-hit tokens/s", (x) => num(x, 0)],
                ["rates", "steps_per_s", "forward steps/s", (x) => num(x, 1)],
                ["rates", "spec_drafted_per_s", "drafted tokens/s", (x) => num(x, 0)]];

function scrapeLine(s, now) {
  const L = s.last, v = L && L.server, line = $("server-scrape");
  if (!v) {
    const since = s.scrapes.length && !s.scrapes[s.scrapes.length - 1].server ? s.scrapes[s.scrapes.length - 1].t : null;
    line.textContent = s.hello.metrics || since !== null
      ? `its /metrics is not readable${since !== null ? ` since ${(since - (s.connectT || 0)).toFixed(1)} s` : ""}`
      : "its /metrics is not readable";
    line.dataset.stale = "true";
    return;
  }
  const old = stale(L, now);
  line.textContent = `scraped every ${v.every_s} s · last ${ageNow(L, now).toFixed(1)} s ago · period ` +
    `${v.period_s === null ? "—" : `${v.period_s.toFixed(2)} s`}${old ? " · stale" : ""}`;
  line.dataset.stale = String(old);
}

// Why a figure the server exposes has no value now: never in its /metrics so far (its build does
// not report it), none this interval (a ratio with nothing to divide: no lookups, no drafts), or
// not in this scrape.
function missingWhy(s, group, name) {
  const seen = s.scrapes.some((p) => p.server && p.server[group] && p.server[group][name] !== null &&
                                     p.server[group][name] !== undefined);
  if (!seen) return "none in this server's /metrics so far";
  return group === "ratios" ? "none this interval (nothing to divide)" : "not in this scrape";
}

function gauges(s, now) {
  const v = s.last && s.last.server, box = $("server-gauges"), n = notes(s), old = stale(s.last, now);
  const key = JSON.stringify([v && v.scraped_t, v && v.profile, !!profile(s).exposed, old]);
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.replaceChildren(...GAUGES.map(([group, name, label, fmt]) => {
    const on = exposedOf(s, group).has(name), value = v ? v[group][name] : null;
    const has = value !== null && value !== undefined;
    const item = el("div", "sg");
    item.dataset.name = name; item.dataset.exposed = String(on);
    item.dataset.stale = String(on && has && old);
    item.append(el("span", "sg-k", label), el("span", "sg-v", on ? fmt(value) : "—"));
    const note = !on ? NOT_EXPOSED : !has && v ? missingWhy(s, group, name) : n[name] || n[name.replace(/_per_s$/, "")] || "";
    item.append(el("span", "sg-n", on ? `server${note ? `: ${note}` : ""}${has && old ? " · stale" : ""}` : note));
    item.title = `${label}: ${on ? `${fmt(value)}, measured by the server${note ? ` (${note})` : ""}` : NOT_EXPOSED}`;
    return item;
  }));
}

// The 4 Hz tick.
export function update(s, now) {
  const on = observing(s);
  document.body.classList.toggle("observing", on);
  for (const [id, show] of [["server-strip", on], ["legend-observe", on], ["legend-engine", !on]]) {
    if ($(id)) $(id).hidden = !show;
  }
  if ($("h-running")) headline(s, on, now);
  if (!on) return;
  $("model").textContent = modelLine(s);
  $("model").title = `${s.hello.model ?? ""} at ${s.hello.target}`;
  if ($("server-strip")) {
    const p = profile(s);
    $("server-title").textContent = p.title ? `${p.title}${p.version ? ` ${p.version}` : ""}, from its /metrics` : "";
    scrapeLine(s, now);
    gauges(s, now);
  }
}

// ------------------------------------------------------------ the server strip (canvas)
const hatch = (ctx) => diagonalStripes(ctx, 8, alpha(P.muted, 0.5), 1);

// The scrapes that matter to the window: from the one before its left edge to the last at or before its right.
function inView(s, f) {
  const list = s.scrapes, out = [];
  for (let i = 0; i < list.length; i++) {
    if (list[i].t > f.right) break;
    if (i + 1 < list.length && list[i + 1].t < f.left) continue;
    out.push({...list[i], until: i + 1 < list.length ? list[i + 1].t : null});
  }
  return out;
}

function lanes(s, compact) {
  const p = profile(s), L = s.last && s.last.server;
  const nSlots = L && L.slots ? L.slots.length : p.slots ? Math.max(0, ...s.scrapes.map((x) => (x.server && x.server.slots ? x.server.slots.length : 0))) : 0;
  const out = [{id: "queue", h: compact ? 44 : 56, label: "running · waiting (server)"},
               {id: "kv", h: compact ? 24 : 30, label: "KV usage (server)", gauge: "kv_usage"},
               {id: "prompt", h: compact ? 28 : 34, label: "prompt tokens/s (server's counters, per scrape interval)",
                rate: "prompt_tokens_per_s", color: C.prompt},
               {id: "generated", h: compact ? 28 : 34, label: "generated tokens/s (server's counters, per scrape interval)",
                rate: "generated_tokens_per_s", color: C.generated}];
  for (let i = 0; i < nSlots; i++) out.push({id: `slot${i}`, slot: i, h: compact ? 12 : 15, label: `slot ${i}`});
  let y = 4;
  for (const l of out) { l.y = y; y += l.h + 4; }
  return {list: out, height: y + (compact ? 14 : 18)};
}

function laneLabel(ctx, f, l, text, compact) {
  ctx.font = `${compact ? 10 : 11}px system-ui, sans-serif`;
  const shown = fitText(ctx, text, f.pw - 8), w = ctx.measureText(shown).width;
  ctx.fillStyle = C.labelBg; ctx.fillRect(f.gutter + 2, l.y, w + 6, compact ? 12 : 14);
  ctx.fillStyle = C.text; ctx.textAlign = "left"; ctx.textBaseline = "top";
  ctx.fillText(shown, f.gutter + 5, l.y + 1);
}

function gutterText(ctx, f, y, text, compact, baseline = "top") {
  ctx.font = `${compact ? 10 : 11}px system-ui, sans-serif`;
  ctx.fillStyle = C.muted; ctx.textAlign = "right"; ctx.textBaseline = baseline;
  ctx.fillText(fitText(ctx, text, f.gutter - 8), f.gutter - 5, y);
}

// A lane whose figure the server does not expose: greyed, and saying so.
function greyed(ctx, f, l, what, compact, why = NOT_EXPOSED) {
  ctx.fillStyle = hatch(ctx); ctx.fillRect(f.gutter, l.y, f.pw, l.h);
  laneLabel(ctx, f, l, `${what}: ${why}`, compact);
}

// Stretches with no readable /metrics: hatched across every lane.
function gaps(ctx, f, pts, end, top, bottom) {
  ctx.fillStyle = hatch(ctx);
  for (const p of pts) if (!p.server) rect(ctx, f, p.t, p.until ?? end, top, bottom - top);
}

function stepLine(ctx, f, pts, end, yOf, color, fill, base) {
  // Runs of readable scrapes, each a step line held until the next scrape (or now).
  let run = [];
  const flush = (stopT) => {
    if (!run.length) return;
    const xe = Math.min(f.gutter + f.pw, f.x(stopT));
    if (fill) {
      ctx.beginPath(); stepPath(ctx, f, run, yOf, xe);
      ctx.lineTo(xe, base); ctx.lineTo(Math.max(f.gutter, f.x(run[0].t)), base); ctx.closePath();
      ctx.fillStyle = fill; ctx.fill();
    }
    ctx.beginPath(); stepPath(ctx, f, run, yOf, xe);
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.stroke();
    run = [];
  };
  for (const p of pts) {
    if (p.server && yOf(p) !== null) run.push(p);
    else flush(p.t);
  }
  flush(end);
}

function drawQueueLane(ctx, f, s, l, pts, end, compact) {
  const w = exposedOf(s, "gauges");
  if (!w.has("running") && !w.has("waiting")) { greyed(ctx, f, l, "running and waiting", compact); return; }
  const n = s.last && s.last.server && s.last.server.slots ? s.last.server.slots.length : 0;
  let ymax = Math.max(4, n);
  for (const p of pts) if (p.server) ymax = Math.max(ymax, p.server.gauges.running || 0, p.server.gauges.waiting || 0);
  const base = l.y + l.h, y = (v) => base - (v / ymax) * (l.h - 14);
  const of = (k) => (p) => (p.server.gauges[k] === null ? null : y(p.server.gauges[k]));
  if (w.has("waiting")) stepLine(ctx, f, pts, end, of("waiting"), C.waiting, C.waitingFill, base);
  if (w.has("running")) stepLine(ctx, f, pts, end, of("running"), C.running, null, base);
  gutterText(ctx, f, l.y + 14, String(ymax), compact);
  gutterText(ctx, f, base, "0", compact, "bottom");
  laneLabel(ctx, f, l, `running (green) · waiting (orange), server${w.has("waiting") ? "" : ` · waiting ${NOT_EXPOSED}`}`, compact);
}

function drawKvLane(ctx, f, s, l, pts, end, compact) {
  if (!exposedOf(s, "gauges").has("kv_usage")) { greyed(ctx, f, l, "KV usage", compact); return; }
  if (!s.scrapes.some((p) => p.server && p.server.gauges.kv_usage !== null)) {   // a name this server's build dropped
    greyed(ctx, f, l, "KV usage", compact, "none in this server's /metrics so far (its build does not report it)");
    return;
  }
  const base = l.y + l.h, y = (v) => base - v * (l.h - 2);
  stepLine(ctx, f, pts, end, (p) => (p.server.gauges.kv_usage === null ? null : y(p.server.gauges.kv_usage)), C.kv, C.kvFill, base);
  gutterText(ctx, f, l.y, "100%", compact);
  laneLabel(ctx, f, l, "KV usage 0–100% (server)", compact);
}

// Rates as bars one scrape interval wide, ending at the scrape (the counters' increase over it).
function drawRateLane(ctx, f, s, l, pts, compact) {
  if (!exposedOf(s, "rates").has(l.rate)) { greyed(ctx, f, l, l.label.split(" (")[0], compact); return; }
  let ymax = 1;
  for (const p of pts) if (p.server && p.server.rates[l.rate] !== null) ymax = Math.max(ymax, p.server.rates[l.rate]);
  ctx.fillStyle = l.color;
  for (const p of pts) {
    const v = p.server && p.server.rates[l.rate], period = p.server && p.server.period_s;
    if (!v || !period) continue;
    const h = (v / ymax) * (l.h - 14);
    rect(ctx, f, p.t - period, p.t, l.y + l.h - h, h);
  }
  gutterText(ctx, f, l.y + 12, `${Math.round(ymax)}/s`, compact);
  const note = notes(s)[l.rate.replace(/_per_s$/, "")];
  laneLabel(ctx, f, l, l.label + (note ? ` · ${note}` : ""), compact);
}

// One strip per llama.cpp slot: our request's colour, grey for another client's, empty when idle.
function drawSlotLane(ctx, f, l, pts, end, compact) {
  for (const p of pts) {
    const row = p.server && p.server.slots ? p.server.slots.find((x) => x.id === l.slot) || p.server.slots[l.slot] : null;
    if (!row || !row.busy) continue;
    ctx.fillStyle = row.request ? reqColor(row.request) : C.other;
    rect(ctx, f, p.t, p.until ?? end, l.y + 1, l.h - 2);
  }
  gutterText(ctx, f, l.y + l.h / 2, l.label, compact, "middle");
}

export function drawServer(canvas, s, view, now) {
  const {ctx, w, h} = fitCanvas(canvas);
  const compact = w < 700, f = frame(w, view, compact);
  const L = lanes(s, compact);
  const want = `${L.height}px`;
  if (canvas.parentElement.style.getPropertyValue("--sv-h") !== want) canvas.parentElement.style.setProperty("--sv-h", want);
  ctx.fillStyle = C.bg; ctx.fillRect(0, 0, w, h);
  if (!observing(s)) return {f, lanes: []};
  const bottom = L.list[L.list.length - 1].y + L.list[L.list.length - 1].h;
  timeAxis(ctx, f, 2, bottom, `${compact ? 10 : 12}px system-ui, sans-serif`, true);
  const end = view.paused ? f.right : now, pts = inView(s, f);
  gaps(ctx, f, pts, end, 2, bottom);
  for (const l of L.list) {
    if (l.id === "queue") drawQueueLane(ctx, f, s, l, pts, end, compact);
    else if (l.id === "kv") drawKvLane(ctx, f, s, l, pts, end, compact);
    else if (l.rate) drawRateLane(ctx, f, s, l, pts, compact);
    else drawSlotLane(ctx, f, l, pts, end, compact);
  }
  return {f, lanes: L.list};
}

// The hover read-out: the scrape that holds at the pointer's time, for the lane under it.
export function hitServer(layout, s, x, y) {
  if (!layout || !layout.lanes.length || x < layout.f.gutter) return null;
  const l = layout.lanes.find((q) => y >= q.y && y <= q.y + q.h + 4);
  if (!l) return null;
  const t = layout.f.t(x), origin = s.connectT || 0;
  let p = null;
  for (const q of s.scrapes) { if (q.t <= t) p = q; else break; }
  if (!p) return null;
  if (!p.server) return [`t = ${(t - origin).toFixed(2)} s: the server's /metrics was not readable`];
  const v = p.server, head = `scraped at ${(p.t - origin).toFixed(2)} s, by the server`;
  if (l.id === "queue") return [head, `running ${v.gauges.running ?? "—"} · waiting ${v.gauges.waiting ?? "—"}`];
  if (l.id === "kv") return [head, `KV usage ${v.gauges.kv_usage === null ? NOT_EXPOSED : pct(v.gauges.kv_usage)}`];
  if (l.rate) {
    const r = v.rates[l.rate];
    return [head, r === null ? `${l.label.split(" (")[0]}: ${exposedOf(s, "rates").has(l.rate) ? "no rate for this interval" : NOT_EXPOSED}`
      : `${Math.round(r)} ${l.label.split(" (")[0]} over the ${fmtS(v.period_s)} before it (the server's counters)`];
  }
  const row = v.slots ? v.slots.find((q) => q.id === l.slot) || v.slots[l.slot] : null;
  if (!row) return [head, `slot ${l.slot}: not reported`];
  if (!row.busy) return [head, `slot ${l.slot}: idle`];
  return [head, `slot ${l.slot}: ${row.request ?? "another client"} · decoded ${row.decoded ?? "—"} · remaining ${row.remaining ?? "—"}` +
    ` · prompt ${row.prompt_tokens ?? "—"} tokens${row.cached_tokens ? ` (${row.cached_tokens} cached)` : ""}`];
}

// ------------------------------------------------------------ client rows (the timeline's layer)
// Before its first chunk a request is only waiting, as far as a client can tell (not "queue");
// from the first scrape that showed it in a server slot, shaded as such.
function clientWaits({ctx, f, g, now}) {
  for (const r of g.reqs) {
    if (r.rejected) continue;
    const y = g.barY(r), end = r.first ?? r.end ?? now;
    ctx.fillStyle = C.clientWait;
    rect(ctx, f, r.arrival, end, y, g.barH);
    if (r.inSlot !== null && r.inSlot < end) {   // in its own colour, as its slot's strip in the server strip
      ctx.fillStyle = reqColor(r.id); ctx.globalAlpha = 0.6;
      rect(ctx, f, Math.max(r.arrival, r.inSlot), end, y, g.barH);
      ctx.globalAlpha = 1;
    }
  }
}

// The timeline's layer (ft-timeline.js createTimeline): in observe mode the rows' wait before
// their first chunk is the client's, in place of the engine's queue stage.
export const timelineLayers = [{name: "clientWaits", at: "queue", on: observing, draw: clientWaits}];

// The timeline's hover read-out for a request in observe mode.
export function describeClient(s, r) {
  const lines = [`${r.id} · ${sourceText(r.source)} · ${r.promptTokens ?? "?"} prompt tokens${r.source === "observe" ? " (estimated)" : ""} → max ${r.maxNew ?? "?"} new`];
  if (r.rejected) { lines.push(`rejected: ${r.rejected}`); return lines; }
  if (r.inSlot !== null) lines.push(`in a server slot from +${fmtS(r.inSlot - r.arrival)} (server, ±0.5 s)`);
  if (r.first !== null) lines.push(`first chunk after ${fmtS(r.first - r.arrival)} (this client)`);
  else lines.push(`waiting for its first chunk for ${fmtS((r.end ?? s.latestT) - r.arrival)} (this client)`);
  lines.push(`${plural(r.tokens.length, "chunk")}${r.reason ? ` · ${finishText(r.reason)}` : " · streaming"}`);
  return lines;
}

// ------------------------------------------------------------ the request panel and the diagnosis
// The server's figures that held at time t (the last scrape at or before it), in words, or "".
function serverAt(s, t) {
  let p = null;
  for (const q of s.scrapes) { if (q.t <= t) p = q; else break; }
  if (!p || !p.server) return "";
  const g = p.server.gauges, bits = [];
  if (g.waiting !== null) bits.push(`${g.waiting} waiting`);
  if (g.running !== null) bits.push(`${g.running} running`);
  if (!bits.length) return "";
  return `the server reported ${bits.join(" and ")} at that time (its /metrics, scraped ${fmtS(Math.max(0, t - p.t))} before)`;
}

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

export function clientNote(s, r) {
  const lines = [];
  if (r.inSlot !== null) lines.push(`in a server slot from +${fmtS(r.inSlot - r.arrival)} (server, ±0.5 s: its /slots)`);
  if (r.end === null && r.first === null) lines.push(`waiting for its first chunk: ${fmtS(s.latestT - r.arrival)} so far (this client)`);
  return lines.join("\n");
}

export function clientState(r) {
  return r.rejected ? "rejected" : r.end !== null ? finishText(r.reason) : r.first !== null ? "streaming" : "waiting for first chunk";
}

export function clientAccounting(s, r) {
  if (r.rejected) return [el("div", "acc-total", `rejected: ${r.rejected}`)];
  const out = [];
  const ttft = r.ttft ?? (r.first !== null ? r.first - r.arrival : null);
  const here = r.pageFirstDelivery;
  if (ttft !== null) {
    out.push(el("div", "acc-total", `time to first chunk ${fmtS(ttft)}, measured by this client (sent → first chunk with text read)` +
      (here !== null ? ` · + ${fmtS(here)} to reach this page` : "")));
  } else out.push(el("div", "acc-total", `no chunk yet after ${fmtS((r.end ?? s.latestT) - r.arrival)} (this client)`));
  const gaps = r.gaps ?? r.tokens.slice(1).map((t, i) => t - r.tokens[i]);
  if (gaps.length) {
    out.push(el("div", "acc-total", `then ${gaps.length} more chunks: mean gap ${fmtS(mean(gaps))}, longest ${fmtS(Math.max(...gaps))} (this client)`));
  }
  if (r.end !== null && r.outputTokens !== null && r.outputTokens !== undefined) {
    out.push(el("div", "acc-total", `the server's usage: ${r.promptTokens ?? "?"} prompt, ${r.outputTokens} output tokens`));
  }
  out.push(el("div", "acc-total muted", "what the server did before the first chunk (queue, prefill) is not visible from a client"));
  return out;
}

export function diagnoseClient(s, r) {
  if (r.end === null) {
    if (r.first === null) {
      const waited = s.latestT - r.arrival, srv = serverAt(s, s.latestT);
      return {cause: "first_chunk", numbers: {first_chunk: waited},
              text: `So far it has waited ${fmtS(waited)} for its first chunk (measured by this client)` +
                (srv ? `; ${srv}` : "") + ". The full diagnosis comes when it finishes."};
    }
    return {cause: "streaming", numbers: {first_chunk: r.first - r.arrival},
            text: `First chunk after ${fmtS(r.first - r.arrival)} (this client); ${plural(r.tokens.length, "chunk")} so far. ` +
              "The full diagnosis comes when it finishes."};
  }
  if (r.ttft === null) return {cause: r.reason, numbers: {}, text: `It ended (${finishText(r.reason)}) before its first chunk.`};
  const total = r.e2e, streaming = Math.max(0, total - r.ttft), gaps = r.gaps || [];
  const numbers = {total, first_chunk: r.ttft, streaming};
  if (r.ttft >= streaming) {
    const srv = serverAt(s, r.arrival + r.ttft / 2);
    return {cause: "first_chunk", numbers,
            text: `Most of this request's ${fmtS(total)} was waiting for its first chunk (${fmtS(r.ttft)}, measured by this ` +
              `client): the server's queueing and prefill are inside that time, and a client cannot tell them apart` +
              (srv ? `; ${srv}` : "") + "."};
  }
  const longest = gaps.length ? Math.max(...gaps) : null, srv = serverAt(s, r.first + streaming / 2);
  return {cause: "streaming", numbers,
          text: `Most of this request's ${fmtS(total)} was streaming its ${r.tokens.length} chunks (${fmtS(streaming)}, ` +
            `measured by this client)` + (gaps.length ? `: a mean gap of ${fmtS(mean(gaps))}, the longest ${fmtS(longest)}` : "") +
            (srv ? `; ${srv}` : "") + "."};
}
