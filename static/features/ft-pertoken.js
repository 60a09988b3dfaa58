// First Token: a per-token time, named. A request's `finished.tpot` is a mean (its later tokens'
// time over their count); the header's ITL p50 is a median of the gaps between forwards. The two
// differ most when the first forwards of a new shape (`step.first_shape`, protocol 11: they set up
// their kernels, often many times a usual step) fall among a request's later tokens: they pull its
// mean above its median. Wherever the page quotes a request's time per token it says which
// statistic it is, its median beside it, and when such forwards are in it, how many and what they
// took (measured).
import {firstShapeCost} from "ft/delivery";
import {percentile} from "ft/state";
import {fmtS} from "ft/util";

const SAME_FORWARD_S = 2e-4;   // tokens closer than this came from one forward (speculation's several)

// r's later tokens: {mean (finished.tpot), n, median (of the gaps between its forwards' tokens;
// null when the page holds fewer than two), shapes: {n, took, usual} for the forwards among them
// that were the first of their shape (null: none)}; null before it finished or for one token.
export function laterTokens(r, s) {
  if (typeof r.tpot !== "number" || r.first === null) return null;
  const gaps = [];
  for (let i = 1; i < r.tokens.length; i++) {
    const g = r.tokens[i] - r.tokens[i - 1];
    if (g > SAME_FORWARD_S) gaps.push(g);
  }
  let n = 0, took = 0;
  const usual = [];
  for (const st of s.steps) {
    if (!st.firstShape || st.kind === "release" || st.start < r.first || (r.end !== null && st.end > r.end) || !st.ids.includes(r.id)) continue;
    n++;
    took += st.end - st.start;
    const c = firstShapeCost(st, s);
    if (c) usual.push(c.usual);
  }
  return {mean: r.tpot, n: Math.max(0, (r.outputTokens || r.tokens.length) - 1), median: gaps.length ? percentile(gaps, 50) : null,
          shapes: n ? {n, took, usual: usual.length ? percentile(usual, 50) : null} : null};
}

// "(mean of 63; median 4.9 ms; the first 3 forwards of their shape took 102 ms setting up their kernels)":
// what follows a mean per later token wherever it is quoted.
export function statNote(x) {
  const bits = [`mean of ${x.n}`];
  if (x.median !== null) bits.push(`median ${fmtS(x.median)}`);
  if (x.shapes) {
    bits.push(`${x.shapes.n === 1 ? "the first forward of its shape" : `the first ${x.shapes.n} forwards of their shape`} ` +
      `took ${fmtS(x.shapes.took)} setting up ${x.shapes.n === 1 ? "its" : "their"} kernels` +
      (x.shapes.usual !== null ? ` (forwards like them since: ${fmtS(x.shapes.usual)})` : ""));
  }
  return `(${bits.join("; ")})`;
}

// "12 ms each on average (mean of 63; median 4.9 ms; …)", or the mean alone when not known.
export function perTokenText(r, s) {
  const x = laterTokens(r, s);
  return x ? `${fmtS(x.mean)} each on average ${statNote(x)}` : `${fmtS(r.tpot)} each (mean)`;
}
