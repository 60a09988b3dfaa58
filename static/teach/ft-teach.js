// First Token: the teaching layer's hub and its presets. The boot file gives it the teaching
// parts (diagnosis, tour, measure, compare; none on an /embed) and it passes each of them
// the 4 Hz DOM tick (the boot file hands their event reactions to the page's dispatch). This
// file also draws the presets panel (one button per `hello.presets` entry, each sending
// `{"type": "preset", "name": …}`), applies `/?preset=NAME` once on load, and shows the lesson
// banner: the active preset (from the `preset` event, so every page and a replayed trace show
// it) with its explanation, the number that proves it, and that number measured live
// (ft-figures.js).
import {send} from "ft/connection";
import {proofText, runSays} from "ft/figures";
import {active as replaying} from "ft/replay";
import {ROLES} from "ft/state";
import {$, el, seededText} from "ft/util";

// The functions that read the page state take it as `s`; `embed` says whether this is an
// /embed (its ?preset= and banner only).
let urlDone = false;

export let active = null;   // the last `preset` event: {name, title, explain, watch, t}
export let lesson = null;   // set by the tour while it runs: {kicker, title, text, watch, live, focus}
export function setLesson(l) { lesson = l; }

export const presets = (s) => (s.hello && s.hello.presets) || [];
export const preset = (s, name) => presets(s).find((p) => p.name === name) || null;

// A reset (every preset and comparison starts with one) cancels everything in flight: in a
// classroom the presenter is asked first when students' questions would go. False: don't.
export function confirmReset(s, what) {
  const asking = [...s.reqs.values()].filter((r) => r.source === "join" && r.end === null);
  if (!asking.length || document.body.dataset.role !== ROLES.PRESENTER) return true;
  const who = [...new Set(asking.map((r) => r.label || r.id))];
  const list = who.slice(0, 5).join(", ") + (who.length > 5 ? ` and ${who.length - 5} more` : "");
  return window.confirm(`${asking.length} student question${asking.length > 1 ? "s are" : " is"} still ` +
                        `running or waiting (${list}). ${what} resets the engine and cancels ` +
                        `${asking.length > 1 ? "them" : "it"}. Go ahead?`);
}

// What a feature asks of the server before a lesson it draws starts from this page (ft-candidates.js:
// the sampling lesson's candidates from its first token on), registered by ft-app.js.
const before = [];
export const beforeApply = (f) => before.push(f);
export const apply = (s, name) => confirmReset(s, "Starting a lesson") && (before.forEach((f) => f(name)), send({type: "preset", name}));

// Which part of the page matters for a preset (presenter mode enlarges it; the tour spots it).
export const FOCUS = {idle: "timeline", queueing: "queue", "long-document": "timeline", "many-users": "slots",
                      "small-cache": "kv", "kv-cache-off": "steps", "shared-prefix": "blocks", "static-batching": "timeline",
                      "continuous-batching": "timeline", "chunked-prefill": "timeline", "prefill-first": "timeline",
                      "buffered-proxy": "timeline", "slow-network": "timeline", "cold-start": "timeline",
                      speculative: "timeline", "speculative-busy": "timeline", weights: "steps", disaggregation: "timeline"};

// A preset's value as this engine applies it: numbers clamped to its limits (engine/teach/presets.py).
export function clamp(s, name, v) {
  const lim = s.limits[name];
  return lim && typeof v === "number" && (lim.kind === "int" || lim.kind === "float") ? Math.min(lim.max, Math.max(lim.min, v)) : v;
}

// Every setting as applying the preset leaves it: defaults, then the preset's own values.
export function presetSettings(s, name) {
  const p = preset(s, name), out = {};
  for (const k in s.limits) out[k] = s.limits[k].default;
  if (p) for (const k in p.settings) if (k in s.limits) out[k] = clamp(s, k, p.settings[k]);
  return out;
}

// The lesson running (the last preset applied) for the timeline's window, which fits its requests
// (ft-window.js): when it was applied and when its last timed action came (engine time), or null.
export function lessonSpan(s) {
  if (!active) return null;
  const p = preset(s, active.name), at = ((p && p.actions) || []).map((a) => a.at || 0);
  return {t: active.t, last: active.t + Math.max(0, ...at)};
}

export const focus = () => (lesson && lesson.focus) || (active && FOCUS[active.name]) || "";

function buildPresets(s) {
  const list = presets(s);
  $("teach").hidden = !list.length && !(s.hello && s.hello.mode === "engine");
  $("presets").replaceChildren(...list.map((p, i) => {
    const b = el("button", "preset");
    b.dataset.preset = p.name;
    b.append(el("span", "key", i < 9 ? String(i + 1) : ""), el("span", "", p.title));
    b.title = `${p.explain}\n\nWatch: ${p.watch}\n(/?preset=${p.name}${i < 9 ? `, key ${i + 1}` : ""})`;
    b.addEventListener("click", () => apply(s, p.name));
    return b;
  }));
  // Presenter mode hides the controls: its own list, in the timeline's head.
  const pick = $("present-lessons");
  if (!pick) return;
  pick.replaceChildren(el("option", "", "Lessons…"), ...list.map((p, i) => {
    const o = el("option", "", `${i < 9 ? `${i + 1} · ` : ""}${p.title}`);
    o.value = p.name;
    return o;
  }));
  pick.firstChild.value = "";
  if (!pick.dataset.wired) {
    pick.dataset.wired = "1";
    pick.addEventListener("change", () => { if (pick.value) apply(s, pick.value); pick.value = ""; pick.blur(); });
  }
}

