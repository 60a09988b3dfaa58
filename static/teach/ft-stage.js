// First Token: the lesson's stage. A lesson's explanation and the parts it points at must be on
// screen together, in the default (solo) mode on a laptop as on a projector, so on the full page
// the lesson banner leaves the centre column for a row of its own across the page, under the
// header, and stays there (sticky, wider than a phone) while the page scrolls the centre's strips
// into view; the side panels stay in view beside them (sticky, each scrolling inside itself:
// ft.css). Left in the centre, the banner scrolled off the top as the tour scrolled its parts into
// view (its text ran from -230 to -166 px at 1366x768). This file docks the banner, measures the
// header and the banner into CSS variables (--head-h, --dock-h: CSS px inside the zoomed body)
// which ft.css's rules use, and says where the free part of the window starts (`dockBottom`,
// screen px), for scrolling a step's parts below it (ft-tour.js). And the header stays one row
// from 1280 px wide (and in presenter mode): `fitHeader` drops its least needed parts, in a set
// order, until the row fits.
import {$} from "ft/util";

const zoom = () => parseFloat(getComputedStyle(document.body).zoom) || 1;
const header = () => document.querySelector("header.top");
const sticky = (e) => !!e && getComputedStyle(e).position === "sticky";
const shown = (e) => !!e && !e.hidden && e.getClientRects().length > 0;

function measure() {
  const z = zoom(), head = header(), lesson = $("lesson");
  const h = head ? head.getBoundingClientRect().height : 0;
  const l = shown(lesson) && sticky(lesson) ? lesson.getBoundingClientRect().height : 0;
  document.body.style.setProperty("--head-h", `${h / z}px`);
  document.body.style.setProperty("--dock-h", `${(h + l) / z}px`);
}

// Screen px from the window's top to the end of what stays on it (the header and the docked
// banner, where they are sticky: not on a phone, where both scroll with the page).
export function dockBottom() {
  const lesson = $("lesson"), head = header();
  let bottom = sticky(head) ? head.getBoundingClientRect().bottom : 0;
  if (shown(lesson) && sticky(lesson)) bottom = Math.max(bottom, lesson.getBoundingClientRect().bottom);
  return bottom;
}

// Least needed first. Presenter mode (ft.css already drops the schedule, the p90/p99 figures, the
// model line and the long labels there): the figures' second values (SLO met %, accepted length),
// the running count (the batch slots show it), the brand's name, the connection pill, the waiting
// count, goodput. Solo, from 1280 px wide, before those: delivery to this page (a page-side
// measure), the schedule (the controls show it), the model line's details (its tooltip keeps
// them), the tails (p90 · p99). A figure the tour points at now stays.
const DROP = [".v-sub", ".fig:has(#h-running)", ".brand-name", ".conn", ".fig:has(#h-waiting)", ".fig:has(#h-goodput)"];
const SOLO_DROP = [".fig-group:has(#h-delivery)", ".fig.policy", ".model-more", ".fig.wide", ...DROP];
// Solo from 1280 px wide the header is one row; narrower, the brand's row and then one row of
// figures (ft.css); a phone's wraps as it must.
const PHONE_PX = 760;

const fits = (head) => [head, head.querySelector(".headline")].every((e) => !e || e.scrollWidth <= e.clientWidth + 1);

export function fitHeader() {
  const head = header();
  if (!head) return;
  for (const e of head.querySelectorAll(".dropped")) e.classList.remove("dropped");
  const present = document.body.classList.contains("present");
  if (!present && window.innerWidth <= PHONE_PX) return;
  for (const sel of present ? DROP : SOLO_DROP) {
    if (fits(head)) return;
    for (const e of head.querySelectorAll(sel)) if (!e.classList.contains("spot") && !e.querySelector(".spot")) e.classList.add("dropped");
  }
}

// The banner into its own row across the page (once: it stays there in every mode).
function dock() {
  const lesson = $("lesson"), grid = document.querySelector("main.grid");
  if (lesson && grid && lesson.parentElement !== grid) grid.prepend(lesson);
}

// Presenter mode on or off: the header's parts and the banner's height change.
export function restage() {
  fitHeader();
  measure();
}

export function init() {
  dock();
  const watch = new ResizeObserver(measure);
  if (header()) watch.observe(header());
  if ($("lesson")) watch.observe($("lesson"));
  window.addEventListener("resize", fitHeader);
  restage();
}
