// First Token: compare two runs side by side. A comparison changes one setting (KV cache on
// or off; static or continuous batching; chunked prefill or prefill-first) on top of the same
// base settings; the page runs the same burst under A, records its events until all its
// requests finish, then under B, and draws the two recordings on aligned timelines (each in
// its own state, times from its burst) with their TTFT p50 and total tokens/s. The burst
// carries a seed so the engine can draw the same prompts twice; the page checks the prompts'
// first tokens and says whether they matched.
"use strict";
(function () {
  const FT = window.FT;
  const {$, el, fmtS} = FT;
  let app, teach;
  let recording = null;   // {events, t0} while a run is captured
  let runs = null, busy = false;

  const SEED = 7;
  // base: the preset whose settings frame the comparison (when the server has it); a/b: the one setting that differs.
  const COMPARISONS = {
    kv: {title: "KV cache on vs off", base: "kv-cache-off", a: ["KV cache on", {kv_cache: true}], b: ["KV cache off", {kv_cache: false}]},
    batching: {title: "static vs continuous batching", base: "continuous-batching",
               a: ["static batching", {schedule: "static"}], b: ["continuous batching", {schedule: "mixed"}]},
    chunked: {title: "prefill-first vs chunked prefill", base: "chunked-prefill",
              a: ["prefill-first", {schedule: "prefill-first"}], b: ["chunked prefill (mixed)", {schedule: "mixed"}]},
  };
  const TIME_KEYS = ["t", "start", "end", "sampled"];

  const until = (pred, ms) => new Promise((resolve, reject) => {
    const end = performance.now() + ms;
    const timer = setInterval(() => {
      if (pred()) { clearInterval(timer); resolve(); }
      else if (performance.now() > end) { clearInterval(timer); reject(new Error("timed out")); }
    }, 100);
  });

  // The settings of one side: as the base preset leaves them (defaults and its own values),
  // the side's one change, and no load generator (the burst is the whole run).
  function sideSettings(cmp, side) {
    return Object.assign(teach.presetSettings(cmp.base), cmp[side][1], {load: false});
  }

  // An event with its times counted from the run's start, so both runs share one axis.
  function shifted(ev, t0) {
    const out = Object.assign({}, ev);
    for (const k of TIME_KEYS) if (typeof out[k] === "number") out[k] -= t0;
    return out;
  }

  async function runSide(cmp, side, n) {
    const s = app.s, want = sideSettings(cmp, side);
    app.send({type: "reset"});
    app.send({type: "set", settings: want});
    await until(() => Object.entries(want).every(([k, v]) => s.settings[k] === v) && s.last && s.last.running === 0 &&
                s.last.queue === 0, 30000);
    recording = {events: [], t0: s.latestT};
    app.send({type: "burst", n, seed: SEED});
    const mine = () => recording.events.filter((e) => e.type === "request");
    const over = () => recording.events.filter((e) => e.type === "finished" || e.type === "rejected").length;
    await until(() => mine().length >= n && over() >= n, 180000);
    const rec = recording;
    recording = null;
    const rs = FT.createState();
    FT.ingest(rs, shifted(s.hello, s.hello.t), null);
    rs.settings = Object.assign({}, s.settings);
    const first = rec.events.find((e) => e.type === "request");
    const t0 = first ? first.t : rec.t0;
    for (const ev of rec.events) { const e = shifted(ev, t0); FT.ingest(rs, e, null); FT.noteWaits(rs, e); }
    return {label: cmp[side][0], settings: want, s: rs, prompts: rec.events.filter((e) => e.type === "tokenized").map((e) => e.ids.join(","))};
  }

  // TTFT p50, total tokens/s (output tokens ÷ first arrival to last finish), ITL-ish per-token p50.
  function figures(rs) {
    const done = [...rs.reqs.values()].filter((r) => r.ttft !== null && r.end !== null);
    if (!done.length) return null;
    const span = Math.max(...done.map((r) => r.end)) - Math.min(...done.map((r) => r.arrival));
    const out = done.reduce((a, r) => a + (r.outputTokens || 0), 0);
    return {n: done.length, ttft: FT.percentile(done.map((r) => r.ttft), 50), tps: out / span, span,
            tpot: FT.percentile(done.filter((r) => r.tpot).map((r) => r.tpot), 50)};
  }

  async function run() {
    if (busy) return;
    const cmp = COMPARISONS[$("c-which").value], n = parseInt($("c-n").value, 10) || 6;
    busy = true; runs = null;
    $("c-run").disabled = true;
    try {
      status(`running A: ${cmp.a[0]} (${n} requests)…`);
      const a = await runSide(cmp, "a", n);
      status(`running B: ${cmp.b[0]} (the same ${n} requests)…`);
      const b = await runSide(cmp, "b", n);
      runs = {cmp, a, b};
      const same = a.prompts.length === b.prompts.length && a.prompts.every((p, i) => p === b.prompts[i]);
      status(same ? `Done. The same ${n} prompts both times (checked by their first tokens); only ${Object.keys(cmp.a[1]).join(", ")} differs.`
                  : `Done. Prompts of the same length, but not the same text: this engine's burst does not take a seed.`);
      $("sheet-compare").dataset.same = String(same);
    } catch (e) {
      recording = null;
      status(`The comparison stopped: ${e.message}.`);
    } finally {
      busy = false;
      $("c-run").disabled = false;
    }
  }

  function status(text) { $("c-status").textContent = text; }

  function draw() {
    if (!runs) return;
    const fa = figures(runs.a.s), fb = figures(runs.b.s);
    const span = Math.max(fa ? fa.span : 1, fb ? fb.span : 1) * 1.06;
    const view = {span, right: span * 0.99, paused: true};
    for (const [side, f] of [["a", fa], ["b", fb]]) {
      const r = runs[side];
      $(`c-${side}-label`).textContent = `${side.toUpperCase()} · ${r.label}`;
      $(`c-${side}-figs`).replaceChildren(...(f ? [
        fig("TTFT p50", fmtS(f.ttft)), fig("total tokens/s", f.tps.toFixed(1)), fig("per later token p50", fmtS(f.tpot)),
        fig("all done after", fmtS(f.span))] : [fig("no request finished", "")]));
      FT.drawTimeline($(`c-${side}-canvas`), r.s, view, span, {selected: null});
    }
  }

  function fig(k, v) {
    const d = el("div", "fig");
    d.append(el("span", "k", k), el("span", "v", v));
    return d;
  }

  FT.teach.register({
    init(a, t) {
      app = a; teach = t;
      $("c-which").replaceChildren(...Object.entries(COMPARISONS).map(([k, c]) => { const o = el("option", "", c.title); o.value = k; return o; }));
      $("btn-compare").addEventListener("click", () => { $("sheet-compare").hidden = false; });
      $("c-close").addEventListener("click", () => { $("sheet-compare").hidden = true; });
      $("c-run").addEventListener("click", run);
    },
    onEvent(ev) { if (recording) recording.events.push(ev); },
    update() { if (!$("sheet-compare").hidden) draw(); },
  });
  FT.compare = {COMPARISONS, figures, get runs() { return runs; }, run};
})();
