// First Token: the controls and the URL. Sliders, toggles and choice groups are built from
// hello.limits, each a named setting sent as `set`; the address bar carries the settings that differ
// from their defaults, and URL parameters on arrival become one `set`. Also the load,
// burst and reset buttons and the prompt box.
import {send} from "ft/connection";
import {ROLES} from "ft/state";
import {confirmReset} from "ft/teach";
import {$, el, fmtBytes, toast} from "ft/util";
import {choiceText as weightsChoice} from "ft/weights";

// The functions that read the page state take it as `s` (its settings and limits), and
// `embed` whether this is an /embed (no controls).
let built = null;        // the limits (as JSON) the controls were built from
let urlApplied = false;  // the page's URL parameters are sent once, after the first hello
let dragging = null;     // the slider being dragged: arriving settings leave it alone

const LABELS = {
  load: ["Load generator", ""], rate: ["Load (arrival rate)", "req/s"],
  prompt_tokens: ["Prompt length", "tokens"], max_new_tokens: ["Max new tokens", "tokens"],
  slots: ["Batch slots", ""], cache_tokens: ["KV-cache budget", ""],
  kv_cache: ["KV cache", ""], schedule: ["Schedule", ""], scheduling_policy: ["Queue order", ""], max_batched_tokens: ["Step token budget", "tok/step"],
  prefix_caching: ["Prefix caching", ""], temperature: ["Temperature", "0 = greedy"], top_p: ["Top-p", ""],
  max_step_ms: ["Step-time target", "ms"], weights: ["Weights", "read by each decode step"],
  activations: ["Activations", "the 4-bit layers' arithmetic"],
  speculation: ["Speculative decoding", "guesses checked in one forward"], spec_tokens: ["Guesses per step", "tokens"],
  slo_ttft_ms: ["TTFT objective (SLO)", "ms"], slo_tpot_ms: ["Per-token objective (SLO)", "ms/token"],
  buffer_ms: ["Proxy buffer: flush every", "ms · 0 = off"], buffer_bytes: ["Proxy buffer: or at", "bytes · 0 = off"],
  net_latency_ms: ["Network delay (injected)", "ms"], net_jitter_ms: ["Network jitter (injected)", "+0…N ms"],
};
const ORDER = ["rate", "prompt_tokens", "max_new_tokens", "schedule", "scheduling_policy", "max_batched_tokens", "max_step_ms", "slots",
               "cache_tokens", "kv_cache", "prefix_caching", "weights", "activations", "speculation", "spec_tokens", "slo_ttft_ms", "slo_tpot_ms",
               "temperature", "top_p"];
// The way out (server/delivery.py): after the engine's own settings, under their own heading.
const BETWEEN = ["buffer_ms", "buffer_bytes", "net_latency_ms", "net_jitter_ms"];

// The value beside a control's name (a choice group shows its value by the pressed option).
function valueText(s, name, v) {
  const kind = s.limits[name] && s.limits[name].kind;
  if (kind === "bool") return v ? "on" : "off";
  if (kind === "choice") return "";
  if (name === "cache_tokens" && s.hello) return `${v} tok · ${fmtBytes(v * s.hello.kv_bytes_per_token)}`;
  if (name === "max_step_ms" && v === 0) return "off";
  return String(v);
}

function toggleInput(s, name, lim, head) {
  const input = el("input");
  input.type = "checkbox";
  input.name = name;
  input.className = "toggle";
  input.addEventListener("change", () => send({type: "set", settings: {[name]: input.checked}}));
  head.prepend(input);
  return input;
}

