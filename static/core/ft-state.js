// First Token: the page's model of the engine, built from the event stream alone.
// No DOM here: `ingest` folds protocol events (docs/protocol.md) into bounded
// histories that the canvas and chart code read. A recorded trace replays through
// the same function, so everything drawn is something an event said.

// A page's part in a classroom (`hello.role`, docs/protocol.md; the body's data-role): the wire's
// strings, named once. SOLO: no classroom.
export const ROLES = Object.freeze({SOLO: "solo", PRESENTER: "presenter", VIEWER: "viewer"});

// Bounds keep memory and drawing cost flat however long the page stays open.
const KEEP_FINISHED = 300;   // finished/rejected requests kept (running/waiting always kept)
const KEEP_STEPS = 4000;     // model forwards kept for the timeline and KV chart
const KEEP_STATS = 1200;     // stats samples (~10 min at 2 Hz)
const KEEP_POINTS = 1500;    // decode steps kept for the step-time-vs-batch chart
const KEEP_DELIVERY = 2000;  // measured server->page delivery samples
const KEEP_BLOCK_USE = 6000; // blocks-in-use samples (every forward and every stats event)

function trim(arr, keep) {
  // Trim in chunks so a full history costs an occasional splice, not one per event.
  if (arr.length > keep * 1.25) arr.splice(0, arr.length - keep);
}

export function createState() {
  return {
    hello: null, settings: {}, limits: {}, loading: null,
    fp32MadeS: null, int8Agreement: null,   // settings.fp32_made_s, .int8_agreement: the latest measured
    reqs: new Map(), order: [],   // order: request ids by arrival
    steps: [],                    // model forwards: {kind, start, end, ids, decodeIds, tokens, prefillTokens,
                                  //   decodeTokens, kv, cacheTokens, stack, predicted, bound, spec, out, firstShape,
                                  //   weights, kernel, weightBytes};
                                  //   "release" points end a request's share
    lastForward: null,            // the newest forward: the `token` events after it are its output (its `out`)
    stepPrefills: new Map(),      // instance ("" colocated) -> ids with a prefill event there since its last step
    filled: new Map(),            // running request id -> KV entries filled (from step.per_request)
    blockUse: [],                 // {t, used}: KV blocks in use, as each step and stats event said
    stats: [], last: null,        // stats samples; the latest stats event (disaggregated: the decode instance's)
    // Prefill/decode disaggregation (hello.instances, protocol 13); null/empty when colocated. The
    // decode instance's figures stay in the fields above (its slots in `slots`, its stats in
    // `last`, its blocks in `blockUse`); the prefill instance's are these.
    instances: null,              // {prefill, decode}: hello.instances by name, or null (colocated)
    prefill: {slots: [], last: null, filled: new Map(), waiting: []},   // the prefill instance's slots, stats, KV
    transfers: [],                // kv_transfer events in time order: {id, start, end, tokens, bytes, src, dst}
    scrapes: [],                  // observe mode: the server's scrapes, {t: scraped_t, at, server}; {t, server: null} while unreadable
    slots: [], waiting: [],
    points: [],                   // decode steps: {batch, ms, kv, …, guesses: positions guessed (speculation)}
    delivery: [],                 // seconds from event `t` to frame arrival here (after clock sync)
    loads: [],                    // model_load events: {start, end, seconds, fromCache, reason}
    sweeps: {},                   // weights format ("" before protocol 12) -> the latest finished decode-cost sweep
                                  //   (a `measure` event, status done) that read it: the machine's, kept over resets
    errors: [],
    dropped: 0, events: 0, frames: 0, bytes: 0, finishedCount: 0,
    stepSeq: 0,                   // forwards numbered as they arrive (alternate band shading)
    latestT: 0,                   // newest engine time seen in any event
    connectT: null,               // engine time of this connection's hello (older events are replay)
    version: 0,                   // bumped on every ingest; views redraw only when it moved
    epoch: 0,                     // bumped on hello/reset so views drop what they cached
  };
}

