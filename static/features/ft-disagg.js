// First Token: prefill/decode disaggregation (protocol 13, hello.instances): one engine instance
// computes prompts, another decodes, and each prompt's keys and values are copied from the first
// to the second (kv_transfer). The timeline draws the two instances' forwards in two lanes itself
// (ft-timeline.js); this feature hands it the rest as layers: each request row's instance (a
// strip under its bar in the instance's colour: prefill instance, then decode instance), the
// transfer on the row (a span at least a few px wide, it takes milliseconds) and between the two
// lanes (a link from the prefill instance's lane down to the decode instance's). It also gives the
// words the tooltip, the request panel and the lesson use. Colocated (hello.instances null) none
// of it draws, and the page is as it was.
import {alpha, palette as P} from "ft/palette";
import {disaggregated, instanceOf, percentile} from "ft/state";
import {rect} from "ft/timeline";
import {fmtBytes, fmtS} from "ft/util";

const C = {transfer: P.transfer, edge: P.panel2, inst: {prefill: P.instPrefill, decode: P.instDecode},
           link: alpha(P.transfer, 0.85)};
const MIN_W = 4;   // px: a transfer of a few ms still shows at any zoom

// ------------------------------------------------------------------ words
// One transfer: its bytes and time (and the rate they make), for the tooltip and the request panel.
export function transferText(x) {
  const secs = x.end - x.start, rate = secs > 0 ? x.bytes / secs : null;
  return `KV transfer ${fmtBytes(x.bytes)} (${x.tokens} tokens, ${x.src.length} blocks) prefill → decode instance ` +
    `in ${fmtS(secs)}` + (rate ? ` (${fmtBytes(rate)}/s)` : "");
}

// Where a request stands across the two instances: for the request panel and the tooltip.
export function instanceLines(s, r) {
  if (!disaggregated(s)) return [];
  const lines = [];
  const onP = r.admits.find((a) => a.instance === "prefill"), onD = r.admits.find((a) => a.instance !== "prefill");
  if (onP) lines.push(`prefill instance: slot ${onP.slot}` + (onD ? `, then decode instance: slot ${onD.slot}` +
    (onD.cachedTokens ? ` (${onD.cachedTokens} prompt tokens arrived, its last position recomputed there)` : "") : ""));
  for (const x of r.transfers) lines.push(transferText(x));
  const done = r.prefills.some((p) => p.done && p.instance === "prefill");
  if (done && !r.transfers.length && r.end === null) lines.push("prompt computed: waiting for the decode instance to copy its keys and values");
  return lines;
}

// What the request is doing now, where the panel names its state: null when the colocated words fit.
export function instanceState(s, r) {
  if (!disaggregated(s) || r.end !== null || r.first !== null) return null;
  const done = r.prefills.some((p) => p.done && p.instance === "prefill");
  if (done && !r.transfers.length) return "prompt done, waiting for its KV transfer";
  if (r.transfers.length) return "KV copied to the decode instance";
  return null;
}

// The lesson's figure (the `disaggregation` preset, ft-figures.js): since t0, the transfers'
// median size and time, and a later token's median time waiting while others' prompts ran
// (`later.stalled`) apart from its forwards that also recomputed another request's last prompt
// position (`later.mixed`: one position each, on the decode instance).
export function proof(s, t0) {
  if (!disaggregated(s)) return "this server runs one engine (colocated): start it with --disaggregate for two instances";
  const xs = s.transfers.filter((x) => x.start >= t0);
  if (!xs.length) return null;
  const done = [...s.reqs.values()].filter((r) => r.arrival >= t0 && r.later && r.tpot);
  const median = (key) => percentile(done.map((r) => r.later[key] || 0), 50);
  return `${xs.length} KV transfer${xs.length > 1 ? "s" : ""}: median ${fmtBytes(percentile(xs.map((x) => x.bytes), 50))} in ` +
    `${fmtS(percentile(xs.map((x) => x.end - x.start), 50))}` +
    (done.length ? ` · a later token waited ${fmtS(median("stalled"))} for others' prompts, and shared ` +
                   `${fmtS(median("mixed"))} of forwards with their one-position recomputes (medians)` : "");
}