// A choice as a group of radio buttons drawn as segments: Tab reaches the group, the arrow
// keys move the choice (each move sends it), as with any radio group.
function choiceInput(s, name, lim, head, row) {
  const group = el("div", "segmented");
  group.setAttribute("role", "radiogroup");
  group.setAttribute("aria-label", head.querySelector(".ctl-name").textContent);
  for (const choice of lim.choices) {
    const option = el("label", "seg-opt");
    const input = el("input");
    input.type = "radio"; input.name = name; input.value = choice;
    input.addEventListener("change", () => { if (input.checked) send({type: "set", settings: {[name]: choice}}); });
    // the weights' copies say their format and bytes per step, from hello.weights
    option.append(input, el("span", "", name === "weights" ? weightsChoice(s, choice) : choice));
    group.append(option);
  }
  row.append(group);
  return group;
}

// A slider shows its value while dragged (settings arriving meanwhile leave it alone) and sends on release.
function rangeInput(s, name, lim, head, row) {
  const input = el("input");
  input.type = "range";
  input.name = name;
  input.min = lim.min; input.max = lim.max; input.step = lim.step;
  input.addEventListener("input", () => { head.querySelector("output").textContent = valueText(s, name, +input.value); });
  input.addEventListener("pointerdown", () => { dragging = name; });
  input.addEventListener("pointerup", () => { dragging = null; });
  input.addEventListener("change", () => {
    const v = lim.kind === "int" ? parseInt(input.value, 10) : parseFloat(input.value);
    send({type: "set", settings: {[name]: v}});
  });
  row.append(input);
  return input;
}

function controlRow(s, name, lim) {
  const [label, unit] = LABELS[name] || [name, ""];
  const row = el("div", "ctl");
  row.dataset.name = name;
  row.title = lim.doc || "";
  const head = el("label", "ctl-head");
  // the value and its unit kept together: they move under the name when the panel is narrow
  // ("100 ms/token" was cut to "100 ms/to", "0 = greedy" to "0 = greed")
  const num = el("span", "ctl-num");
  num.append(el("output", "ctl-val"), el("span", "ctl-unit", unit));
  head.append(el("span", "ctl-name", label), num);
  row.append(head);
  const make = {bool: toggleInput, choice: choiceInput}[lim.kind] || rangeInput;
  const input = make(s, name, lim, head, row);
  input.id = `set-${name}`;
  // a slider sits beside its heading, not inside it: the heading names it for a screen reader
  if (input.type === "range") head.htmlFor = input.id;
  if (lim.applies && lim.applies !== "live") {
    const tag = el("span", "applies", lim.applies);
    tag.title = `when a change takes effect: ${lim.applies}`;
    head.querySelector(".ctl-name").after(tag);
  }
  return row;
}

// Rebuilt only when the limits changed (a new server may offer other settings).
function buildControls(s) {
  const key = JSON.stringify(s.limits);
  if (built === key) { applySettings(s); return; }
  built = key;
  const names = ORDER.filter((n) => n in s.limits).concat(
    Object.keys(s.limits).filter((n) => !ORDER.includes(n) && !BETWEEN.includes(n) && n !== "load"));
  const between = BETWEEN.filter((n) => n in s.limits);
  const rows = names.map((name) => controlRow(s, name, s.limits[name]));
  if (between.length) {
    const head = el("h3", "ctl-group", "Between the server and you");
    head.title = "what lies on the way out, after the engine has timed everything: a buffering proxy (real) " +
      "and a network delay (injected); the engine's own times do not change";
    rows.push(head, ...between.map((name) => controlRow(s, name, s.limits[name])));
  }
  $("settings").replaceChildren(...rows);
  applySettings(s);
}

function applySettings(s) {
  for (const [name, v] of Object.entries(s.settings)) {
    const input = $(`set-${name}`);
    if (input && dragging !== name) {
      if (input.type === "checkbox") input.checked = !!v;
      else if (input.type === "range") input.value = v;
      else for (const option of input.querySelectorAll("input")) option.checked = option.value === v;
      input.closest(".ctl").querySelector("output").textContent = valueText(s, name, v);
      if (name === "max_step_ms") input.closest(".ctl").querySelector(".ctl-unit").textContent = v ? "ms" : "(0 = off)";
    }
  }
  const btn = $("btn-load");
  btn.dataset.on = String(!!s.settings.load);
  btn.textContent = s.settings.load ? "Stop load" : "Start load";
}