function clearRun(s) {
  s.reqs = new Map(); s.order = []; s.steps = []; s.lastForward = null; s.filled = new Map(); s.stats = []; s.blockUse = [];
  s.scrapes = [];
  s.stepPrefills = new Map();
  s.prefill = {slots: s.prefill.slots.map(() => null), last: null, filled: new Map(), waiting: []};
  s.transfers = [];
  s.last = null; s.waiting = []; s.points = []; s.slots = s.slots.map(() => null);
  s.finishedCount = 0; s.loads = []; s.epoch++;
}

function req(s, id, t) {
  // Events for a request whose `request` fell out of the replayed history still draw.
  let r = s.reqs.get(id);
  if (!r) {
    r = {id, source: "?", label: null, promptTokens: null, maxNew: null, preview: "", arrival: t, partial: true,
         tokStart: null, tokEnd: null, ids: null, pieces: null, truncated: false,
         admitted: null, slot: null, queueS: null, prefills: [],
         admits: [],     // every admission: {t, slot, blocks, promptTokens, cachedTokens, resumed, instance}
         prefillSlot: null,   // disaggregated: its slot on the prefill instance until its KV was copied
         transfers: [],  // disaggregated: its kv_transfer events, {start, end, tokens, bytes, src, dst}
         waitOn: {},     // what the queue waited for before its first admission: stats samples per reason
         preempts: [],   // every preemption: {t, tokens, until} (until: readmitted at, null while waiting)
         finalCached: null, finalPreemptions: null,   // as `finished` said
         tokens: [], text: [], first: null, end: null, reason: null, rejected: null,
         stages: null, later: null, ttft: null, tpot: null, e2e: null, outputTokens: 0,
         slo: null,      // finished.slo: {ttft_met, tpot_met, met, ttft_target_s, tpot_target_s}, or null
         // speculative decoding: each forward that verified its guesses, {n (the step's), start, end, proposed,
         // accepted} as its step.spec said (null: its step never reached this page) and `tokens`, its accepted-guess
         // token events; `specFinal`: finished's {drafts, draftTokens, accepted} (null: not reported)
         specRuns: [], specFinal: null,
         tokenSpec: [],  // per token (as r.tokens): its `token.spec` (null: a plain token)
         // per token (as r.tokens): what it was chosen from (protocol 14), {p, raw, top, rejected} as its
         // `token.p`, `p_raw`, `top` ([id, text, p, p_raw] or null: not sent to this page) and `rejected`;
         // null where the event had none (older traces, observe mode without the server's logprobs)
         odds: [],
         tokenIds: [],   // per token (as r.tokens): its `token.token_id` (null in observe mode)
         pageFirstDelivery: null,
         arrivals: [],   // per token (as r.tokens): its frame's arrival here on the engine clock, null if unknown
         clientSide: false, gaps: null,   // observe mode: measured by this client (finished.client_side, .gaps)
         inSlot: null};                   // observe mode: the first scrape that showed it in a server slot
    s.reqs.set(id, r);
    s.order.push(id);
    evict(s);
  }
  return r;
}

function evict(s) {
  let done = 0;
  for (const id of s.order) if (s.reqs.get(id).end !== null) done++;
  if (done <= KEEP_FINISHED) return;
  let drop = done - KEEP_FINISHED;
  s.order = s.order.filter((id) => {
    const r = s.reqs.get(id);
    if (drop > 0 && r.end !== null) { drop--; s.reqs.delete(id); return false; }
    return true;
  });
}