// ------------------------------------------------------------------ layers
// Between the two lanes: each transfer as a link from the prefill instance's lane (at its start)
// down to the decode instance's (at its end). Returns them drawn: {id, x0, x1}.
function drawLinks({ctx, f, s, byInstance}) {
  const links = [];
  const top = byInstance.prefill.y, bottom = byInstance.decode.y + byInstance.decode.h;
  for (const x of s.transfers) {
    if (x.end < f.left || x.start > f.right) continue;
    const x0 = Math.max(f.gutter, f.x(x.start)), x1 = Math.min(f.gutter + f.pw, Math.max(f.x(x.end), x0 + MIN_W));
    if (x1 <= x0) continue;
    ctx.fillStyle = C.link;
    ctx.fillRect(x0, top, x1 - x0, bottom - top);
    // an arrow head in the gap between the lanes, pointing at the decode instance
    const mid = (x0 + x1) / 2, gy = byInstance.decode.y;
    ctx.beginPath(); ctx.moveTo(mid - 4, gy - 3); ctx.lineTo(mid + 4, gy - 3); ctx.lineTo(mid, gy + 2); ctx.closePath();
    ctx.fillStyle = C.transfer; ctx.fill();
    links.push({id: x.id, x0, x1});
  }
  return links;
}

// Under each request's bar, the instance it was on: from its prefill admission until its keys and
// values were copied (or it ended), then from its decode admission on.
function drawInstances({ctx, f, g, now}) {
  const h = Math.max(2, Math.min(4, (g.rowH - g.barH) / 2));
  for (const r of g.reqs) {
    const y = g.barY(r) + g.barH;
    const endOr = (t) => (t !== null && t !== undefined ? t : r.end !== null ? r.end : now);
    const onP = r.admits.find((a) => a.instance === "prefill");
    if (onP) {
      const x = r.transfers[0];
      ctx.fillStyle = C.inst.prefill;
      rect(ctx, f, onP.t, x ? x.end : endOr(null), y, h);
    }
    const onD = r.admits.find((a) => instanceOf(a) === "decode");
    if (onD) { ctx.fillStyle = C.inst.decode; rect(ctx, f, onD.t, endOr(null), y, h); }
  }
  return null;
}

// On each request's row, its transfer: a span in the transfer colour, outlined, at least MIN_W px.
// Returns what was drawn (the tests and the hover read it): {id, start, end, bytes, tokens, x0, x1, y}.
function drawTransfers({ctx, f, g}) {
  const drawn = [];
  for (const r of g.reqs) {
    for (const x of r.transfers) {
      if (x.end < f.left || x.start > f.right) continue;
      const x0 = Math.max(f.gutter, f.x(x.start)), x1 = Math.min(f.gutter + f.pw, Math.max(f.x(x.end), x0 + MIN_W));
      if (x1 <= x0) continue;
      const y = g.barY(r);
      ctx.fillStyle = C.transfer;
      ctx.fillRect(x0, y, x1 - x0, g.barH);
      ctx.strokeStyle = C.edge; ctx.lineWidth = 1;
      ctx.strokeRect(x0 - 0.5, y - 0.5, x1 - x0 + 1, g.barH + 1);
      drawn.push({id: r.id, start: x.start, end: x.end, bytes: x.bytes, tokens: x.tokens, x0, x1, y});
    }
  }
  return drawn;
}

// The timeline's layers (ft-timeline.js createTimeline), drawn only when the server is disaggregated.
export const timelineLayers = [
  {name: "transferLinks", at: "lane", draw: drawLinks, on: disaggregated},
  {name: "instances", at: "stages", draw: drawInstances, on: disaggregated},
  {name: "transfers", at: "marks", draw: drawTransfers, on: disaggregated},
];

// The transfer under the pointer on a row (a few px of slack), for the tooltip; null when none.
export function hitTransfer(layout, x, y) {
  const drawn = (layout && layout.transfers) || [];
  return drawn.find((d) => x >= d.x0 - 3 && x <= d.x1 + 3 && y >= d.y - 2 && y <= d.y + layout.rowH) || null;
}
