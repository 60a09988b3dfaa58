// First Token: presenter mode and the keyboard. Presenter mode (`/?present=1`, key `p` or the
// Present button) is for a projector: everything drawn larger (the canvases too), controls and
// footer details hidden, and the panel that matters for the current preset or tour step
// enlarged (ft.css, body[data-focus]). Shortcuts: ←/→ tour steps, 1–9 presets, `s` slow motion,
// `p` presenter mode, `?` the list, Esc closes it, a sheet, or the tour (space pauses: ft-canvases.js).
// None fires while typing in a field.
import * as replay from "ft/replay";
import * as stage from "ft/stage";
import {apply, presets} from "ft/teach";
import * as tour from "ft/tour";
import {$, toast} from "ft/util";

function setPresent(on) {
  document.body.classList.toggle("present", on);
  stage.restage();   // the header's row and the banner's height change (ft-stage.js)
  const q = new URLSearchParams(location.search);
  if (on) q.set("present", "1"); else q.delete("present");
  const qs = q.toString();
  history.replaceState(null, "", location.pathname + (qs ? `?${qs}` : ""));
  $("btn-present").classList.toggle("primary", on);
  window.dispatchEvent(new Event("resize"));   // plotly charts refit to their new boxes
}

// `s`: slow motion (ft-replay.js) on and off. The replay's own mode is the truth: its
// button, a trace being replayed, or a reconnect may have changed it since the last key.
function slowMotion(feed) {
  if (replay.active()) {
    if (replay.live(feed)) toast("live");
  } else if (replay.slowMotion(feed, 0.25)) {
    toast("slow motion: the last seconds again at ¼ speed (s: back to live)");
  } else {
    toast("nothing to watch again yet");
  }
}

const help = () => { const h = $("help"); h.hidden = !h.hidden; };

// Escape closes the topmost thing open: the shortcuts, a sheet (by its own Close button, which
// does what closing it means), else the tour. Whether it closed anything.
function escape() {
  if (!$("help").hidden) { $("help").hidden = true; return true; }
  for (const [sheet, close] of [["sheet-compare", "c-close"], ["sheet-measure", "m-close"]]) {
    if (!$(sheet).hidden) { $(close).click(); return true; }
  }
  if (tour.index >= 0) { tour.stop(); return true; }
  return false;
}

const typing = (e) => {
  const t = e.target;
  return t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName));
};

function onKey(e, s, ui, feed) {
  if ((typing(e) && e.key !== "Escape") || e.ctrlKey || e.metaKey || e.altKey) return;
  const k = e.key;
  if (k === "ArrowRight") tour.next(s, ui);
  else if (k === "ArrowLeft") tour.prev(s, ui);
  else if (/^[1-9]$/.test(k)) {
    const p = presets(s)[Number(k) - 1];
    if (p) apply(s, p.name); else return;
  } else if (k === "s") slowMotion(feed);
  else if (k === "p") setPresent(!document.body.classList.contains("present"));
  else if (k === "?") help();
  else if (k === "Escape") { if (!escape()) return; }
  else return;
  e.preventDefault();
}

// The 4 Hz tick: a figure that appeared (goodput, speculation) may need the header's room.
export const update = () => stage.fitHeader();

// `s`, `ui`: the page state and its UI state (the presets the number keys pick from, the tour's steps);
// `feed`: what the replay plays to (ft-replay.js), for slow motion.
export function init(s, ui, feed) {
  stage.init();
  document.addEventListener("keydown", (e) => onKey(e, s, ui, feed));
  $("btn-present").addEventListener("click", () => setPresent(!document.body.classList.contains("present")));
  $("btn-help").addEventListener("click", help);
  $("help-close").addEventListener("click", help);
  if (new URLSearchParams(location.search).get("present") === "1") setPresent(true);
}