// One handler per event type (docs/protocol.md). `at`: when the frame carrying the event
// reached this page, on the engine clock (null until the clock is synced).
const ON = {
  loading(s, ev) { s.loading = ev; },
  hello(s, ev) {
    clearRun(s);
    s.loading = null; s.hello = ev; s.settings = Object.assign({}, ev.settings); s.limits = ev.limits || {};
    s.slots = new Array(ev.max_slots).fill(null); s.connectT = ev.t; s.latestT = ev.t;
    const inst = Array.isArray(ev.instances) && ev.instances.length ? ev.instances : null;
    s.instances = inst && Object.fromEntries(inst.map((i) => [i.name, i]));
    s.prefill = {slots: new Array(s.instances && s.instances.prefill ? s.instances.prefill.max_slots : 0).fill(null),
                 last: null, filled: new Map(), waiting: []};
    s.dropped = 0; s.delivery = []; s.sweeps = {};
    s.fp32MadeS = (ev.weights && ev.weights.fp32_made_s) ?? null;
    s.int8Agreement = (ev.weights && ev.weights.int8_agreement) || null;
  },
  settings(s, ev) {
    s.settings = Object.assign({}, ev.settings);
    // measured by the engine for this change (protocol 14): the fp32 copy made, int8's agreement
    if (ev.fp32_made_s != null) s.fp32MadeS = ev.fp32_made_s;
    if (ev.int8_agreement) s.int8Agreement = ev.int8_agreement;
  },
  reset(s) { clearRun(s); },
  dropped(s, ev) { s.dropped += ev.count; },
  model_load(s, ev) {
    s.loads.push({start: ev.start, end: ev.end, seconds: ev.seconds, fromCache: ev.from_cache, reason: ev.reason});
    trim(s.loads, 20);
  },
  error(s, ev) { s.errors.push(ev); trim(s.errors, 20); },
  measure(s, ev) { if (ev.status === "done" && Array.isArray(ev.decode)) s.sweeps[ev.weights || ""] = ev; },
  request(s, ev) {
    const r = req(s, ev.id, ev.t);
    Object.assign(r, {source: ev.source, label: ev.label ?? null,
                      promptTokens: ev.prompt_tokens, maxNew: ev.max_new_tokens,
                      preview: ev.preview, arrival: ev.t, partial: false});
    // waits from arrival (observe mode: the server's queue is not the client's to know)
    if (r.end === null && !r.admits.length && !s.waiting.includes(ev.id) && s.hello?.mode !== "observe") s.waiting.push(ev.id);
  },
  tokenized(s, ev) {
    const r = req(s, ev.id, ev.start);
    Object.assign(r, {tokStart: ev.start, tokEnd: ev.end, ids: ev.ids, pieces: ev.pieces, truncated: ev.truncated});
    if (r.promptTokens === null) r.promptTokens = ev.n;
  },
  // The first admission sets the queue time; a readmission after a preemption ends that wait.
  // Disaggregated, a request is admitted twice: on the prefill instance (its slot there), then,
  // its keys and values copied, on the decode instance (the slot it decodes in).
  admitted(s, ev) {
    const r = req(s, ev.id, ev.t), inst = ev.instance ?? null;
    r.admits.push({t: ev.t, slot: ev.slot, blocks: ev.blocks, promptTokens: ev.prompt_tokens,
                   cachedTokens: ev.cached_tokens, resumed: ev.resumed, instance: inst});
    const back = r.preempts[r.preempts.length - 1];
    if (ev.resumed && back && back.until === null) back.until = ev.t;
    if (r.admitted === null) Object.assign(r, {admitted: ev.t, queueS: ev.queue_s});
    if (inst === "prefill") {
      r.prefillSlot = ev.slot;
      if (ev.slot < s.prefill.slots.length) s.prefill.slots[ev.slot] = ev.id;
    } else {
      r.slot = ev.slot;
      if (ev.slot < s.slots.length) s.slots[ev.slot] = ev.id;
    }
    s.waiting = s.waiting.filter((id) => id !== ev.id);
  },
  // The request gave its blocks and slot back and waits again; its tokens are recomputed later.
  preempted(s, ev) {
    const r = req(s, ev.id, ev.t);
    r.preempts.push({t: ev.t, tokens: ev.tokens, until: null, instance: ev.instance ?? null});
    if (ev.instance === "prefill") leavePrefill(s, r, ev.t);
    else {
      release(s, r, ev.t);
      if (r.slot !== null && s.slots[r.slot] === ev.id) s.slots[r.slot] = null;
      r.slot = null;
    }
    s.waiting = [ev.id].concat(s.waiting.filter((id) => id !== ev.id));   // the engine puts it first
  },
  prefill(s, ev) {
    const r = req(s, ev.id, ev.start);
    r.prefills.push({start: ev.start, end: ev.end, pos: ev.pos, tokens: ev.tokens, done: ev.done,
                     recompute: r.preempts.length > 0, instance: ev.instance ?? null});
    const key = ev.instance ?? "";
    if (!s.stepPrefills.has(key)) s.stepPrefills.set(key, new Set());
    s.stepPrefills.get(key).add(ev.id);
  },
  // Disaggregated, the two instances' forwards interleave: each step takes its own instance's
  // prompt rows and KV entries; the prefill instance's forwards give out no tokens.
  step(s, ev) {
    const inst = ev.instance ?? null, onPrefill = inst === "prefill";
    const filled = onPrefill ? s.prefill.filled : s.filled;
    for (const id in ev.per_request) filled.set(id, ev.per_request[id]);
    if (ev.kind === "decode" && !onPrefill) {
      // len: the mean sequence length the step worked over: the KV entries each request holds
      // (cache on), or what each recomputed (cache off: `tokens` counts whole sequences then)
      const n = ev.ids.length, held = ev.ids.reduce((a, id) => a + (ev.per_request[id] || 0), 0);
      s.points.push({batch: n, ms: (ev.end - ev.start) * 1000, kv: ev.kv_cache, t: ev.start,
                     len: n ? (ev.kv_cache ? held : ev.tokens) / n : 0,
                     predMs: typeof ev.predicted_s === "number" ? ev.predicted_s * 1000 : null, bound: ev.bound ?? null,
                     guesses: ev.spec ? Object.values(ev.spec).reduce((a, g) => a + g.proposed, 0) : 0,
                     weights: ev.weights ?? null});   // the copy of the weights it read (protocol 12)
      trim(s.points, KEEP_POINTS);
    }
    // What each running request holds in the KV cache right after this forward (nothing
    // when the cache is off: every step recomputes, no keys/values are kept).
    const prompts = s.stepPrefills.get(inst ?? "") || new Set();
    s.stepPrefills.delete(inst ?? "");
    const st = {n: s.stepSeq++, kind: ev.kind, start: ev.start, end: ev.end, ids: ev.ids,
                decodeIds: ev.ids.filter((id) => !prompts.has(id)), tokens: ev.tokens,
                prefillTokens: ev.prefill_tokens, decodeTokens: ev.decode_tokens,
                kv: ev.kv_cache, cacheTokens: ev.cache_tokens, stack: ev.kv_cache ? Array.from(filled) : [],
                predicted: typeof ev.predicted_s === "number" ? ev.predicted_s : null, bound: ev.bound ?? null,
                spec: ev.spec ?? null, out: 0,
                firstShape: ev.first_shape === true,    // (absent before protocol 11)
                weights: ev.weights ?? null, kernel: ev.kernel ?? null, weightBytes: ev.weight_bytes ?? null,   // (12)
                instance: inst};   // (13)
    s.steps.push(st);
    if (!onPrefill) s.lastForward = st;
    for (const id in st.spec || {}) {
      req(s, id, ev.start).specRuns.push({n: st.n, start: ev.start, end: ev.end, proposed: st.spec[id].proposed,
                                          accepted: st.spec[id].accepted, tokens: 0});
    }
    trim(s.steps, KEEP_STEPS);
    if (!onPrefill) blocksInUse(s, ev.end, ev.cache_blocks_used);
  },
  // Disaggregated: the decode instance copied the request's keys and values out of the prefill
  // instance's blocks, which then gave them and its slot there back.
  kv_transfer(s, ev) {
    const r = req(s, ev.id, ev.start);
    const x = {id: ev.id, start: ev.start, end: ev.end, tokens: ev.tokens, bytes: ev.bytes,
               src: ev.src_blocks, dst: ev.dst_blocks};
    r.transfers.push(x);
    s.transfers.push(x);
    trim(s.transfers, KEEP_FINISHED);
    leavePrefill(s, r, ev.end);
  },
  token(s, ev, at) {
    const r = req(s, ev.id, ev.t);
    r.tokens.push(ev.t);
    r.text.push(ev.text);
    r.tokenSpec.push(ev.spec ?? null);
    r.tokenIds.push(ev.token_id ?? null);
    r.odds.push(typeof ev.p_raw === "number" ? {p: ev.p ?? null, raw: ev.p_raw, top: ev.top ?? null, rejected: ev.rejected ?? null}
                                             : null);
    if (ev.first) r.first = ev.t;
    // A forward's tokens follow its `step` event (sampled after it ended; observe mode has neither).
    const fw = s.lastForward;
    if (fw && typeof ev.sampled === "number" && ev.sampled >= fw.end) fw.out++;
    if (ev.spec === "accepted") {
      let run = r.specRuns[r.specRuns.length - 1];
      if (!run || !fw || run.n !== fw.n) {   // its forward's step fell out of the history this page got
        run = {n: null, start: ev.t, end: ev.t, proposed: null, accepted: null, tokens: 0};
        r.specRuns.push(run);
      }
      run.tokens++;
    }
    const live = at !== null && at !== undefined && s.connectT !== null && ev.t >= s.connectT;
    r.arrivals.push(live ? at : null);   // page-side only: never part of a saved trace
    if (live) {
      const d = at - ev.t;
      s.delivery.push(d);
      trim(s.delivery, KEEP_DELIVERY);
      if (ev.first) r.pageFirstDelivery = d;
    }
  },
  finished(s, ev) {
    const r = req(s, ev.id, ev.t);
    Object.assign(r, {end: ev.t, reason: ev.reason, stages: ev.stages, later: ev.later, ttft: ev.ttft,
                      tpot: ev.tpot, e2e: ev.e2e, outputTokens: ev.output_tokens,
                      finalCached: ev.cached_tokens, finalPreemptions: ev.preemptions, slo: ev.slo ?? null,
                      clientSide: !!ev.client_side, gaps: ev.gaps ?? null,
                      specFinal: typeof ev.spec_drafts === "number" ? {drafts: ev.spec_drafts, draftTokens: ev.spec_draft_tokens,
                                                                       accepted: ev.spec_accepted_tokens} : null});
    if (r.promptTokens === null) r.promptTokens = ev.prompt_tokens;
    release(s, r, ev.t);
    leavePrefill(s, r, ev.t);   // cancelled before its transfer (disaggregated)
    if (r.slot !== null && s.slots[r.slot] === ev.id) s.slots[r.slot] = null;
    s.waiting = s.waiting.filter((id) => id !== ev.id);   // cancelled while waiting
    s.finishedCount++;
    evict(s);
  },
  rejected(s, ev) {
    const r = req(s, ev.id, ev.t);
    r.end = ev.t; r.rejected = ev.reason; r.reason = "rejected";
    s.waiting = s.waiting.filter((id) => id !== ev.id);
    evict(s);
  },
  // Disaggregated, each instance sends its own: the prefill instance's queue, slots and blocks go
  // to s.prefill; the decode instance's are the page's figures (s.last: TTFT, ITL, goodput).
  stats(s, ev) {
    const onPrefill = ev.instance === "prefill";
    if (onPrefill) s.prefill.last = ev; else s.last = ev;
    if (s.hello && s.hello.mode === "observe") scraped(s, ev);
    const P = s.instances ? s.prefill.last : null, D = s.last;
    // the queue strip: requests waiting on either instance; running: the decode instance's streams
    if (D) {
      s.stats.push({t: ev.t, queue: P ? D.queue + P.queue : D.queue, running: D.running, blocks: D.cache_blocks, tps: D.tokens_per_s});
      trim(s.stats, KEEP_STATS);
    }
    if (!onPrefill && ev.cache_blocks_used !== null) blocksInUse(s, ev.t, ev.cache_blocks_used);
    const own = onPrefill ? s.prefill.slots : s.slots;
    if (Array.isArray(ev.slots)) {
      const slots = new Array(own.length).fill(null);
      ev.slots.forEach((id, i) => { if (i < slots.length) slots[i] = id; });
      if (onPrefill) s.prefill.slots = slots; else s.slots = slots;
    }
    // The engine's queue in its order, then requests that arrived since it last looked (a long
    // forward holds its stats back, not the `request` events): both are waiting. Disaggregated:
    // the prefill instance's queue first (new prompts), then the decode instance's (copied prompts).
    let listed = ev.waiting_ids || [];
    if (s.instances) {
      if (onPrefill) s.prefill.waiting = listed;
      const other = onPrefill ? (D && D.waiting_ids) || [] : s.prefill.waiting;
      listed = onPrefill ? listed.concat(other.filter((id) => !listed.includes(id)))
                         : other.concat(listed.filter((id) => !other.includes(id)));
    }
    const known = new Set(listed);
    s.waiting = listed.filter((id) => { const r = s.reqs.get(id); return !r || r.end === null; })
      .concat(s.waiting.filter((id) => !known.has(id) && waits(s.reqs.get(id))));
    // The queue's reason (sampled ~2 Hz) counts for each request not yet admitted: the diagnosis
    // reads what a request mostly waited for.
    if (ev.blocked_on) {
      for (const id of onPrefill || !s.instances ? s.waiting : []) {
        const r = s.reqs.get(id);
        if (r && !r.admits.length) r.waitOn[ev.blocked_on] = (r.waitOn[ev.blocked_on] || 0) + 1;
      }
    }
  },
};

