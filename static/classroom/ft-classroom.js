// First Token: classroom mode on the main page (hello.role, hello.classroom; server/classroom.py).
// The presenter's page gets a panel with the join address, its QR code (an SVG made by the
// server, parsed as XML: no markup from elsewhere runs), the joined students with a remove
// button each, and "clear the queue"; or a small join card in a corner (see "presenter"). A
// viewer's page keeps drawing everything but its controls are disabled: only the presenter
// changes the engine (the server refuses a viewer's control messages anyway).
import {send} from "ft/connection";
import {ROLES} from "ft/state";
import {$, el} from "ft/util";

const POLL_MS = 2000;   // the class list, while the panel is open
let pollTimer = null, room = null;   // room: hello.classroom, on the presenter's page

export function wire() {
  // The header wraps as its figures widen: the panel below it follows.
  new ResizeObserver(place).observe(document.querySelector("header.top"));
  addEventListener("resize", () => update());
}

function svgNode(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  return svg.nodeName === "svg" ? document.importNode(svg, true) : el("span", "muted", "(no QR code)");
}

function viewer(room) {
  document.body.dataset.role = ROLES.VIEWER;
  const controls = $("controls");
  if (!controls) return;   // /embed: nothing to disable
  // Everything that would change the engine; `data-view` marks what changes only this page's
  // view (presenter mode, saving or loading a trace, slow motion).
  for (const input of controls.querySelectorAll("input, button, textarea")) input.disabled = !("view" in input.dataset);
  if (!$("viewer-note")) {
    const note = el("p", "viewer-note", "The presenter controls the engine; this page watches. " +
                    `Ask the model from your phone: ${room.join_url}`);
    note.id = "viewer-note";
    controls.prepend(note);
  }
}

// ------------------------------------------------------------ presenter
// Two faces: the panel (the join address and QR code large, the class list, clear the queue)
// and a small join card (a small QR code, the code, the address, how many joined). The panel
// shows until the first students join, then gives way to the card; the presenter's own choice
// (the panel's Collapse, the card's Open, the header's Classroom button) is remembered across
// reloads. While the tour runs, the card stands in for the panel, and the card takes the first
// corner of the window where it covers neither the lesson, the timeline, the request's
// explanation nor anything the step points at (none free: it steps aside, and the header's
// button carries the code).
const CHOICE = "ft-classroom";   // localStorage: "open" | "card", the presenter's last choice
let anyJoined = false;   // students have joined since this page opened

function chosen() {
  try { return localStorage.getItem(CHOICE); } catch (e) { return null; }
}
function choose(mode) {
  try { localStorage.setItem(CHOICE, mode); } catch (e) { /* private mode: not kept */ }
  show();
}
const wanted = () => chosen() || (anyJoined ? "card" : "open");
const touring = () => document.body.classList.contains("touring");

function qrBox(cls) {
  const qr = el("div", cls);
  qr.append(svgNode(room.qr_svg));
  return qr;
}

function codeLine() {
  const code = el("div", "cls-code");
  code.append(el("span", "muted", "join code "), el("b", "", room.join_code));
  return code;
}

function card() {
  const box = el("aside", "cls-card");
  box.id = "cls-card";
  box.hidden = true;
  const open = el("button", "mini", "Open");
  open.id = "cls-open";
  open.title = "the class list, a large QR code, clear the queue";
  open.addEventListener("click", () => choose("open"));
  const count = el("span", "cls-card-count", "");
  count.id = "cls-card-count";
  const foot = el("div", "cls-card-foot");
  foot.append(count, open);
  const text = el("div", "cls-card-text");
  text.append(el("b", "", "Join the class"), urlBox("cls-card-url", room.join_url));
  if (room.join_code) text.append(codeLine());
  text.append(foot);
  box.append(qrBox("cls-card-qr"), text);
  return box;
}

