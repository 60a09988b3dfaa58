// First Token: the DOM panels, refreshed at 4 Hz. Headline figures (and the schedule that
// runs) and footer, the model line, KV-cache, block and queue read-outs, batch slots and the
// waiting list, and the request detail: state, prefix-cache reuse, preemptions and speculative
// decoding, TTFT and later-token stacked bars, prompt token chips and the output.
// Text from the model or users is only ever set with textContent.
import {renderText, requestLine as oddsLine, wireText} from "ft/candidates";
import {clock, setConn} from "ft/connection";
import {ttftHere, wayOut} from "ft/delivery";
import {instanceLines, instanceState} from "ft/disagg";
import {reqColor, stagesOf} from "ft/palette";
import {active as replaying} from "ft/replay";
import {WINDOW_S, pct, rates, recent, requestLine, speculating} from "ft/speculate";
import {laterTokens, statNote} from "ft/pertoken";
import {percentile, prefillTime, running} from "ft/state";
import {sloText, targetBelowEngine} from "ft/targets";
import {clientAccounting, clientNote, clientState, modelLine, observing} from "ft/server";
import {active as lessonOn, apply as applyPreset, lesson as tourOn} from "ft/teach";
import {$, el, finishText, fmtBytes, fmtS, sourceText} from "ft/util";

// The functions here take what they read: `s` the page state, `ui` its UI state (selected
// request, dirtyDom, awaitOwn), `perf` the counters the footer shows, and `select(id)`, which
// picks the request the detail panel shows. `update(page)` gets them all, as {s, ui, perf, select}.
let detailKey = "";

// Where each later token's time went (`finished.later`), drawn as l-<key> segments.
const LATER = [["decode", "decode step"], ["mixed", "step shared with others' prefill"],
               ["stalled", "waiting: others' prefill"], ["preempted", "preempted"], ["sample", "sample"],
               ["delivery", "delivery (server)"]];
const SHOW_WAITING = 40;

// One stacked bar with its legend: parts [{cls, name, v}] in seconds.
function stackedBar(parts, total, label, cls = "") {
  const wrap = el("div", `acc ${cls}`.trim());
  wrap.append(el("div", "acc-label", label));
  const bar = el("div", "bar");
  const legend = el("div", "acc-legend");
  const sum = parts.reduce((a, p) => a + Math.max(0, p.v), 0) || 1;
  for (const p of parts) {
    const seg = el("span", `seg ${p.cls}`);
    seg.style.flexGrow = String(Math.max(0, p.v) / sum);
    seg.title = `${p.name}: ${fmtS(p.v)}`;
    bar.append(seg);
    const item = el("span", "li");
    item.append(el("i", `sw ${p.cls}`), el("span", "", `${p.name} ${fmtS(p.v)}`));
    legend.append(item);
  }
  wrap.append(bar, legend);
  if (total !== null) wrap.append(el("div", "acc-total", total));
  return wrap;
}

// A finished request's accounting: TTFT by stage, then the mean later token by part.
function accountingBars(s, r) {
  const out = [];
  const here = ttftHere(r), way = wayOut(s.settings);
  const stages = stagesOf([r]);   // a cold start's wait, a KV transfer: when there was one
  out.push(stackedBar(stages.map(([k, name]) => ({cls: k, name, v: r.stages[k] || 0})),
                      `= TTFT ${fmtS(r.ttft)} measured by the engine` +
                      (here !== null ? ` · TTFT here ${fmtS(here)} as this page saw it (+${fmtS(here - r.ttft)}` +
                        `${way && way.injected ? ", with injected network delay" : ""}${way && way.buffered ? ", through a buffering proxy" : ""})` : ""),
                      "time to first token", "acc-ttft"));
  if (r.later) {
    const lp = LATER.map(([k, name]) => ({cls: `l-${k}`, name, v: r.later[k]}));
    lp.push({cls: "other", name: "between steps", v: r.tpot - LATER.reduce((a, [k]) => a + r.later[k], 0)});
    const x = laterTokens(r, s);   // the mean named, its median beside it, and a new shape's first forwards in it
    out.push(stackedBar(lp, `= ${fmtS(r.tpot)} per later token ${x ? statNote(x) : `(mean of ${r.outputTokens - 1})`}`, "each later token"));
  }
  return out;
}

