// First Token: the teaching layer's hub and its presets. Teaching parts (tour, diagnosis,
// measure, compare, presenter) register here; the boot file calls them once with the app,
// for every event, and on the 4 Hz DOM tick. This file also draws the presets panel (one
// button per `hello.presets` entry, each sending `{"type": "preset", "name": …}`), applies
// `/?preset=NAME` once on load, and shows the lesson banner: the active preset (from the
// `preset` event, so every page and a replayed trace show it) with its explanation, the
// number that proves it, and that number measured live (ft-figures.js).
"use strict";
(function () {
  const FT = window.FT;
  const {$, el} = FT;
  let app, s;
  let urlDone = false;

  const parts = [];
  const teach = {
    parts,
    active: null,         // the last `preset` event: {name, title, explain, watch, t}
    lesson: null,         // set by the tour while it runs: {kicker, title, text, watch, live, spot}
    register(part) { parts.push(part); },
    presets() { return (s.hello && s.hello.presets) || []; },
    preset(name) { return teach.presets().find((p) => p.name === name) || null; },
    // A reset (every preset and comparison starts with one) cancels everything in flight: in a
    // classroom the presenter is asked first when students' questions would go. False: don't.
    confirmReset(what) {
      const asking = [...s.reqs.values()].filter((r) => r.source === "join" && r.end === null);
      if (!asking.length || document.body.dataset.role !== "presenter") return true;
      const who = [...new Set(asking.map((r) => r.label || r.id))];
      const list = who.slice(0, 5).join(", ") + (who.length > 5 ? ` and ${who.length - 5} more` : "");
      return window.confirm(`${asking.length} student question${asking.length > 1 ? "s are" : " is"} still ` +
                            `running or waiting (${list}). ${what} resets the engine and cancels ` +
                            `${asking.length > 1 ? "them" : "it"}. Go ahead?`);
    },
    apply(name) { return teach.confirmReset("Starting a lesson") && app.send({type: "preset", name}); },
    // Which part of the page matters for a preset (presenter mode enlarges it; the tour spots it).
    FOCUS: {idle: "timeline", queueing: "queue", "long-document": "timeline", "many-users": "slots",
            "small-cache": "kv", "kv-cache-off": "steps", "shared-prefix": "blocks", "static-batching": "timeline",
            "continuous-batching": "timeline", "chunked-prefill": "timeline", "prefill-first": "timeline"},
    // A preset's value as this engine applies it: numbers clamped to its limits (engine/presets.py).
    clamp(name, v) {
      const lim = s.limits[name];
      return lim && typeof v === "number" && (lim.kind === "int" || lim.kind === "float") ? Math.min(lim.max, Math.max(lim.min, v)) : v;
    },
    // Every setting as applying the preset leaves it: defaults, then the preset's own values.
    presetSettings(name) {
      const p = teach.preset(name), out = {};
      for (const k in s.limits) out[k] = s.limits[k].default;
      if (p) for (const k in p.settings) if (k in s.limits) out[k] = teach.clamp(k, p.settings[k]);
      return out;
    },
    focus() { return (teach.lesson && teach.lesson.focus) || (teach.active && teach.FOCUS[teach.active.name]) || ""; },
  };

  function buildPresets() {
    const list = teach.presets();
    $("teach").hidden = !list.length && !(s.hello && s.hello.mode === "engine");
    $("presets").replaceChildren(...list.map((p, i) => {
      const b = el("button", "preset");
      b.dataset.preset = p.name;
      b.append(el("span", "key", i < 9 ? String(i + 1) : ""), el("span", "", p.title));
      b.title = `${p.explain}\n\nWatch: ${p.watch}\n(/?preset=${p.name}${i < 9 ? `, key ${i + 1}` : ""})`;
      b.addEventListener("click", () => teach.apply(p.name));
      return b;
    }));
  }

  // `/?preset=NAME` is sent once, after the first hello, before the URL's settings (which then
  // adjust the preset). An unknown name is the server's to refuse (an `error` names it).
  function applyUrl() {
    if (urlDone) return;
    urlDone = true;
    const name = new URLSearchParams(location.search).get("preset");
    if (name && !FT.replay.active()) teach.apply(name);   // a replayed trace's page changes nothing
  }

  function onEvent(ev) {
    if (ev.type === "hello") { teach.active = null; buildPresets(); applyUrl(); }
    else if (ev.type === "preset") teach.active = ev;
    else if (ev.type === "reset") teach.active = null;   // a preset's own reset comes before it
  }

  // The banner: the tour's step while it runs, else the active preset.
  function banner() {
    const p = teach.active;
    const les = teach.lesson || (p && {kicker: "preset", title: p.title, text: p.explain, watch: p.watch,
                                       live: FT.proofText(p.name, s, p.t)});
    const box = $("lesson");
    box.hidden = !les;
    for (const b of document.querySelectorAll("#presets .preset")) b.classList.toggle("on", !!p && b.dataset.preset === p.name);
    if (!les) return;
    $("lesson-kicker").textContent = les.kicker;
    $("lesson-title").textContent = les.title;
    $("lesson-text").textContent = les.text;
    $("lesson-watch").textContent = les.watch || "";
    $("lesson-live").textContent = les.live || "";
    $("lesson-live").parentElement.hidden = !les.live;
    $("lesson-nav").hidden = !teach.lesson;
    // Settings moved away from the preset since it was applied: say so, the figure may not prove it then.
    const def = p && !teach.lesson && teach.preset(p.name);
    const moved = def ? Object.keys(def.settings).filter((k) => k in s.settings && s.settings[k] !== teach.clamp(k, def.settings[k])) : [];
    $("lesson-moved").textContent = moved.length ? `settings changed since: ${moved.join(", ")}` : "";
  }

  teach.init = function (a) {
    app = a; s = a.s;
    if (!a.embed) for (const part of parts) if (part.init) part.init(app, teach);
  };
  teach.onEvent = function (ev) {
    if (app.embed) {   // an embed runs its ?preset= and shows its banner; no other teaching
      if (ev.type === "preset") teach.active = ev;
      else if (ev.type === "hello" || ev.type === "reset") teach.active = null;
      if (ev.type === "hello") applyUrl();
      return;
    }
    onEvent(ev);
    for (const part of parts) if (part.onEvent) part.onEvent(ev);
  };
  teach.update = function () {
    banner();
    if (app.embed) return;
    for (const part of parts) if (part.update) part.update();
    document.body.dataset.focus = teach.focus();
  };

  FT.teach = teach;
})();
