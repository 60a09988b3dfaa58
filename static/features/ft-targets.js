// First Token: what the engine measured against two yardsticks, in words, one way for every
// view. The service-level objectives (`finished.slo`: a completed request's TTFT and time per
// later token against the `slo_ttft_ms` and `slo_tpot_ms` settings in force when it finished)
// and the roofline (`step.predicted_s`, `measure` points: the slower of a forward's bytes at
// the measured bandwidth and its flops at the measured matmul rate, an estimate). Pure
// functions of events; the hover read-outs, request panel, diagnosis, measure sheet and
// comparison read them. The timeline's SLO marks are its layer (timelineLayers).
import {alpha, palette as P} from "ft/palette";
import {stepMedians} from "ft/state";
import {fmtS} from "ft/util";

const C = {met: P.sloMet, missed: P.sloMissed, backing: alpha(P.panel2, 0.85)};

// The targets a request missed, by name ([] when it met both; null when it was not judged).
export function missed(slo) {
  if (!slo) return null;
  const out = [];
  if (!slo.ttft_met) out.push("TTFT");
  if (!slo.tpot_met) out.push("per-token");
  return out;
}

// "TTFT 2.41 s > 2.00 s target" / "TTFT 420 ms ≤ 2.00 s": one objective, measured against its target.
function against(name, v, target, met) {
  if (v === null || v === undefined) return `${name} — (one token: met)`;
  return `${name} ${fmtS(v)} ${met ? "≤" : ">"} ${fmtS(target)}${met ? "" : " target"}`;
}

// One line for a finished request: met or missed, which objective, by how much; null if not judged.
export function sloText(r) {
  const o = r.slo;
  if (!o) return null;
  const parts = [against("TTFT", r.ttft, o.ttft_target_s, o.ttft_met),
                 against("per later token", r.tpot, o.tpot_target_s, o.tpot_met)];
  if (o.met) return `SLO met: ${parts.join(" · ")}`;
  return `SLO missed (${missed(o).join(" and ")}): ${parts.join(" · ")}`;
}

// Why a per-token objective is missed by (nearly) everyone: a target tighter than this engine's
// own decode step. The default objectives are a serving benchmark's, for GPU servers; on a CPU
// a plain decode step (KV cache on, no guesses) alone can take longer. When the smallest batch's
// median step measured here is 80% of the target or more, a sentence saying so, with the
// numbers and the setting to change; else null. `points`: the state's decode steps.
export function targetBelowEngine(r, points) {
  const o = r.slo;
  if (!o || o.tpot_met) return null;
  const medians = stepMedians(points.filter((p) => p.kv && !p.guesses));
  if (!medians.size) return null;
  const batch = Math.min(...medians.keys()), step = medians.get(batch) / 1000;
  if (step < 0.8 * o.tpot_target_s) return null;
  return `The per-token objective (${fmtS(o.tpot_target_s)}) is tighter than this engine's own decode step: ` +
    `${fmtS(step)} at batch ${batch} (median, measured here), so on this machine hardly any request can meet it. ` +
    "The defaults are a serving benchmark's, sized for GPU servers; set the per-token objective to about " +
    `${fmtS(Math.ceil(step * 2 * 20) / 20)} to judge this engine by its own pace.`;
}

// Measured against the roofline's estimate, in words when they differ by more than 2×.
export function rooflineGap(measuredS, predictedS) {
  if (typeof measuredS !== "number" || typeof predictedS !== "number" || predictedS <= 0) return null;
  const k = measuredS / predictedS;
  if (k > 2) return `measured ${k.toFixed(1)}× the roofline: overhead the roofline does not model`;
  if (k < 0.5) return `measured ${(1 / k).toFixed(1)}× under the roofline: the estimate's rates are off for this forward`;
  return null;
}

// A forward's measured time beside the roofline's estimate, and the gap when it is large.
export function rooflineText(measuredS, predictedS, bound) {
  if (typeof predictedS !== "number") return null;
  const gap = rooflineGap(measuredS, predictedS);
  return `roofline estimate ${fmtS(predictedS)} (${bound}-bound) vs measured ${fmtS(measuredS)}` + (gap ? `\n  ${gap}` : "");
}

// ------------------------------------------------------------------ the timeline
// Each judged request's service-level verdict (finished.slo) just after its end: a quiet tick
// when it met both objectives, the missed one named when it did not ("✗ TTFT", "✗ token",
// "✗ both"); the hover read-out and the request panel give the numbers.
// Returns the marks drawn (the page's layout().sloMarks).
function drawSlo({ctx, f, g}) {
  const {reqs, barY, barH, rowH} = g;
  const marks = [];
  const px = Math.max(10, Math.min(14, Math.floor(rowH - 3)));
  ctx.font = `600 ${px}px system-ui, sans-serif`;
  ctx.textAlign = "left"; ctx.textBaseline = "middle";
  for (const r of reqs) {
    if (!r.slo || r.end < f.left || r.end > f.right) continue;
    const which = r.slo.met ? "" : !r.slo.ttft_met && !r.slo.tpot_met ? "both" : !r.slo.ttft_met ? "TTFT" : "token";
    const text = r.slo.met ? "✓" : `✗ ${which}`;
    // just after the request's end; a request that ended at the right edge gets its mark
    // inside the plot, on a backing of the strip's colour so the bars under it do not muddle it
    const tw = ctx.measureText(text).width, y = barY(r) + barH / 2;
    const x = Math.min(f.x(r.end) + 3, f.gutter + f.pw + 8 - tw);
    ctx.fillStyle = C.backing;
    ctx.fillRect(x - 2, y - px / 2 - 1, tw + 4, px + 2);
    ctx.fillStyle = r.slo.met ? C.met : C.missed;
    ctx.fillText(text, x, y);
    marks.push({id: r.id, met: r.slo.met, text, x, y, px});
  }
  return marks;
}

// The timeline's layers (ft-timeline.js createTimeline): the SLO marks, over the tokens.
export const timelineLayers = [{name: "slo", at: "marks", draw: drawSlo}];