// Met or missed against the service-level objectives, with the numbers (finished.slo).
function sloLine(s, r) {
  const text = sloText(r);
  if (!text) return [];
  const line = el("div", "slo-line", text);
  line.dataset.met = String(r.slo.met);
  const why = targetBelowEngine(r, s.points);   // missed because the target is under this engine's own step
  return why ? [line, el("p", "slo-why", why)] : [line];
}

function accounting(s, r) {
  if (observing(s)) return clientAccounting(s, r);   // measured by this client, never "by the server"
  if (r.rejected) return [el("div", "acc-total", `rejected: ${r.rejected}`)];
  if (r.stages) return sloLine(s, r).concat(accountingBars(s, r));
  const bits = [];
  if (r.queueS !== null) bits.push(`queued ${fmtS(r.queueS)}`);
  if (r.prefills.length) bits.push(`prefill ${fmtS(prefillTime(r))}`);
  if (r.preempts.length) bits.push(`recompute ${fmtS(prefillTime(r, true))}`);
  if (r.first !== null) bits.push(`first token at +${fmtS(r.first - r.arrival)}`);
  return [el("div", "acc-total", `${bits.join(" · ") || "waiting"} — the full accounting arrives when it finishes`)];
}

// The prompt as token chips (piece and id), then as plain text.
function promptChips(r) {
  const list = (r.pieces || []).map((p, i) => {
    const c = el("span", "tok");
    c.append(el("span", "piece", p.replace(/ /g, "·").replace(/\n/g, "⏎") || "∅"), el("span", "tid", String(r.ids[i])));
    return c;
  });
  if (r.truncated) list.push(el("span", "muted", ` … ${r.promptTokens - r.pieces.length} more`));
  list.push(el("div", "prompt-text", (r.pieces || []).join("")));
  return list;
}

export function showModel(s, h) {
  if (observing(s)) { $("model").textContent = modelLine(s); return; }
  // the weights' format and bytes per decode step: a span that follows the setting (ft-weights.js)
  const w = el("span", "model-weights", h.dtype);
  w.id = "model-weights";
  // the server process's resident memory, from each `stats` event (ft-weights.js update); the
  // details after it are the first part a one-row header drops (ft-stage.js; the tooltip keeps them)
  const rss = el("span", "model-rss", "");
  rss.id = "model-rss";
  const more = el("span", "model-more", ` · ${(h.params / 1e6).toFixed(0)} M params · ${h.layers} layers · ${h.max_slots} slots`);
  $("model").replaceChildren(`${h.model} · ${h.device} · `, w, rss, more);
  $("model").title = more.textContent.slice(3);
}

function headline(s) {
  const L = s.last;
  const pct = (o, k) => (o && o[k] !== undefined ? o[k] : null);
  $("h-ttft50").textContent = fmtS(pct(L && L.ttft, "p50"));
  $("h-ttft99").textContent = `${fmtS(pct(L && L.ttft, "p90"))} · ${fmtS(pct(L && L.ttft, "p99"))}`;
  $("h-itl50").textContent = fmtS(pct(L && L.itl, "p50"));
  $("h-itl99").textContent = `${fmtS(pct(L && L.itl, "p90"))} · ${fmtS(pct(L && L.itl, "p99"))}`;
  $("h-tps").textContent = L ? L.tokens_per_s.toFixed(1) : "—";
  // running and waiting: the same state the slots, the waiting chips and the timeline draw
  // (events, in order), not the last stats sample, which a long forward holds back
  $("h-running").textContent = s.hello ? `${running(s)}/${s.settings.slots ?? "?"}` : "—";
  $("h-waiting").textContent = s.hello ? String(s.waiting.length) : "—";
  const st = s.settings;
  $("h-policy").textContent = st.schedule ?? "—";
  $("h-policy-k").textContent = st.max_batched_tokens ? `schedule · ${st.max_batched_tokens} tok/step` : "schedule";
  $("h-policy").parentElement.title = st.schedule ? `schedule: ${st.schedule} · step token budget ` +
    `${st.max_batched_tokens} · prefix caching ${st.prefix_caching ? "on" : "off"}` : "";
  goodput(s, L);
  guesses(s);
  const recent = s.delivery.slice(-300);
  $("h-delivery").textContent = clock.offset === null ? "syncing" : fmtS(percentile(recent, 50));
}