// A finished or preempted request's cache entries are free from this moment, not from the
// next forward: a "release" point (no forward; the bands skip it) ends its share of the KV
// chart. How many blocks that frees (shared prefix blocks stay) the next step or stats says.
function release(s, r, t, inst = null) {
  const filled = inst === "prefill" ? s.prefill.filled : s.filled;
  const held = filled.get(r.id);
  filled.delete(r.id);
  let prev = s.steps[s.steps.length - 1];
  for (let i = s.steps.length - 1; i >= 0 && prev && (prev.instance ?? null) !== inst; i--) prev = s.steps[i];
  if (held === undefined || !prev || (prev.instance ?? null) !== inst) return;
  s.steps.push({n: prev.n, kind: "release", start: t, end: t, ids: [r.id], decodeIds: [], tokens: 0, kv: prev.kv,
                cacheTokens: prev.kv ? Math.max(0, prev.cacheTokens - held) : 0,
                stack: prev.kv ? Array.from(filled) : [], instance: inst});
  trim(s.steps, KEEP_STEPS);
}

// Disaggregated: the request left the prefill instance (its keys and values copied, preempted
// there, or ended): its slot and KV entries there are free.
function leavePrefill(s, r, t) {
  if (!s.instances) return;
  release(s, r, t, "prefill");
  if (r.prefillSlot !== null && s.prefill.slots[r.prefillSlot] === r.id) s.prefill.slots[r.prefillSlot] = null;
  r.prefillSlot = null;
}

