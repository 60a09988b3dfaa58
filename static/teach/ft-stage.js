// First Token: presenter mode's stage (ft-present.js turns it on). On a projector the lesson's
// explanation and what it points at must be on screen together, so the lesson banner leaves the
// centre column for a row of its own across the page, under the header, and stays there
// (sticky) while the page scrolls the centre's strips into view; the request panel beside them
// stays in view too (sticky, scrolling inside itself). This file moves the banner and measures
// the header and the banner into CSS variables (--head-h, --dock-h: CSS px inside the zoomed
// body), which ft.css's presenter rules use; `dockBottom()` is where the free part of the
// window starts (screen px), for scrolling a step's parts below it (ft-tour.js). And the header
// stays one row: `fitHeader` drops its least needed parts, in DROP's order, until the row fits
// (ft.css already drops the schedule, the p90/p99 figures and the long labels there).
import {$} from "ft/util";

let home = null;   // where the banner lives outside presenter mode: its parent and next sibling

const zoom = () => parseFloat(getComputedStyle(document.body).zoom) || 1;
const header = () => document.querySelector("header.top");

function measure() {
  const z = zoom(), head = header(), lesson = $("lesson");
  const h = head ? head.getBoundingClientRect().height : 0;
  const docked = lesson && !lesson.hidden && lesson.parentElement && lesson.parentElement.matches("main.grid");
  const l = docked ? lesson.getBoundingClientRect().height : 0;
  document.body.style.setProperty("--head-h", `${h / z}px`);
  document.body.style.setProperty("--dock-h", `${(h + l) / z}px`);
}

// Screen px from the window's top to the end of what stays on it (the header, the docked banner).
export function dockBottom() {
  const lesson = $("lesson"), head = header();
  let bottom = head ? head.getBoundingClientRect().bottom : 0;
  if (lesson && !lesson.hidden && document.body.classList.contains("present")) {
    bottom = Math.max(bottom, lesson.getBoundingClientRect().bottom);
  }
  return bottom;
}

// Least needed first: the figures' second values (SLO met %, accepted length), the running count
// (the batch slots show it), the brand's name, the connection pill, the waiting count, goodput.
// A figure the tour points at now stays.
const DROP = [".v-sub", ".fig:has(#h-running)", ".brand-name", ".conn", ".fig:has(#h-waiting)", ".fig:has(#h-goodput)"];

const fits = (head) => head.scrollWidth <= head.clientWidth + 1;

export function fitHeader() {
  const head = header();
  if (!head) return;
  for (const e of head.querySelectorAll(".dropped")) e.classList.remove("dropped");
  if (!document.body.classList.contains("present")) return;
  for (const sel of DROP) {
    if (fits(head)) return;
    for (const e of head.querySelectorAll(sel)) if (!e.classList.contains("spot")) e.classList.add("dropped");
  }
}

export function dock(on) {
  const lesson = $("lesson"), grid = document.querySelector("main.grid");
  if (!lesson || !grid) return;
  if (on && lesson.parentElement !== grid) {
    home = {parent: lesson.parentElement, next: lesson.nextElementSibling};
    grid.prepend(lesson);
  } else if (!on && home && lesson.parentElement === grid) {
    home.parent.insertBefore(lesson, home.next);
  }
  fitHeader();
  measure();
}

export function init() {
  const watch = new ResizeObserver(measure);
  if (header()) watch.observe(header());
  if ($("lesson")) watch.observe($("lesson"));
  measure();
}