// Goodput (requests/s that met both objectives, last 30 s) and the share of judged requests
// that met them, as the last stats event says; the objectives in the tooltip.
function goodput(s, L) {
  const g = L ? L.goodput : null, a = L ? L.slo_attainment : null, st = s.settings;
  $("h-goodput").textContent = typeof g === "number" ? `${g.toFixed(g >= 10 ? 1 : 2)}/s` : "—";
  // (no share yet: one dash for the figure, not a second small one beside it)
  $("h-slo").hidden = typeof a !== "number";
  $("h-slo").textContent = typeof a === "number" ? `${Math.round(a * 100)}%` : "";
  $("h-slo").dataset.low = String(typeof a === "number" && a < 0.9);
  const targets = st.slo_ttft_ms ? `TTFT ≤ ${st.slo_ttft_ms} ms and ≤ ${st.slo_tpot_ms} ms per later token` : "both objectives";
  const since = L && L.slo_judged ? ` · since the last reset ${L.slo_met} of ${L.slo_judged} met` : "";
  $("h-goodput-fig").title = `goodput: finished requests per second that met ${targets}, over the last 30 s; ` +
    `SLO met: the share of the requests finished in those 30 s that met them (engine)${since}`;
}

// Speculative decoding over the forwards of the last 30 s (goodput's window), from their `step`
// events: the share of guesses accepted and the mean acceptance length; shown, with the
// timeline's legend item for the guesses, while speculation is on or guesses were verified.
function guesses(s) {
  const c = recent(s), on = speculating(s, c), x = rates(c);
  $("h-spec-fig").hidden = !on;
  $("tl-spec").hidden = !on;
  if (!on) return;
  $("h-spec").textContent = x ? pct(x.rate) : "—";
  $("h-spec-len").textContent = x ? x.length.toFixed(1) : "";
  $("h-spec-fig").title = `speculative decoding (${s.settings.speculation ?? "?"}, ${s.settings.spec_tokens ?? "?"} guesses ` +
    `per request per forward), over the last ${WINDOW_S} s: ` + (x ? `${c.accepted} of ${c.proposed} guesses accepted ` +
    `(acceptance rate) in ${c.drafts} drafts; mean acceptance length ${x.length.toFixed(2)} = 1 + accepted / drafts, the ` +
    `tokens a request got from each forward that verified its guesses (engine step events)` : "no guesses verified yet");
}

// The step-time target, where the forwards are drawn: how many prompt tokens a mixed step may
// take now (stats.prefill_cap), and the trade it makes.
function capNote(s) {
  const box = $("step-cap"), target = s.settings.max_step_ms;
  if (!box) return;
  box.hidden = !target;
  if (!target) return;
  const cap = s.last ? s.last.prefill_cap : null;
  box.textContent = `Step-time target ${target} ms: ` +
    (cap === null || cap === undefined ? "the prompt-token cap is not known yet (fitted from the forwards measured lately)"
                                       : `a mixed step takes at most ${cap} prompt tokens beside the streams`) +
    " — streams stay steady; a long prompt takes more steps, so its own first token comes later.";
}

