// First Token: classroom mode on the main page (hello.role, hello.classroom; server/classroom.py).
// The presenter's page gets a panel with the join address, its QR code (an SVG made by the
// server, parsed as XML: no markup from elsewhere runs), the joined students with a remove
// button each, and "clear the queue"; the presenter can hide it (the header keeps the join
// address) and bring it back. A
// viewer's page keeps drawing everything but its controls are disabled: only the presenter
// changes the engine (the server refuses a viewer's control messages anyway).
import {send} from "ft/connection";
import {$, el} from "ft/util";

const POLL_MS = 2000;   // the class list, while the panel is open
let embed;              // from init: an /embed shows no presenter panel
let pollTimer = null, room = null;   // room: hello.classroom, on the presenter's page

export function init(deps) {
  ({embed} = deps);
  // The header wraps as its figures widen: the panel below it follows.
  new ResizeObserver(place).observe(document.querySelector("header.top"));
}

function svgNode(text) {
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  return svg.nodeName === "svg" ? document.importNode(svg, true) : el("span", "muted", "(no QR code)");
}

function viewer(room) {
  document.body.dataset.role = "viewer";
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
function panel(joined) {
  room = joined;
  let box = $("classroom");
  if (box) box.remove();
  box = el("aside", "classroom-panel");
  box.id = "classroom";
  const head = el("div", "cls-head");
  const hide = el("button", "", "Hide");
  hide.id = "cls-hide";
  hide.addEventListener("click", () => show(false));
  head.append(el("h2", "", "Join the class from your phone"), hide);
  const qr = el("div", "cls-qr");
  qr.append(svgNode(room.qr_svg));
  const url = el("div", "cls-url", room.join_url);
  url.id = "cls-url";
  box.append(head, qr, url);
  if (room.join_code) {
    const code = el("div", "cls-code");
    code.append(el("span", "muted", "join code "), el("b", "", room.join_code));
    box.append(code);
  }
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
  document.body.append(box);

  let toggle = $("btn-classroom");
  if (!toggle) {
    toggle = el("button", "cls-toggle", "Classroom");
    toggle.id = "btn-classroom";
    toggle.addEventListener("click", () => show(box.hidden));
    $("conn").after(toggle);
  }
  show(true);
}

// The panel sits over the request panel, below the header.
function place() {
  const box = $("classroom");
  if (!box) return;
  const top = Math.round(document.querySelector("header.top").getBoundingClientRect().bottom) + 8;
  box.style.top = `${top}px`;
  box.style.maxHeight = `calc(100vh - ${top + 12}px)`;
}

// Hidden, the panel leaves its address on the toggle, so a late student can still join.
function show(on) {
  const box = $("classroom");
  box.hidden = !on;
  $("btn-classroom").textContent = on ? "Classroom" :
    `Join: ${room.join_url}${room.join_code ? ` · code ${room.join_code}` : ""}`;
  place();
  clearInterval(pollTimer);
  if (on) { poll(); pollTimer = setInterval(poll, POLL_MS); }
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
  $("cls-count").textContent = `Students (${here.length})`;
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

export function onHello(ev) {
  document.body.dataset.role = ev.role || "solo";
  const room = ev.classroom;
  if (!room) return;
  if (ev.role === "viewer") viewer(room);
  else if (ev.role === "presenter" && !embed) panel(room);
}