// An address that breaks only where a reader expects it to, before its port and its path
// ("http://127.0.0.1:5638/join" broke as "http://127.0.0.1:563" / "8/join"): a <wbr> before each
// ":" and "/" after the scheme; a part wider than its box still wraps (CSS: overflow-wrap).
function urlBox(cls, url) {
  const box = el("div", cls), scheme = (url.match(/^[a-z]+:\/\//) || [""])[0];
  box.append(scheme);
  for (const part of url.slice(scheme.length).split(/(?=[:/])/)) box.append(document.createElement("wbr"), part);
  return box;
}

function panel(joined) {
  room = joined;
  for (const id of ["classroom", "cls-card"]) if ($(id)) $(id).remove();
  const box = el("aside", "classroom-panel");
  box.id = "classroom";
  const head = el("div", "cls-head");
  const hide = el("button", "", "Collapse");
  hide.id = "cls-hide";
  hide.title = "a small join card instead (remembered)";
  hide.addEventListener("click", () => choose("card"));
  head.append(el("h2", "", "Join the class from your phone"), hide);
  const url = urlBox("cls-url", room.join_url);
  url.id = "cls-url";
  box.append(head, qrBox("cls-qr"), url);
  if (room.join_code) box.append(codeLine());
  if (room.view_url) {
    const view = el("div", "cls-view");
    view.id = "cls-view";
    view.append(el("span", "muted", "others watch at "), el("b", "", room.view_url));
    box.append(view);
  }
  const lim = room.limits;
  box.append(el("p", "note", `One prompt at a time per student, ${lim.burst} in a row, then one every ` +
                `${lim.every_s} s; names up to ${lim.name_chars} characters, prompts up to ${lim.prompt_chars}. ` +
                `Joins: ${lim.join_burst} in a row from one network address, then one every ` +
                `${lim.join_every_s} s; ${lim.per_address} students per address, ${lim.students} in all.`));
  const listHead = el("div", "cls-head");
  const clear = el("button", "danger", "Clear the queue");
  clear.id = "cls-clear";
  clear.title = "cancel every waiting request (running ones finish)";
  clear.addEventListener("click", () => send({type: "clear_queue"}));
  const count = el("h3", "", "Students");
  count.id = "cls-count";
  listHead.append(count, clear);
  const list = el("ul", "cls-list");
  list.id = "cls-list";
  const refused = el("p", "note", "");
  refused.id = "cls-refused";
  refused.hidden = true;
  box.append(listHead, refused, list);
  document.body.append(box, card());

  let toggle = $("btn-classroom");
  if (!toggle) {
    toggle = el("button", "cls-toggle", "Classroom");
    toggle.id = "btn-classroom";
    toggle.title = "the class panel or the small join card (remembered)";
    toggle.addEventListener("click", () => choose($("classroom").hidden ? "open" : "card"));
    $("conn").after(toggle);
  }
  show();
  clearInterval(pollTimer);
  poll();
  pollTimer = setInterval(poll, POLL_MS);
}

const zoom = () => parseFloat(getComputedStyle(document.body).zoom) || 1;

// The panel sits over the request panel, below the header (CSS px inside the zoomed body).
function place() {
  const box = $("classroom");
  if (!box) return;
  const z = zoom(), top = Math.round(document.querySelector("header.top").getBoundingClientRect().bottom / z) + 8;
  box.style.top = `${top}px`;
  box.style.maxHeight = `calc(${100 / z}vh - ${top + 12}px)`;
}

// What the card must not cover, tour or not: the lesson banner, the timeline, the request panel's
// explanation (its diagnosis and measured stages: at 1280x800 in presenter mode the card sat over
// "Why does this response feel slow?"), and every part a tour step points at. Each as much of it
// as its scrolling panel shows (a part scrolled out of the panel is covered by nothing).
const KEEP_CLEAR = [".timeline-wrap", ".why-h", "#d-why", "#d-accounting"];
function obstacles() {
  const out = [];
  const add = (e) => {
    if (!e || !e.getClientRects().length) return;
    let r = e.getBoundingClientRect();
    const panel = e.parentElement && e.parentElement.closest(".panel");
    if (panel && ["auto", "scroll"].includes(getComputedStyle(panel).overflowY)) {
      const p = panel.getBoundingClientRect();
      r = {left: r.left, right: r.right, top: Math.max(r.top, p.top), bottom: Math.min(r.bottom, p.bottom)};
      if (r.bottom <= r.top) return;
    }
    out.push(r);
  };
  if ($("lesson") && !$("lesson").hidden) add($("lesson"));
  for (const sel of KEEP_CLEAR) for (const e of document.querySelectorAll(sel)) add(e);
  for (const e of document.querySelectorAll(".spot")) if (!e.matches("h2, h3, .strip-head")) add(e);
  return out;
}

const MARGIN = 10;   // screen px between the card and the window's edge
// The first corner (bottom right, bottom left, top right, top left under the header) where the
// card covers nothing in the way; null when every corner does.
function corner(w, h) {
  const top = document.querySelector("header.top").getBoundingClientRect().bottom + MARGIN;
  const spots = [[innerWidth - w - MARGIN, innerHeight - h - MARGIN], [MARGIN, innerHeight - h - MARGIN],
                 [innerWidth - w - MARGIN, top], [MARGIN, top]];
  const hit = (x, y, r) => x < r.right && r.left < x + w && y < r.bottom && r.top < y + h;
  const away = obstacles();
  return spots.find(([x, y]) => y >= top - MARGIN && !away.some((r) => hit(x, y, r))) || null;
}

function placeCard() {
  const box = $("cls-card");
  if (!box || box.hidden) return;
  box.style.visibility = "hidden";
  box.style.left = "0px"; box.style.top = "0px";
  const r = box.getBoundingClientRect(), z = zoom(), at = corner(r.width, r.height);
  box.dataset.covered = String(!at);
  if (at) {
    box.style.left = `${at[0] / z}px`; box.style.top = `${at[1] / z}px`;
    box.style.visibility = "";
  }
  label();
}

// The header's button: the code stays on screen when the card has stepped aside.
function label() {
  const box = $("cls-card"), aside = box && !box.hidden && box.dataset.covered === "true";
  $("btn-classroom").textContent = aside && room.join_code ? `Join · code ${room.join_code}` : "Classroom";
}

function show() {
  const box = $("classroom"), small = $("cls-card");
  if (!box) return;
  const mode = touring() ? "card" : wanted();
  box.hidden = mode !== "open";
  small.hidden = mode !== "card";
  document.body.dataset.classroom = mode;
  $("btn-classroom").classList.toggle("primary", mode === "open");
  place();
  placeCard();
  label();
}

// The 4 Hz tick: a tour step started or ended, the page scrolled: the card finds its corner again.
export function update() {
  if (room && $("classroom")) show();
}

async function poll() {
  let clients, refused;
  try {
    const res = await fetch("/classroom/clients");
    if (!res.ok) return;
    ({clients, refused_joins: refused} = await res.json());
  } catch (e) { return; }
  // Joins the server refused (a script flooding /join shows here), by reason.
  const box = $("cls-refused");
  box.hidden = !(refused && refused.total);
  if (!box.hidden) {
    const why = Object.entries(refused.by_code).map(([code, n]) => `${n} ${code.replace(/_/g, " ")}`);
    box.textContent = `${refused.total} join${refused.total === 1 ? "" : "s"} refused: ${why.join(", ")}`;
  }
  const here = clients.filter((c) => !c.removed);
  const first = !anyJoined && here.length > 0;
  anyJoined = anyJoined || here.length > 0;
  $("cls-count").textContent = `Students (${here.length})`;
  $("cls-card-count").textContent = `${here.length} joined`;
  if (first) show();   // the first students: the panel gives way to the card (unless chosen)
  $("cls-list").replaceChildren(...(here.length ? here.map(row) : [el("li", "muted", "nobody has joined yet")]));
}

function row(c) {
  const li = el("li");
  li.dataset.client = c.id;
  const state = c.in_flight ? `asking (${c.in_flight})` : `${c.asked} asked`;
  const remove = el("button", "cls-remove", "Remove");
  remove.title = `cancel ${c.name}'s request and refuse any more`;
  remove.addEventListener("click", () => { send({type: "remove_client", client: c.id}); setTimeout(poll, 300); });
  li.append(el("span", "cls-name", c.name), el("span", "muted", state), remove);
  return li;
}

// A server's hello: this page's role. `embed`: an /embed shows no presenter panel.
export function onHello(ev, embed) {
  document.body.dataset.role = ev.role || ROLES.SOLO;
  const room = ev.classroom;
  if (!room) return;
  if (ev.role === ROLES.VIEWER) viewer(room);
  else if (ev.role === ROLES.PRESENTER && !embed) panel(room);
}