function footer(s, perf) {
  $("foot").textContent = `page ${perf.fps.toFixed(0)} fps (${perf.drawMs.toFixed(1)} ms drawing) · ` +
    `websocket ${fmtBytes(Math.round(perf.bytesPerS))}/s · ` +
    `${s.events} events · clock offset ${clock.offset === null ? "—" : "±" + fmtS(clock.rtt / 2)}` +
    (s.dropped ? ` · ${s.dropped} events dropped for this page` : "");
}

function kvInfo(s) {
  const h = s.hello, L = s.last;
  const bpt = h.kv_bytes_per_token;
  const bytesPer = (h.dtype === "float32" ? 4 : 2);
  const filled = L ? L.cache_tokens : 0;
  const budget = L ? L.cache_blocks * h.block_size : null;
  $("kv-info").textContent = (s.instances ? "decode instance · " : "") + `${fmtBytes(bpt)}/token (2 × ${h.layers} layers × ${h.kv_heads} KV heads × ` +
    `${h.head_dim} dims × ${bytesPer} B) · filled ${filled} / ${budget ?? "—"} tok = ` +
    `${fmtBytes(filled * bpt)} / ${budget === null ? "—" : fmtBytes(budget * bpt)}`;
}

// The KV blocks: in use, the budget, shared and cached ones; prefix-cache hits and preemptions (stats).
function blocksInfo(s) {
  const h = s.hello, L = s.last;
  if (!L || L.cache_blocks_used === null || !h.cache_blocks) {
    $("blocks-info").textContent = ""; $("prefix-info").textContent = "";
    return;
  }
  const store = h.kv_store_bytes ? `, ${fmtBytes(h.kv_store_bytes)} allocated` : "";
  $("blocks-info").textContent = `${L.cache_blocks_used} of ${h.cache_blocks} in use (${h.block_size} tokens each${store})` +
    (L.cache_blocks < h.cache_blocks ? `, budget: at most ${L.cache_blocks}` : "") +
    ` · ${L.cache_blocks_shared} shared · ${L.cache_blocks_cached} free with a cached prefix`;
  if (s.instances) {   // disaggregated: each instance's blocks (the grid draws both, labelled)
    const P = s.prefill.last, pi = s.instances.prefill;
    $("blocks-info").textContent = `prefill instance ${P ? P.cache_blocks_used : "—"} of ${pi.cache_blocks} in use` +
      ` · decode instance ${L.cache_blocks_used} of ${h.cache_blocks} (${h.block_size} tokens each)`;
  }
  const q = L.prefix_queries, pct = q && (100 * L.prefix_hits) / q;
  $("prefix-info").textContent = (q ? `prefix-cache hit rate ${pct.toFixed(pct < 10 ? 1 : 0)}% (${L.prefix_hits} of ${q} tokens)`
                                    : "prefix cache: no lookups yet") + (s.settings.prefix_caching === false ? " (now off)" : "") +
    ` · ${L.preemptions} preemption${L.preemptions === 1 ? "" : "s"}`;
}

// What the head of the queue waits for, as the engine says (stats.blocked_on).
function waitReason(s, L) {
  return {cache: "for KV-cache blocks", slot: `for a batch slot (${running(s)}/${s.settings.slots} busy)`,
          drain: "for running requests to drain (KV-cache mode changed)",
          batch: "for the running batch to finish (static batching)",
          budget: `for room in a step (its ${s.settings.max_batched_tokens}-token budget went to running requests)`}[L.blocked_on] || "";
}

function queueInfo(s, select) {
  const L = s.last;
  const badge = $("kv-full"), info = $("queue-info");   // on the KV and queue strips (either may be absent)
  const n = s.waiting.length, cacheBound = L && n > 0 && L.blocked_on === "cache";
  if (badge) badge.hidden = !cacheBound;
  if (badge && cacheBound) badge.textContent = `cache full: ${n} waiting for KV blocks (${L.cache_blocks_used}/${L.cache_blocks} in use)`;
  if (info) info.textContent = n === 0 ? "nobody waiting" : `${n} waiting ${L ? waitReason(s, L) : ""}`.trim();
}

