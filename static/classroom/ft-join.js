// First Token: the students' page (/join, classroom mode). Join with a name (and the code when
// the presenter set one), then send one prompt at a time: the answer streams back as
// server-sent events over a POST (server/classroom.py) and the page shows two sets of
// figures side by side, labelled: the engine's own measurements (its `finished` event; on an
// observed server, the classroom app's, as a client of that server) and what this phone
// measured (from pressing Send, so the network is included). The tokens the model itself was
// unsure of (under 30 %, ft-candidates.js) are underlined; a tap on one says how sure it was.
import {UNSURE, exactly, pct, shown} from "ft/candidates";
import {createDispatch} from "ft/state";
import {$, finishText, fmtS, plural} from "ft/util";

const codeRequired = document.body.dataset.codeRequired === "true";
const run = {busy: false, sent: 0, arrivals: [], odds: []};

function say(text, bad) {
  const m = $("msg");
  m.textContent = text;
  m.classList.toggle("bad", !!bad);
}

async function errorText(res) {
  try { return (await res.json()).error.message; } catch (e) { return `the server answered HTTP ${res.status}`; }
}

function showJoin() {
  $("ask-form").hidden = true;
  $("join-form").hidden = false;
  $("who").textContent = "";
  $("name").focus();
}

function joined(name) {
  $("join-form").hidden = true;
  $("ask-form").hidden = false;
  $("who").textContent = `you are ${name}`;
  $("prompt").focus();
}

async function start() {
  const code = new URLSearchParams(location.search).get("code");
  if (codeRequired && code) $("code").value = code;
  try {
    const res = await fetch("/join/session");
    const body = res.ok ? await res.json() : null;
    if (body && body.joined) { joined(body.name); return; }
  } catch (e) { say(`cannot reach the class: ${e.message}`, true); }
  showJoin();
}

async function join(e) {
  e.preventDefault();
  const body = {name: $("name").value};
  if (codeRequired) body.code = $("code").value;
  const res = await fetch("/join/session", {method: "POST", headers: {"Content-Type": "application/json"},
                                            body: JSON.stringify(body)});
  if (!res.ok) { say(await errorText(res), true); return; }
  say("");
  joined((await res.json()).name);
}

// ------------------------------------------------------------ figures
const perS = (n, seconds) => (seconds > 0 ? `${(n / seconds).toFixed(1)}` : "—");

function phoneFigures() {
  const a = run.arrivals;
  if (!a.length) return;
  $("f-ttft-phone").textContent = fmtS((a[0] - run.sent) / 1000);
  // later tokens per second of arrival: the first token's wait is TTFT, not throughput
  if (a.length >= 2) $("f-tps-phone").textContent = perS(a.length - 1, (a[a.length - 1] - a[0]) / 1000);
}

// Who measured the first row: the engine itself, or (observe mode, `measured_by: "client"`) the
// classroom app as a client of the server it watches, which cannot see inside that server.
function engineFigures(ev) {
  const client = ev.measured_by === "client";
  const head = $("f-by");
  head.textContent = client ? "classroom app" : "engine";
  head.title = client ? "measured by the classroom app, a client of the observed server: sending your prompt to the " +
    "first chunk of text read back, and 1 / mean time per later token" : head.dataset.engineTitle;
  $("f-ttft-engine").textContent = fmtS(ev.ttft);
  $("f-tps-engine").textContent = ev.tpot ? perS(1, ev.tpot) : "—";
  const count = (n) => (typeof n === "number" ? plural(n, "token") : "? tokens");
  $("f-note").textContent = `${count(ev.output_tokens)} (${finishText(ev.reason)}); prompt ${count(ev.prompt_tokens)}. ` +
    (client ? "classroom app: measured by the classroom app as a client of the server it watches, from sending your " +
              "prompt there to the first chunk of text it read back, then 1 / time per output token; what happened " +
              "inside that server is not measured. "
            : "engine: measured by the server, from your request's arrival to its first token, then 1 / time per " +
              "output token. ") +
    "this phone: measured here from pressing Send (network included), then tokens per second as they arrived.";
}

// The answer's stream: its start, each token, its end (ft-state.js createDispatch reads the types).
const answer = createDispatch();
answer.on({
  start(ev) { $("answer-state").textContent = `· ${ev.id} · waiting for the first token…`; },
  token(ev) {
    run.arrivals.push(performance.now());
    addToken(ev);
    $("answer-state").textContent = "· streaming";
    phoneFigures();
  },
  finished(ev) {
    $("answer-state").textContent = "· done";
    engineFigures(ev);
  },
  error(ev) {
    $("answer-state").textContent = "· stopped";
    say(ev.message, true);
  },
});

// The answer a span per token: one the model gave under UNSURE underlined, its probability on a tap.
function addToken(ev) {
  const span = document.createElement("span"), p = typeof ev.p_raw === "number" ? ev.p_raw : null;
  span.className = p !== null && p < UNSURE ? "tok-out unsure" : "tok-out";
  span.textContent = ev.text;
  span.dataset.p = p === null ? "" : String(p);
  $("answer").append(span);
  if (p !== null) run.odds.push(p);
  const low = run.odds.filter((x) => x < UNSURE).length;
  $("answer-odds").textContent = run.odds.length ? `${low} of ${run.odds.length} tokens the model was unsure of ` +
    `(under ${Math.round(UNSURE * 100)} %, underlined): tap one` : "";
}

function tapped(e) {
  const span = e.target.closest(".tok-out");
  if (!span || span.dataset.p === "") return;
  const p = Number(span.dataset.p);
  $("answer-odds").textContent = `“${shown(span.textContent)}”: the model gave it ${pct(p)}${exactly(p)}` +
    (p < UNSURE ? " — unsure" : "");
}

// Server-sent events over fetch: blocks separated by a blank line; `data:` lines carry JSON,
// `:` lines are keep-alives.
async function read(res) {
  const reader = res.body.getReader(), decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) if (line.startsWith("data: ")) answer.emit(JSON.parse(line.slice(6)));
    }
  }
}

async function ask(e) {
  e.preventDefault();
  const prompt = $("prompt").value.trim();
  if (!prompt || run.busy) return;
  run.busy = true;
  $("btn-ask").disabled = true;
  say("");
  try {
    run.sent = performance.now();
    run.arrivals = [];
    const res = await fetch("/join/ask", {method: "POST", headers: {"Content-Type": "application/json"},
                                          body: JSON.stringify({prompt})});
    if (!res.ok) {
      say(await errorText(res), true);
      if (res.status === 401) showJoin();
      return;
    }
    $("answer-card").hidden = false;
    $("answer").textContent = "";
    $("answer-odds").textContent = "";
    run.odds = [];
    for (const id of ["f-ttft-engine", "f-tps-engine", "f-ttft-phone", "f-tps-phone"]) $(id).textContent = "—";
    $("f-note").textContent = "";
    await read(res);
  } catch (err) {
    say(`the answer was interrupted: ${err.message}`, true);
  } finally {
    run.busy = false;
    $("btn-ask").disabled = false;
  }
}

function charsLeft() {
  const box = $("prompt");
  $("left").textContent = `${box.maxLength - box.value.length} characters left`;
}

$("join-form").addEventListener("submit", join);
$("answer").addEventListener("click", tapped);
$("ask-form").addEventListener("submit", ask);
$("prompt").addEventListener("input", charsLeft);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask-form").requestSubmit(); }
});
charsLeft();
start();
