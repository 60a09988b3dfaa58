// First Token: the live page. Connection (reconnecting websocket, NTP-style clock sync),
// controls (built from hello.limits, every one a named setting a URL can carry) and the
// views. Events are folded into state as they arrive; canvases redraw once per
// animation frame, DOM panels at 4 Hz and plotly charts at 2 Hz, so a busy engine costs
// the page the same per second however many events it sends.
"use strict";
(function () {
  const FT = window.FT;
  const EMBED = document.body.classList.contains("embed");
  const $ = (id) => document.getElementById(id);

  const s = FT.createState();
  const view = {span: 20, right: 0, paused: false};
  const ui = {selected: null, awaitOwn: false, layouts: {}, hover: null, dragging: null,
              built: null, urlApplied: false, dirtyDom: true};
  // page seconds = engine t + offset; the round trip with the smallest RTT wins.
  const clock = {offset: null, rtt: null, best: Infinity, timer: null};
  const perf = {frames: 0, fps: 0, drawMs: 0, windowStart: performance.now(), framesInWindow: 0,
                bytesInWindow: 0, bytesPerS: 0};
  let ws = null, retries = 0, lastDom = 0, lastCharts = 0, chartVersion = -1;

  const pageNow = () => performance.now() / 1000;
  const engineNow = () => (clock.offset === null ? s.latestT : pageNow() - clock.offset);

  // ------------------------------------------------------------ formatting
  function fmtS(v) {
    if (v === null || v === undefined || !isFinite(v)) return "—";
    const a = Math.abs(v);
    if (a >= 10) return `${v.toFixed(1)} s`;
    if (a >= 1) return `${v.toFixed(2)} s`;
    if (a >= 0.01) return `${(v * 1000).toFixed(0)} ms`;
    return `${(v * 1000).toFixed(1)} ms`;
  }
  function fmtBytes(b) {
    if (b >= 1e9) return `${(b / 1e9).toFixed(2)} GB`;
    if (b >= 1e6) return `${(b / 1e6).toFixed(1)} MB`;
    if (b >= 1e3) return `${(b / 1e3).toFixed(1)} kB`;
    return `${b} B`;
  }
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;   // never innerHTML: prompts and outputs are untrusted
    return e;
  }
  let toastTimer = null;
  function toast(msg) {
    const t = $("toast");
    t.textContent = msg;
    t.classList.add("show");
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => t.classList.remove("show"), 6000);
  }

  // ------------------------------------------------------------ connection
  function send(msg) {
    if (ws && ws.readyState === WebSocket.OPEN) { ws.send(JSON.stringify(msg)); return true; }
    toast("not connected: the message was not sent");
    return false;
  }

  function setConn(state, text) {
    const c = $("conn");
    c.dataset.state = state;
    c.textContent = text;
  }

  function connect() {
    const proto = location.protocol === "https:" ? "wss://" : "ws://";
    ws = new WebSocket(proto + location.host + "/ws");
    ws.onopen = () => {
      retries = 0;
      setConn("connected", "live");
      // A new connection may be a new server whose clock restarted at 0: sync afresh.
      clock.offset = null; clock.best = Infinity;
      // Rounds soon after connect (a busy server or page skews the first), then every 30 s for drift.
      for (const delay of [0, 2000, 8000]) setTimeout(syncRound, delay);
      clearInterval(clock.timer);
      clock.timer = setInterval(syncRound, 30000);
    };
    ws.onmessage = (e) => {
      const arrived = pageNow();
      s.frames++; s.bytes += e.data.length; perf.bytesInWindow += e.data.length;
      let events;
      try { events = JSON.parse(e.data); } catch (err) { toast(`bad frame from server: ${err}`); return; }
      const at = clock.offset === null ? null : arrived - clock.offset;
      for (const ev of events) {
        if (ev.type === "sync") { onSync(ev, arrived); continue; }
        FT.ingest(s, ev, at);
        if (ev.type === "hello") onHello(ev);
        else if (ev.type === "error") toast(`server: ${ev.field ? ev.field + ": " : ""}${ev.message}`);
        else if (ev.type === "request" && ev.source === "page" && ui.awaitOwn) { ui.awaitOwn = false; ui.selected = ev.id; }
        else if (ev.type === "settings") { applySettingsToControls(); writeUrl(); }
        else if (ev.type === "dropped") toast(`this page fell behind: the server dropped ${ev.count} events for it`);
      }
      ui.dirtyDom = true;
    };
    ws.onclose = () => {
      clearInterval(clock.timer);
      const wait = Math.min(5000, 300 * 2 ** retries++);
      setConn("down", `reconnecting in ${(wait / 1000).toFixed(1)} s`);
      setTimeout(connect, wait);
    };
  }

  function syncRound() {
    for (let i = 0; i < 5; i++) setTimeout(() => send({type: "sync", client_t: performance.now()}), i * 60);
  }

  function onSync(ev, arrived) {
    const sent = ev.client_t / 1000;
    const rtt = arrived - sent;
    if (rtt < 0 || rtt > clock.best * 4 + 0.05) return;
    const offset = (sent + arrived) / 2 - ev.t;
    if (rtt <= clock.best || clock.offset === null) { clock.best = rtt; clock.rtt = rtt; clock.offset = offset; }
  }

  function onHello(h) {
    ui.selected = null;
    $("model").textContent = `${h.model} · ${h.device} · ${h.dtype} · ${(h.params / 1e6).toFixed(0)} M params · ` +
      `${h.layers} layers · ${h.max_slots} slots`;
    if (!ui.urlApplied) { ui.urlApplied = true; applyUrl(); }
    if (!EMBED) buildControls();
  }

  // ------------------------------------------------------------ controls
  const LABELS = {
    load: ["Load generator", ""], rate: ["Load (arrival rate)", "req/s"],
    prompt_tokens: ["Prompt length", "tokens"], max_new_tokens: ["Max new tokens", "tokens"],
    slots: ["Batch slots", ""], cache_tokens: ["KV-cache budget", ""],
    kv_cache: ["KV cache", ""], prefill_chunk: ["Chunked prefill", "tok/chunk"],
    temperature: ["Temperature", "0 = greedy"], top_p: ["Top-p", ""],
  };
  const ORDER = ["rate", "prompt_tokens", "max_new_tokens", "slots", "cache_tokens", "kv_cache",
                 "prefill_chunk", "temperature", "top_p"];

  function controlValueText(name, v) {
    if (name === "cache_tokens" && s.hello) return `${v} tok · ${fmtBytes(v * s.hello.kv_bytes_per_token)}`;
    if (name === "prefill_chunk" && v === 0) return "off";
    return String(v);
  }

  function buildControls() {
    const key = JSON.stringify(s.limits);
    if (ui.built === key) { applySettingsToControls(); return; }
    ui.built = key;
    const box = $("settings");
    box.replaceChildren();
    const names = ORDER.filter((n) => n in s.limits).concat(
      Object.keys(s.limits).filter((n) => !ORDER.includes(n) && n !== "load"));
    for (const name of names) {
      const lim = s.limits[name];
      const [label, unit] = LABELS[name] || [name, ""];
      const row = el("div", "ctl");
      row.dataset.name = name;
      row.title = lim.doc || "";
      const head = el("label", "ctl-head");
      head.append(el("span", "ctl-name", label), el("output", "ctl-val"), el("span", "ctl-unit", unit));
      row.append(head);
      let input;
      if (lim.kind === "bool") {
        input = el("input");
        input.type = "checkbox";
        input.className = "toggle";
        input.addEventListener("change", () => send({type: "set", settings: {[name]: input.checked}}));
        head.prepend(input);
      } else {
        input = el("input");
        input.type = "range";
        input.min = lim.min; input.max = lim.max; input.step = lim.step;
        input.addEventListener("input", () => { head.querySelector("output").textContent = controlValueText(name, +input.value); });
        input.addEventListener("pointerdown", () => { ui.dragging = name; });
        input.addEventListener("pointerup", () => { ui.dragging = null; });
        input.addEventListener("change", () => {
          const v = lim.kind === "int" ? parseInt(input.value, 10) : parseFloat(input.value);
          send({type: "set", settings: {[name]: v}});
        });
        row.append(input);
      }
      input.id = `set-${name}`;
      input.name = name;
      if (lim.applies && lim.applies !== "live") {
        const tag = el("span", "applies", lim.applies);
        tag.title = `a change applies to ${lim.applies} only`;
        head.querySelector(".ctl-name").after(tag);
      }
      box.append(row);
    }
    applySettingsToControls();
  }

  function applySettingsToControls() {
    if (EMBED) return;
    for (const [name, v] of Object.entries(s.settings)) {
      const input = $(`set-${name}`);
      if (input && ui.dragging !== name) {
        if (input.type === "checkbox") input.checked = !!v;
        else input.value = v;
        input.closest(".ctl").querySelector("output").textContent =
          input.type === "checkbox" ? (v ? "on" : "off") : controlValueText(name, v);
      }
    }
    const btn = $("btn-load");
    btn.dataset.on = String(!!s.settings.load);
    btn.textContent = s.settings.load ? "Stop load" : "Start load";
  }

  // After any settings change the address bar carries the settings that differ from their defaults.
  function writeUrl() {
    const q = new URLSearchParams();
    for (const [name, v] of Object.entries(s.settings)) {
      const lim = s.limits[name];
      if (lim && v !== lim.default) q.set(name, String(v));
    }
    const qs = q.toString();
    history.replaceState(null, "", location.pathname + (qs ? `?${qs}` : ""));
  }

  function applyUrl() {
    const params = new URLSearchParams(location.search);
    const changes = {}, ignored = [];
    for (const [name, raw] of params) {
      const lim = s.limits[name];
      if (!lim) { ignored.push(name); continue; }
      if (lim.kind === "bool") changes[name] = ["1", "true", "on", "yes"].includes(raw.toLowerCase());
      else changes[name] = Number(raw);   // the server validates and names a bad field
    }
    if (ignored.length) toast(`ignored unknown URL parameter(s): ${ignored.join(", ")}`);
    if (Object.keys(changes).length) send({type: "set", settings: changes});
  }

  function wireButtons() {
    if (EMBED) return;
    $("btn-load").addEventListener("click", () => send({type: "load", on: !s.settings.load}));
    $("btn-burst").addEventListener("click", () => send({type: "burst", n: parseInt($("burst-n").value, 10) || 8}));
    $("btn-reset").addEventListener("click", () => send({type: "reset"}));
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

  // ------------------------------------------------------------ view controls
  function setSpan(span, anchorT) {
    const old = view.span;
    view.span = Math.min(600, Math.max(1, span));
    if (view.paused && anchorT !== undefined) view.right = anchorT + (view.right - anchorT) * (view.span / old);
    $("span-label").textContent = `${+view.span.toFixed(1)} s`;
  }
  function setPaused(p) {
    view.paused = p;
    $("btn-pause").textContent = p ? "Live" : "Pause";
    $("btn-pause").classList.toggle("primary", p);
  }

  function wireCanvas(id, hit) {
    const c = $(id);
    if (!c) return;
    c.addEventListener("wheel", (e) => {
      e.preventDefault();
      const f = ui.layouts[id] && ui.layouts[id].f;
      setSpan(view.span * (e.deltaY > 0 ? 1.25 : 0.8), f ? f.t(e.offsetX) : undefined);
    }, {passive: false});
    c.addEventListener("pointerdown", (e) => {
      if (!view.paused) return;
      const startX = e.clientX, startRight = view.right, f = ui.layouts[id] && ui.layouts[id].f;
      const move = (m) => { view.right = startRight - ((m.clientX - startX) / f.pw) * view.span; };
      const up = () => { window.removeEventListener("pointermove", move); window.removeEventListener("pointerup", up); };
      window.addEventListener("pointermove", move);
      window.addEventListener("pointerup", up);
    });
    c.addEventListener("mousemove", (e) => { ui.hover = {id, x: e.offsetX, y: e.offsetY, cx: e.clientX, cy: e.clientY, hit}; });
    c.addEventListener("mouseleave", () => { ui.hover = null; $("tip").hidden = true; });
    if (id === "timeline") {
      c.addEventListener("click", (e) => {
        const layout = ui.layouts.timeline;
        const h = layout && FT.hitTimeline(layout, s, e.offsetX, e.offsetY);
        if (h) { ui.selected = h.req.id; ui.dirtyDom = true; }
      });
    }
  }

  function wireView() {
    $("btn-zoom-in").addEventListener("click", () => setSpan(view.span * 0.8));
    $("btn-zoom-out").addEventListener("click", () => setSpan(view.span * 1.25));
    $("btn-pause").addEventListener("click", () => setPaused(!view.paused));
    document.addEventListener("keydown", (e) => {
      if (e.code === "Space" && !["TEXTAREA", "INPUT", "BUTTON"].includes(document.activeElement.tagName)) {
        e.preventDefault(); setPaused(!view.paused);
      }
    });
    wireCanvas("timeline", hoverTimeline);
    wireCanvas("kv", hoverKV);
    wireCanvas("queue", hoverQueue);
  }

  // ------------------------------------------------------------ hover read-outs (measured numbers only)
  function describeReq(r) {
    const lines = [`${r.id} · ${r.source} · ${r.promptTokens ?? "?"} prompt tokens → max ${r.maxNew ?? "?"} new`];
    if (r.rejected) { lines.push(`rejected: ${r.rejected}`); return lines; }
    if (r.tokEnd !== null) lines.push(`tokenise ${fmtS(r.tokEnd - r.tokStart)}`);
    if (r.queueS !== null) lines.push(`queued ${fmtS(r.queueS)} → slot ${r.slot}, ${r.blocks} KV blocks`);
    if (r.prefills.length) {
      const sum = r.prefills.reduce((a, p) => a + (p.end - p.start), 0);
      lines.push(`prefill ${fmtS(sum)} in ${r.prefills.length} chunk${r.prefills.length > 1 ? "s" : ""}`);
    }
    if (r.ttft !== null) lines.push(`TTFT ${fmtS(r.ttft)} · per later token ${fmtS(r.tpot)} · e2e ${fmtS(r.e2e)}`);
    lines.push(`${r.tokens.length} tokens out${r.reason ? ` · ${r.reason}` : " · running"}`);
    return lines;
  }
  function hoverTimeline(h) {
    const hit = FT.hitTimeline(ui.layouts.timeline, s, h.x, h.y);
    if (!hit) return null;
    const lines = describeReq(hit.req);
    if (hit.step) lines.push(`decode step ${fmtS(hit.step.end - hit.step.start)} · batch of ${hit.step.ids.length}`);
    return lines;
  }
  function stepAt(t) {
    let found = null;
    for (const st of s.steps) { if (st.end <= t) found = st; else break; }
    return found;
  }
  function hoverKV(h) {
    const f = ui.layouts.kv && ui.layouts.kv.f;
    if (!f || !s.hello) return null;
    const st = stepAt(f.t(h.x));
    if (!st) return null;
    const bpt = s.hello.kv_bytes_per_token, bs = s.hello.block_size;
    return [`t = ${f.t(h.x).toFixed(2)} s, ${st.kind === "release" ? `after ${st.ids[0]} finished` : `after a ${st.kind} step`}`,
            `filled ${st.cacheTokens} tokens (${fmtBytes(st.cacheTokens * bpt)}) by ${st.stack.length} requests`,
            `reserved ${st.blocksUsed} blocks = ${st.blocksUsed * bs} tokens (${fmtBytes(st.blocksUsed * bs * bpt)})`];
  }
  function hoverQueue(h) {
    const f = ui.layouts.queue && ui.layouts.queue.f;
    if (!f) return null;
    const t = f.t(h.x);
    let p = null;
    for (const q of s.stats) { if (q.t <= t) p = q; else break; }
    return p ? [`t = ${p.t.toFixed(2)} s`, `${p.queue} waiting · ${p.running} running · ${p.tps.toFixed(1)} tokens/s`] : null;
  }

  // ------------------------------------------------------------ per-frame drawing
  function drawFrame() {
    const now = engineNow();
    if (!view.paused) view.right = now + view.span * 0.03;
    const opts = {selected: ui.selected};
    ui.layouts.timeline = FT.drawTimeline($("timeline"), s, view, now, opts);
    if (!EMBED) {
      ui.layouts.kv = FT.drawKV($("kv"), s, view, now);
      ui.layouts.queue = FT.drawQueue($("queue"), s, view, now);
    }
    if (ui.hover) {
      const lines = ui.hover.hit(ui.hover);
      const tip = $("tip");
      if (lines) {
        tip.textContent = lines.join("\n");
        tip.hidden = false;
        const x = Math.min(window.innerWidth - tip.offsetWidth - 8, ui.hover.cx + 14);
        const y = Math.min(window.innerHeight - tip.offsetHeight - 8, ui.hover.cy + 14);
        tip.style.left = `${x}px`; tip.style.top = `${y}px`;
      } else tip.hidden = true;
    }
  }

  function loop(ts) {
    perf.frames++; perf.framesInWindow++;
    if (ts - perf.windowStart >= 1000) {
      const dt = (ts - perf.windowStart) / 1000;
      perf.fps = perf.framesInWindow / dt;
      perf.bytesPerS = perf.bytesInWindow / dt;
      perf.framesInWindow = 0; perf.bytesInWindow = 0; perf.windowStart = ts;
    }
    const t0 = performance.now();
    drawFrame();
    perf.drawMs = 0.9 * perf.drawMs + 0.1 * (performance.now() - t0);   // smoothed script time per frame
    if (ts - lastDom >= 250) { lastDom = ts; updateDom(); }
    if (!EMBED && ts - lastCharts >= 500) { lastCharts = ts; updateCharts(); }
    requestAnimationFrame(loop);
  }

  // ------------------------------------------------------------ DOM panels (4 Hz)
  function updateDom() {
    const L = s.last;
    const pct = (o, k) => (o && o[k] !== undefined ? o[k] : null);
    $("h-ttft50").textContent = fmtS(pct(L && L.ttft, "p50"));
    $("h-ttft99").textContent = `${fmtS(pct(L && L.ttft, "p90"))} · ${fmtS(pct(L && L.ttft, "p99"))}`;
    $("h-itl50").textContent = fmtS(pct(L && L.itl, "p50"));
    $("h-itl99").textContent = `${fmtS(pct(L && L.itl, "p90"))} · ${fmtS(pct(L && L.itl, "p99"))}`;
    $("h-tps").textContent = L ? L.tokens_per_s.toFixed(1) : "—";
    $("h-running").textContent = L ? `${L.running}/${s.settings.slots ?? "?"}` : "—";
    $("h-waiting").textContent = L ? String(L.queue) : "—";
    const recent = s.delivery.slice(-300);
    $("h-delivery").textContent = clock.offset === null ? "syncing" : fmtS(FT.percentile(recent, 50));
    const loading = s.loading;
    if (loading && !s.hello) setConn("loading", `loading model: ${loading.message} ${(loading.progress * 100).toFixed(0)}%`);
    $("foot").textContent = `page ${perf.fps.toFixed(0)} fps (${perf.drawMs.toFixed(1)} ms drawing) · websocket ${fmtBytes(Math.round(perf.bytesPerS))}/s · ` +
      `${s.events} events · clock offset ${clock.offset === null ? "—" : "±" + fmtS(clock.rtt / 2)}` +
      (s.dropped ? ` · ${s.dropped} events dropped for this page` : "");
    if (EMBED || !ui.dirtyDom) return;
    ui.dirtyDom = false;
    updateKVInfo(); updateSlots(); updateDetail();
  }

  function updateKVInfo() {
    const h = s.hello;
    if (!h) return;
    const L = s.last;
    const bpt = h.kv_bytes_per_token;
    const bytesPer = (h.dtype === "float32" ? 4 : 2);
    const filled = L ? L.cache_tokens : 0;
    $("kv-info").textContent = `${fmtBytes(bpt)}/token (2 × ${h.layers} layers × ${h.kv_heads} KV heads × ` +
      `${h.head_dim} dims × ${bytesPer} B) · filled ${filled} tok = ${fmtBytes(filled * bpt)} · budget ` +
      `${L ? L.cache_blocks * h.block_size : "—"} tok = ${L ? fmtBytes(L.cache_blocks * h.block_size * bpt) : "—"}`;
    const badge = $("kv-full");
    // The engine says what the head of the queue waits for (stats.blocked_on).
    const cacheBound = L && L.queue > 0 && L.blocked_on === "cache";
    badge.hidden = !cacheBound;
    if (cacheBound) badge.textContent = `cache full: ${L.queue} waiting for KV blocks (${L.cache_blocks_used}/${L.cache_blocks} reserved)`;
    const why = {cache: "for KV-cache blocks", slot: `for a batch slot (${L && L.running}/${s.settings.slots} busy)`,
                 drain: "for running requests to drain (KV-cache mode changed)"};
    $("queue-info").textContent = L ? (L.queue === 0 ? "nobody waiting" :
      `${L.queue} waiting ${why[L.blocked_on] || ""}`.trim()) : "";
  }

  function chip(id) {
    const c = el("button", "rchip", id);
    c.style.setProperty("--c", FT.reqColor(id));
    c.addEventListener("click", () => { ui.selected = id; ui.dirtyDom = true; });
    return c;
  }

  function updateSlots() {
    const box = $("slots");
    const limit = s.settings.slots || s.slots.length;
    const cells = s.slots.map((id, i) => {
      const cell = id ? chip(id) : el("span", i < limit ? "slot free" : "slot off", i < limit ? "free" : "off");
      cell.classList.add("cell");
      return cell;
    });
    box.replaceChildren(...cells);
    $("slots-info").textContent = `${s.slots.filter(Boolean).length} busy of ${limit}`;
    const w = $("waiting");
    const L = s.last;
    w.replaceChildren(...s.waiting.slice(0, 40).map((id) => chip(id)));
    if (L && L.queue > s.waiting.slice(0, 40).length) w.append(el("span", "muted", ` +${L.queue - Math.min(40, s.waiting.length)} more`));
    $("waiting-info").textContent = L ? `${L.queue} in queue` : "";
  }

  // The request panel follows the newest request with output (else the newest) unless one was picked.
  function selectedReq() {
    if (ui.selected && s.reqs.has(ui.selected)) return s.reqs.get(ui.selected);
    for (let i = s.order.length - 1; i >= 0; i--) {
      const r = s.reqs.get(s.order[i]);
      if (r.first !== null) return r;
    }
    const id = s.order[s.order.length - 1];
    return id ? s.reqs.get(id) : null;
  }

  const STAGES = [["queue", "queue"], ["tokenize", "tokenise"], ["prefill", "prefill"],
                  ["first_sample", "first sample"], ["delivery", "delivery (server)"], ["other", "other"]];
  const LATER = [["decode", "decode step"], ["sample", "sample"], ["delivery", "delivery (server)"]];

  function stackedBar(parts, total, label) {
    const wrap = el("div", "acc");
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

  let detailKey = "";
  function updateDetail() {
    const r = selectedReq();
    const box = $("d-accounting");
    if (!r) { $("d-title").textContent = "— none yet"; box.replaceChildren(); $("d-chips").replaceChildren(); $("d-text").textContent = ""; return; }
    const state = r.rejected ? "rejected" : r.end !== null ? r.reason : r.first !== null ? "decoding" :
      r.prefills.length ? "prefilling" : "waiting";
    $("d-title").textContent = `${r.id} · ${r.source} · ${state}${ui.selected ? "" : " (newest)"}`;
    const key = `${s.epoch}:${r.id}:${r.tokens.length}:${r.end}:${r.pieces ? 1 : 0}:${r.pageFirstDelivery}`;
    if (key === detailKey) return;
    detailKey = key;
    $("d-text").textContent = r.text.join("");
    const chips = $("d-chips");
    if (chips.dataset.req !== `${s.epoch}:${r.id}` || (r.pieces && !chips.childElementCount)) {
      chips.dataset.req = `${s.epoch}:${r.id}`;
      const list = [];
      (r.pieces || []).forEach((p, i) => {
        const c = el("span", "tok");
        c.append(el("span", "piece", p.replace(/ /g, "·").replace(/\n/g, "⏎") || "∅"), el("span", "tid", String(r.ids[i])));
        list.push(c);
      });
      if (r.truncated) list.push(el("span", "muted", ` … ${r.promptTokens - r.pieces.length} more`));
      chips.replaceChildren(...list);
      const text = el("div", "prompt-text", (r.pieces || []).join(""));
      chips.append(text);
      $("d-ntok").textContent = r.promptTokens !== null ? `(${r.promptTokens})` : "";
    }
    const out = [];
    if (r.rejected) out.push(el("div", "acc-total", `rejected: ${r.rejected}`));
    else if (r.stages) {
      const parts = STAGES.map(([k, name]) => ({cls: k, name, v: r.stages[k]}));
      const here = r.pageFirstDelivery;
      out.push(stackedBar(parts, `= TTFT ${fmtS(r.ttft)} measured by the server` +
        (here !== null ? ` · + ${fmtS(here)} to reach this page` : ""), "time to first token"));
      if (r.later) {
        const lp = LATER.map(([k, name]) => ({cls: `l-${k}`, name, v: r.later[k]}));
        const rest = r.tpot - (r.later.decode + r.later.sample + r.later.delivery);
        lp.push({cls: "other", name: "other", v: rest});
        out.push(stackedBar(lp, `= ${fmtS(r.tpot)} per later token (mean of ${r.outputTokens - 1})`, "each later token"));
      }
    } else {
      const bits = [];
      if (r.queueS !== null) bits.push(`queued ${fmtS(r.queueS)}`);
      if (r.prefills.length) bits.push(`prefill ${fmtS(r.prefills.reduce((a, p) => a + p.end - p.start, 0))}`);
      if (r.first !== null) bits.push(`first token at +${fmtS(r.first - r.arrival)}`);
      out.push(el("div", "acc-total", `${bits.join(" · ") || "waiting"} — the full accounting arrives when it finishes`));
    }
    box.replaceChildren(...out);
  }

  // ------------------------------------------------------------ plotly charts (2 Hz)
  const PLOT_LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: {color: "#c9d4df", size: 13, family: "system-ui, sans-serif"},
    margin: {l: 52, r: 10, t: 6, b: 36}, showlegend: true,
    legend: {orientation: "h", y: -0.22, font: {size: 11}},
  };
  const PLOT_CONFIG = {displayModeBar: false, responsive: true, staticPlot: false};
  const STAGE_COLORS = {queue: "#f2a93b", tokenize: "#b083f0", prefill: "#4aa3ff", first_sample: "#ff6b9a",
                        delivery: "#3ddc97", other: "#6b7785"};

  function updateCharts() {
    if (!window.Plotly || s.version === chartVersion) return;
    chartVersion = s.version;
    const stagesDiv = $("chart-stages"), stepsDiv = $("chart-steps");
    if (stagesDiv.offsetParent !== null) {
      const done = [];
      for (let i = s.order.length - 1; i >= 0 && done.length < 16; i--) {
        const r = s.reqs.get(s.order[i]);
        if (r.stages) done.push(r);
      }
      done.reverse();
      const y = done.map((r) => r.id);
      const data = STAGES.map(([k, name]) => ({type: "bar", orientation: "h", name, y, x: done.map((r) => r.stages[k] * 1000),
                                               marker: {color: STAGE_COLORS[k]}, hovertemplate: `%{y} ${name}: %{x:.1f} ms<extra></extra>`}));
      Plotly.react(stagesDiv, data, Object.assign({}, PLOT_LAYOUT, {
        barmode: "stack", showlegend: false, margin: {l: 52, r: 10, t: 4, b: 34}, xaxis: {title: {text: "ms", standoff: 2}, gridcolor: "rgba(255,255,255,0.08)", zeroline: false},
        yaxis: {type: "category", automargin: true, tickfont: {family: "ui-monospace, monospace", size: 11}},
      }), PLOT_CONFIG);
    }
    if (stepsDiv.offsetParent !== null) {
      const on = s.points.filter((p) => p.kv), off = s.points.filter((p) => !p.kv);
      const medians = (pts) => {
        const by = new Map();
        for (const p of pts) { if (!by.has(p.batch)) by.set(p.batch, []); by.get(p.batch).push(p.ms); }
        const xs = [...by.keys()].sort((a, b) => a - b);
        return {x: xs, y: xs.map((b) => FT.percentile(by.get(b), 50))};
      };
      const jitter = (p) => p.batch + ((p.ms * 7919) % 1 - 0.5) * 0.3;   // deterministic spread so dots don't stack
      const data = [
        {type: "scattergl", mode: "markers", name: "KV cache on", x: on.map(jitter), y: on.map((p) => p.ms),
         marker: {color: "rgba(39,181,169,0.45)", size: 5}, hoverinfo: "skip"},
        Object.assign({type: "scatter", mode: "lines+markers", name: "median", line: {color: "#27b5a9", width: 3},
                       hovertemplate: "batch %{x}: median %{y:.1f} ms<extra></extra>"}, medians(on)),
      ];
      if (off.length) {
        data.push({type: "scattergl", mode: "markers", name: "KV cache off", x: off.map(jitter), y: off.map((p) => p.ms),
                   marker: {color: "rgba(255,90,90,0.5)", size: 5}, hoverinfo: "skip"});
        data.push(Object.assign({type: "scatter", mode: "lines", name: "median (off)", line: {color: "#ff5a5a", width: 3}}, medians(off)));
      }
      const bw = s.hello && s.hello.bandwidth;
      const shapes = [], annotations = [];
      if (bw && typeof bw.floor_s === "number") {
        shapes.push({type: "line", xref: "paper", x0: 0, x1: 1, y0: bw.floor_s * 1000, y1: bw.floor_s * 1000,
                     line: {color: "#ffd166", width: 2, dash: "dash"}});
        annotations.push({xref: "paper", x: 0.01, xanchor: "left", y: bw.floor_s * 1000, yanchor: "bottom", showarrow: false,
                          font: {color: "#ffd166", size: 12},
                          text: `estimated floor: weight bytes ÷ measured bandwidth` +
                                (typeof bw.gbs === "number" ? ` (${fmtBytes(s.hello.weight_bytes)} ÷ ${bw.gbs.toFixed(1)} GB/s)` : "")});
      }
      $("step-info").textContent = `(${s.points.length} measured decode steps)`;
      Plotly.react(stepsDiv, data, Object.assign({}, PLOT_LAYOUT, {
        shapes, annotations, legend: {x: 1, xanchor: "right", y: 1, bgcolor: "rgba(10,15,20,0.7)", font: {size: 11}},
        margin: {l: 52, r: 10, t: 4, b: 38},
        xaxis: {title: {text: "requests in the batch", standoff: 2}, dtick: 1, gridcolor: "rgba(255,255,255,0.08)", zeroline: false},
        yaxis: {title: {text: "ms per step"}, rangemode: "tozero", gridcolor: "rgba(255,255,255,0.08)"},
      }), PLOT_CONFIG);
    }
  }

  // ------------------------------------------------------------ start
  window.firstToken = {state: s, view, ui, clock, perf, send,
                       select: (id) => { ui.selected = id; ui.dirtyDom = true; }};
  wireButtons();
  wireView();
  connect();
  requestAnimationFrame(loop);
})();