// A request's chip: its id, or a classroom student's name (the id in the tooltip).
function chip(s, select, id) {
  const r = s.reqs.get(id), label = r && r.label;
  const c = el("button", "rchip", label || id);
  if (label) c.title = id;
  c.style.setProperty("--req-color", reqColor(id));
  c.addEventListener("click", () => select(id));
  return c;
}

function slotCells(s, select, list, limit) {
  return list.map((id, i) => {
    const cell = id ? chip(s, select, id) : el("span", i < limit ? "slot free" : "slot off");
    if (!id) cell.title = i < limit ? `slot ${i}: free` : `slot ${i}: above the slots setting`;
    cell.classList.add("cell");
    return cell;
  });
}

// Disaggregated: each instance's slots, labelled (the decode instance's are the `slots` setting's).
function slots(s, select) {
  const limit = s.settings.slots || s.slots.length, two = !!s.instances;
  $("slots").replaceChildren(...slotCells(s, select, s.slots, limit));
  $("slots-info").textContent = `${s.slots.filter(Boolean).length} busy of ${limit}`;
  if ($("slots-title")) $("slots-title").textContent = two ? "Decode instance slots" : "Batch slots";
  if ($("pslots-box")) {
    $("pslots-box").hidden = !two;
    if (two) {
      const P = s.prefill.slots;
      $("pslots").replaceChildren(...slotCells(s, select, P, P.length));
      $("pslots-info").textContent = `${P.filter(Boolean).length} busy of ${P.length}`;
    }
  }
  const shown = s.waiting.slice(0, SHOW_WAITING);
  const w = $("waiting");
  w.replaceChildren(...shown.map((id) => chip(s, select, id)));
  if (s.waiting.length > shown.length) w.append(el("span", "muted", ` +${s.waiting.length - shown.length} more`));
  $("waiting-info").textContent = s.hello ? `${s.waiting.length} in queue` : "";
}

// The request panel follows the newest request with output (else the newest) unless one was picked.
export function selectedReq(s, ui) {
  if (ui.selected && s.reqs.has(ui.selected)) return s.reqs.get(ui.selected);
  for (let i = s.order.length - 1; i >= 0; i--) {
    const r = s.reqs.get(s.order[i]);
    if (r.first !== null) return r;
  }
  const id = s.order[s.order.length - 1];
  return id ? s.reqs.get(id) : null;
}

const requeued = (r) => r.end === null && r.preempts.length > 0 && r.preempts[r.preempts.length - 1].until === null;

// Where the request stands with the scheduler: its place in the queue and why, the prompt
// tokens the prefix cache supplied, its preemptions, and its speculative decoding (each from events).
function schedNote(s, r) {
  if (observing(s)) return clientNote(s, r);
  const L = s.last, a = r.admits[0], lines = [];
  if (L && r.end === null && (!a || requeued(r))) {
    const pos = s.waiting.indexOf(r.id);
    lines.push(pos === 0 ? `first in the queue, waiting ${waitReason(s, L)}`.trim() :
      `waiting in the queue${pos > 0 ? ` (${pos + 1} of ${s.waiting.length}); the first waits ${waitReason(s, L)}` : ""}`);
  }
  const cached = a ? a.cachedTokens : r.finalCached;
  if (cached !== null) lines.push(`${cached} of ${a ? a.promptTokens : r.promptTokens} prompt tokens reused from the prefix cache`);
  if (r.preempts.length) {
    const waited = r.preempts.reduce((acc, p) => acc + ((p.until ?? r.end ?? s.latestT) - p.t), 0);
    const back = r.admits.filter((x) => x.resumed);
    const redo = back.reduce((acc, x) => acc + x.promptTokens, 0), found = back.reduce((acc, x) => acc + x.cachedTokens, 0);
    lines.push(`preempted ${r.preempts.length}× (a step needed its KV blocks): waited again ${fmtS(waited)}` +
               (back.length ? `, then recomputed ${redo - found} tokens` : "") +
               (found ? ` (${found} more from the prefix cache)` : ""));
  } else if (r.finalPreemptions) lines.push(`preempted ${r.finalPreemptions}×`);
  else if (a) lines.push("not preempted");
  const spec = requestLine(r);   // its guesses: the engine's counts at its finish, else its steps'
  if (spec) lines.push(spec);
  lines.push(...instanceLines(s, r));   // disaggregated: its slot on each instance, its KV transfer
  return lines.join("\n");
}

