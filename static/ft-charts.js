// First Token: the plotly charts, redrawn at 2 Hz when the state moved and only while
// visible. Where the time to first token went for the last finished requests, and the
// measured decode step time against batch size with the estimated bandwidth floor.
// Colours come from the palette in ft.css (FT.palette).
"use strict";
(function () {
  const FT = window.FT;
  const P = FT.palette;
  let s;   // the page state, from init
  let version = -1;   // the state version last drawn

  const PLOT_LAYOUT = {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: {color: P.text2, size: 13, family: "system-ui, sans-serif"},
    margin: {l: 52, r: 10, t: 6, b: 36}, showlegend: true,
    legend: {orientation: "h", y: -0.22, font: {size: 11}},
  };
  const PLOT_CONFIG = {displayModeBar: false, responsive: true, staticPlot: false};
  const SHOW_FINISHED = 16;   // requests in the stages chart

  // Median step time per batch size, as a trace's x and y.
  function medians(pts) {
    const m = FT.stepMedians(pts);
    return {x: [...m.keys()], y: [...m.values()]};
  }
  const jitter = (p) => p.batch + ((p.ms * 7919) % 1 - 0.5) * 0.3;   // deterministic spread so dots don't stack

  // Dots and their median line, for the steps with the KV cache on, then (if any) off.
  function stepTraces(points) {
    const on = points.filter((p) => p.kv), off = points.filter((p) => !p.kv);
    const data = [
      {type: "scattergl", mode: "markers", name: "KV cache on", x: on.map(jitter), y: on.map((p) => p.ms),
       marker: {color: FT.alpha(P.decode, 0.45), size: 5}, hoverinfo: "skip"},
      Object.assign({type: "scatter", mode: "lines+markers", name: "median", line: {color: P.decode, width: 3},
                     hovertemplate: "batch %{x}: median %{y:.1f} ms<extra></extra>"}, medians(on)),
    ];
    if (off.length) {
      data.push({type: "scattergl", mode: "markers", name: "KV cache off", x: off.map(jitter), y: off.map((p) => p.ms),
                 marker: {color: FT.alpha(P.bad, 0.5), size: 5}, hoverinfo: "skip"});
      data.push(Object.assign({type: "scatter", mode: "lines", name: "median (off)", line: {color: P.bad, width: 3}}, medians(off)));
    }
    return data;
  }

  // The estimated floor (weight bytes ÷ measured bandwidth, from hello) as a dashed line.
  function floorMarks(hello) {
    const bw = hello && hello.bandwidth;
    if (!bw || typeof bw.floor_s !== "number") return {shapes: [], annotations: []};
    const y = bw.floor_s * 1000;
    // short enough for the narrowest chart (a phone's); the heading's tooltip says the rest
    const text = typeof bw.gbs === "number" ? `estimated floor: ${FT.fmtBytes(hello.weight_bytes)} ÷ ${bw.gbs.toFixed(1)} GB/s`
                                            : "estimated floor (weights ÷ bandwidth)";
    return {
      shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: y, y1: y, line: {color: P.accent, width: 2, dash: "dash"}}],
      annotations: [{xref: "paper", x: 0.01, xanchor: "left", y, yanchor: "bottom", showarrow: false,
                     font: {color: P.accent, size: 12}, text}],
    };
  }

  function drawStages(div) {
    const done = [];
    for (let i = s.order.length - 1; i >= 0 && done.length < SHOW_FINISHED; i--) {
      const r = s.reqs.get(s.order[i]);
      if (r.stages) done.push(r);
    }
    done.reverse();
    const y = done.map((r) => r.id);
    const data = FT.STAGES.map(([k, name]) => ({type: "bar", orientation: "h", name, y, x: done.map((r) => r.stages[k] * 1000),
      marker: {color: FT.stageColor(k)}, hovertemplate: `%{y} ${name}: %{x:.1f} ms<extra></extra>`}));
    // Rows named as the timeline names them: a classroom student's name, else the request id.
    // (a student who asked twice: both rows, told apart by request id).
    const count = new Map();
    for (const r of done) if (r.label) count.set(r.label, (count.get(r.label) || 0) + 1);
    const names = done.map((r) => (!r.label ? r.id : count.get(r.label) > 1 ? `${r.label} · ${r.id}` : r.label));
    for (const d of data) d.y = names;
    Plotly.react(div, data, Object.assign({}, PLOT_LAYOUT, {
      barmode: "stack", showlegend: false, margin: {l: 52, r: 10, t: 4, b: 42},
      xaxis: Object.assign({title: {text: "ms", standoff: 6}, automargin: true, gridcolor: P.grid, zeroline: false},
                           done.length ? {} : {range: [0, 100]}),   // empty: a positive axis, not plotly's -1…6
      yaxis: {type: "category", automargin: true, tickfont: {family: "ui-monospace, monospace", size: 12}},
    }), PLOT_CONFIG);
  }

  // One tick per batch size while they fit (about 28 px each on the narrowest chart).
  function batchTick(points) {
    const most = points.reduce((m, p) => Math.max(m, p.batch), s.settings.slots || 4);
    return most <= 12 ? 1 : most <= 24 ? 2 : most <= 48 ? 4 : 8;
  }

  function drawSteps(div) {
    FT.$("step-info").textContent = `(${s.points.length} measured decode-only steps; mixed steps left out)`;
    Plotly.react(div, stepTraces(s.points), Object.assign({}, PLOT_LAYOUT, floorMarks(s.hello), {
      legend: {x: 1, xanchor: "right", y: 1, bgcolor: FT.alpha(P.bg, 0.7), font: {size: 11}},
      margin: {l: 52, r: 10, t: 4, b: 42},
      xaxis: Object.assign({title: {text: "requests in the batch", standoff: 6}, automargin: true, gridcolor: P.grid, zeroline: false},
                           s.points.length ? {dtick: batchTick(s.points)} : {range: [0.5, (s.settings.slots || 4) + 0.5], dtick: batchTick([])}),
      yaxis: {title: {text: "ms per step"}, rangemode: "tozero", gridcolor: P.grid},
    }), PLOT_CONFIG);
  }

  function update() {
    if (!window.Plotly || s.version === version) return;
    version = s.version;
    const stagesDiv = FT.$("chart-stages"), stepsDiv = FT.$("chart-steps");
    if (stagesDiv && stagesDiv.offsetParent !== null) drawStages(stagesDiv);
    if (stepsDiv && stepsDiv.offsetParent !== null) drawSteps(stepsDiv);
  }

  FT.charts = {init(app) { s = app.s; }, update};
})();
