// The page's probability wording (static/features/ft-candidates.js), without a browser.
import assert from "node:assert/strict";
import {test} from "node:test";

import {exactPct, exactly, pct} from "ft/candidates";

test("a probability under 0.1 % reads '< 0.1 %', not 0.0 %", () => {
  assert.equal(pct(0.000412), "< 0.1 %");
  assert.equal(pct(0.0009994), "< 0.1 %");
  assert.equal(pct(0.001), "0.1 %");
  assert.equal(pct(0.5), "50.0 %");
  assert.equal(pct(0), "0.0 %");       // outside the nucleus: truly never drawn
  assert.equal(pct(null), "—");
});

test("its exact value, as sent (3 significant digits)", () => {
  assert.equal(exactPct(0.000412), "0.0412 %");
  assert.equal(exactly(0.000412, 0.25), " (exactly 0.0412 %)");
  assert.equal(exactly(0.000412, 0.0000123), " (exactly 0.0412 % and 0.00123 %)");
  assert.equal(exactly(0.25, 0, null), "");
});