function detail(s, ui) {
  const r = selectedReq(s, ui);
  if (!r) {
    $("d-title").textContent = "— none yet";
    $("d-accounting").replaceChildren(); $("d-chips").replaceChildren(); $("d-text").textContent = "";
    $("d-sched").textContent = "";
    if ($("d-odds")) $("d-odds").textContent = "";
    return;
  }
  const state = observing(s) ? clientState(r) : r.rejected ? "rejected" : r.end !== null ? finishText(r.reason) : requeued(r) ? "preempted, waiting" :
    instanceState(s, r) ??
    r.first !== null ? "decoding" : r.prefills.length ? "prefilling" : "waiting";
  $("d-title").textContent = `${r.id}${r.label ? ` · ${r.label}` : ""} · ${sourceText(r.source)} · ${state}${ui.selected ? "" : " (newest)"}`;
  $("d-sched").textContent = schedNote(s, r);
  const key = `${s.epoch}:${r.id}:${r.tokens.length}:${r.end}:${r.pieces ? 1 : 0}:${r.pageFirstDelivery}`;
  if (key === detailKey) return;
  detailKey = key;
  renderText($("d-text"), r, s.epoch);   // a span per token, the uncertain ones marked (ft-candidates.js)
  if ($("d-odds")) $("d-odds").textContent = oddsLine(r) || "";
  // Chips are rebuilt for another request, or when this one's tokenisation arrives.
  const chips = $("d-chips"), chipsKey = `${s.epoch}:${r.id}:${r.pieces ? 1 : 0}`;
  if (chips.dataset.req !== chipsKey) {
    chips.dataset.req = chipsKey;
    chips.replaceChildren(...promptChips(r));
    $("d-ntok").textContent = r.promptTokens !== null ? `(${r.promptTokens})` : "";
  }
  $("d-accounting").replaceChildren(...accounting(s, r));
}

// The first screen's invitation (a live page on which nothing has run yet; a replay has its own),
// not while a lesson runs: a reset leaves no request behind it, and the card covered the timeline
// a cold start's loading band is drawn on.
function start(s) {
  const box = $("start");
  if (box) box.hidden = !(s.hello && !s.order.length && !replaying() && !lessonOn && !tourOn);
}

// The first screen's buttons (the prompt box above it is the controls', ft-controls.js), and the
// output's tokens: hover or tap one to see its candidates.
export function wire(s) {
  wireText($("d-text"), s);
  if (!$("start-lesson")) return;
  $("start-lesson").addEventListener("click", () => applyPreset(s, "idle"));
  $("start-tour").addEventListener("click", () => $("btn-tour").click());
}

export function update({s, ui, perf, select}) {
  headline(s);
  start(s);
  if (s.loading && !s.hello) {
    setConn("loading", `loading model: ${s.loading.message} ${(s.loading.progress * 100).toFixed(0)}%`);
  } else if (s.hello && $("conn").dataset.state === "loading") {
    setConn("connected", "live");   // (the socket opened while loading: "ready 100%" stayed all session)
  }
  footer(s, perf);
  capNote(s);
  if ($("tl-disagg")) $("tl-disagg").hidden = !s.instances;
  if (!ui.dirtyDom) return;
  ui.dirtyDom = false;
  // The parts the page has (an /embed shows those its `panels` parameter asked for).
  if (s.hello) {
    if ($("kv-info")) kvInfo(s);
    if ($("blocks-info")) blocksInfo(s);
    queueInfo(s, select);
  }
  if ($("slots")) slots(s, select);
  if ($("d-title")) detail(s, ui);
}