// Parameters of the page itself, not settings: teaching (ft-teach.js, ft-tour.js,
// ft-present.js) and the view (server/pages.py: an /embed's panels, theme, size, trace).
const PAGE_PARAMS = ["preset", "tour", "present", "panels", "theme", "compact", "trace", "loop", "autoplay", "live"];
// Those the address bar keeps across settings changes, so a reload shows the same page: the
// view always; an embed also its preset (reloading an article's frame runs its lesson again).
const KEPT = embed => PAGE_PARAMS.filter((n) => embed || !["preset", "tour"].includes(n));

// After any settings change the address bar carries the page's own parameters and the
// settings that differ from their defaults.
function writeUrl(s, embed) {
  const q = new URLSearchParams(), now = new URLSearchParams(location.search);
  for (const name of KEPT(embed)) if (now.has(name)) q.set(name, now.get(name));
  for (const [name, v] of Object.entries(s.settings)) {
    const lim = s.limits[name];
    if (lim && v !== lim.default) q.set(name, String(v));
  }
  const qs = q.toString();
  history.replaceState(null, "", location.pathname + (qs ? `?${qs}` : ""));
}

function applyUrl(s) {
  const changes = {}, ignored = [];
  for (const [name, raw] of new URLSearchParams(location.search)) {
    if (PAGE_PARAMS.includes(name)) continue;   // this page's view and teaching, not engine settings
    const lim = s.limits[name];
    if (!lim) { ignored.push(name); continue; }
    if (lim.kind === "bool") changes[name] = ["1", "true", "on", "yes"].includes(raw.toLowerCase());
    else if (lim.kind === "choice") changes[name] = raw;
    else changes[name] = Number(raw);   // the server validates and names a bad field
  }
  if (ignored.length) toast(`ignored unknown URL parameter(s): ${ignored.join(", ")}`);
  if (Object.keys(changes).length) send({type: "set", settings: changes});
}

export function wire(s, ui, embed) {
  if (embed) return;
  $("btn-load").addEventListener("click", () => send({type: "load", on: !s.settings.load}));
  $("btn-burst").addEventListener("click", () => send({type: "burst", n: parseInt($("burst-n").value, 10) || 8}));
  $("btn-reset").addEventListener("click", () => confirmReset(s, "Reset") && send({type: "reset"}));
  $("btn-reload").addEventListener("click", () => reloadModel(s));
  const form = $("prompt-form"), box = $("prompt");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const prompt = box.value.trim();
    if (!prompt) return;
    if (send({type: "submit", prompt})) { ui.awaitOwn = true; box.value = ""; }
  });
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
  });
}

// A cold start on demand: the model loaded again from its on-disk cache (a `reload` message);
// requests running or waiting meanwhile wait for it, so ask first when there are any.
function reloadModel(s) {
  const busy = [...s.reqs.values()].filter((r) => r.end === null).length;
  if (busy && !window.confirm(`${busy} request${busy > 1 ? "s are" : " is"} running or waiting: reloading the model ` +
                              "makes them wait until it has loaded. Reload?")) return;
  send({type: "reload"});
}

// The first hello applies the page's URL, except on a classroom viewer's page: its URL
// settings stay its own (only the presenter changes the engine); every hello (re)builds the controls.
export function onHello(s, embed) {
  if (!urlApplied) {
    urlApplied = true;
    if (s.hello.role !== ROLES.VIEWER) applyUrl(s);
    else if (location.search) toast("viewing a class: URL settings are not sent; the presenter controls the engine");
  }
  if (!embed) buildControls(s);
}

export function onSettings(s, embed) {
  if (!embed) applySettings(s);
  writeUrl(s, embed);
}