// Observe mode: each of the server's scrapes once, at the time it was taken (`scraped_t`, not
// the event's), or a gap from this event on while its /metrics is not readable; and the first
// scrape that showed each of our requests in a server slot (llama.cpp's /slots).
function scraped(s, ev) {
  const v = ev.server, prev = s.scrapes[s.scrapes.length - 1];
  if (!v) {
    if (!prev || prev.server) s.scrapes.push({t: ev.t, at: ev.t, server: null});
  } else if (!prev || prev.t < v.scraped_t) {
    s.scrapes.push({t: v.scraped_t, at: ev.t, server: v});
    for (const slot of v.slots || []) {
      const r = slot.request && s.reqs.get(slot.request);
      if (r && r.inSlot === null && r.end === null) r.inSlot = v.scraped_t;
    }
  }
  trim(s.scrapes, KEEP_STATS);
}

// Whether a known request is waiting now: not ended, and never admitted or preempted since.
function waits(r) {
  if (!r || r.end !== null) return false;
  const back = r.preempts[r.preempts.length - 1];
  return !r.admits.length || (back !== undefined && back.until === null);
}

// Requests holding a batch slot now (the slots the admitted/preempted/finished events filled;
// disaggregated: the decode instance's).
export const running = (s) => s.slots.reduce((n, id) => n + (id ? 1 : 0), 0);