// `/?preset=NAME` is sent once, after the first hello, before the URL's settings (which then
// adjust the preset). An unknown name is the server's to refuse (an `error` names it). On an
// /embed, one of maybe many article readers of one server, the preset resets the engine they all
// watch: it waits for the stats (`subscribers`: pages watching; the second after it connected, so
// a reloaded page's own old socket is gone) and runs at once only when this page is the only one;
// else the frame asks, saying whom it resets. (A lesson with a shipped recording never gets here:
// server/pages.py replays that for the reader instead.)
let embedAsk = null;   // the preset an /embed waits to run, until the stats say who watches
let statsSeen = 0;     // live stats since this page connected
function applyUrl(s, embed) {
  if (urlDone) return;
  urlDone = true;
  const name = new URLSearchParams(location.search).get("preset");
  if (!name || replaying()) return;   // a replayed trace's page changes nothing
  if (embed) embedAsk = name;
  else apply(s, name);
}

function askEmbed(s, stats) {
  const name = embedAsk, others = Math.max(0, (stats.subscribers || 1) - 1);
  embedAsk = null;
  if (!others) { apply(s, name); return; }
  const p = preset(s, name), box = $("embed-ask");
  if (!box) return;
  $("embed-ask-text").textContent = `The lesson "${p ? p.title : name}" runs on this server's one engine, which ` +
    `${others === 1 ? "1 other page is" : `${others} other pages are`} watching too: running it resets the engine for ` +
    `${others === 1 ? "that page" : "all of them"} and cancels what runs now.`;
  box.hidden = false;
  $("embed-run").onclick = () => { box.hidden = true; apply(s, name); };
}

// What it does on events (ft-state.js createDispatch), before the controls see them: a URL's
// preset goes out before its settings. An embed runs its ?preset= and shows its banner; no
// presets panel.
export const reactions = (embed) => ({
  preset(ev) { active = ev; },
  reset() { active = null; },   // a preset's own reset comes before it
  hello(ev, s) {
    active = null;
    if (!embed) buildPresets(s);
    applyUrl(s, embed);
  },
  stats(ev, s) { if (embedAsk && s.connectT !== null && ev.t >= s.connectT && ++statsSeen >= 2) askEmbed(s, ev); },
});

// The banner: the tour's step while it runs, else the active preset (the tour shows it at once,
// before the next tick, to give it the focus).
export function banner(s) {
  const p = active;
  const les = lesson || (p && {kicker: "preset", title: p.title, text: p.explain + seededText(preset(s, p.name)) + runSays(p.name, s, p.t), watch: p.watch,
                               live: proofText(p.name, s, p.t)});
  const box = $("lesson");
  box.hidden = !les;
  for (const b of document.querySelectorAll("#presets .preset")) b.classList.toggle("on", !!p && b.dataset.preset === p.name);
  if (!les) return;
  $("lesson-kicker").textContent = les.kicker;
  $("lesson-title").textContent = les.title;
  $("lesson-text").textContent = les.text;
  $("lesson-watch").textContent = les.watch || "";
  $("lesson-live").textContent = les.live || "";
  $("lesson-live").parentElement.hidden = !les.live;
  $("lesson-nav").hidden = !lesson;
  // Settings moved away from the preset since it was applied: say so, the figure may not prove it then.
  const def = p && !lesson && preset(s, p.name);
  // (a value the preset's own timed actions set counts as the preset's: `weights` switches mid-run)
  const timed = (k) => (def.actions || []).some((a) => a.settings && a.settings[k] === s.settings[k]);
  const moved = def ? Object.keys(def.settings).filter((k) => k in s.settings && s.settings[k] !== clamp(s, k, def.settings[k]) && !timed(k)) : [];
  $("lesson-moved").textContent = moved.length ? `settings changed since: ${moved.join(", ")}` : "";
}

// The 4 Hz DOM tick: the parts first (the tour writes its step's live figure), then the banner,
// so the banner's figure is this tick's, as the header's and the strips' are (it lagged a tick:
// "with 0 running" beside a header's 2/4). `parts`: the teaching parts (none on an /embed),
// each a module with an `update(page)` (page: ft-app.js's shared objects).
export function update(page, parts, embed) {
  for (const part of parts) if (part.update) part.update(page);
  banner(page.s);
  if (!embed) document.body.dataset.focus = focus();
}