// Disaggregated (hello.instances): one prefill and one decode instance. The instance names, in
// the order the page draws them.
export const disaggregated = (s) => s.instances !== null && s.instances !== undefined;
export const INSTANCES = Object.freeze(["prefill", "decode"]);
// Which instance a step, prefill chunk or admission was on: "prefill", or "decode" for the decode
// instance and the colocated engine alike (null on the wire).
export const instanceOf = (x) => (x && x.instance === "prefill" ? "prefill" : "decode");

function blocksInUse(s, t, used) {
  s.blockUse.push({t, used});
  trim(s.blockUse, KEEP_BLOCK_USE);
}

// Fold one event into the state. `arrivedEngineT` is used only to measure delivery of live tokens.
export function ingest(s, ev, arrivedEngineT) {
  s.events++;
  s.version++;
  if (typeof ev.t === "number" && ev.t > s.latestT) s.latestT = ev.t;
  // `sync` is handled by the connection; unknown types are ignored (forward compatible).
  if (Object.hasOwn(ON, ev.type)) ON[ev.type](s, ev, arrivedEngineT);
}

// ------------------------------------------------------------------ the rest of the page
// Event types are read in this module alone. Besides the reducer above, some of the page's parts
// act when an event comes (a toast, a preset's banner, a comparison's recording): each hands a
// table {type: fn(ev, s)} ("*": every event, before its own type's) to a dispatch, which calls
// them after the reducer, table by table in the order they were added; `s` is the state the
// event was folded into (the dispatch's own; none for a stream with no state).
export function createDispatch(s) {
  const tables = [];
  return {
    on(table) { tables.push(table); },
    emit(ev) {
      for (const t of tables) {
        if (t["*"]) t["*"](ev, s);
        if (Object.hasOwn(t, ev.type)) t[ev.type](ev, s);
      }
    },
  };
}

// What the connection, the replay and the comparison ask of events.
export const startsRun = (ev) => ev.type === "hello";    // a server's (or a trace's) history starts at its hello
export const clockSync = (ev) => ev.type === "sync";     // the connection's clock: no state, never in a trace
export const typed = (ev) => typeof ev.type === "string";
export const ofType = (events, ...types) => events.filter((ev) => types.includes(ev.type));
export const firstOf = (events, type, keep = () => true) => events.find((ev) => ev.type === type && keep(ev));

// Percentile of a numeric array (nearest rank), null when empty.
export function percentile(values, q) {
  if (!values.length) return null;
  const s = Float64Array.from(values).sort();
  return s[Math.min(s.length - 1, Math.round((q / 100) * (s.length - 1)))];
}

// The median decode step per batch size, from the page's decode-only points: a Map from batch
// size (ascending) to ms.
export function stepMedians(points) {
  const by = new Map();
  for (const p of points) { if (!by.has(p.batch)) by.set(p.batch, []); by.get(p.batch).push(p.ms); }
  return new Map([...by.keys()].sort((a, b) => a - b).map((b) => [b, percentile(by.get(b), 50)]));
}

// Seconds a request spent in prefill over all its chunks: its prompt's, or (recompute: true)
// recomputing after preemptions.
export function prefillTime(r, recompute = false) {
  return r.prefills.reduce((a, p) => a + (p.recompute === recompute ? p.end - p.start : 0), 0);
}
