// When the page calls a first token "late here" (static/features/ft-delivery.js): only when the
// lateness outweighs what the engine measured, unless something is set between on purpose.
import assert from "node:assert/strict";
import {test} from "node:test";

// ft/delivery draws too: its palette reads the page's CSS colours when it loads (black here)
globalThis.document = {documentElement: {}};
globalThis.getComputedStyle = () => ({getPropertyValue: () => "#000000"});
const {diagnoseDelivery} = await import("ft/delivery");

// A request that reached the engine at 0 and got its first token at `ttft`, its tokens 50 ms
// apart, each arriving at this page `lag` seconds after the engine made it.
function request(ttft, lag) {
  const tokens = [0, 1, 2, 3].map((k) => ttft + 0.05 * k);
  return {stages: {load: 0}, ttft, arrival: 0, first: tokens[0], tokens, tokenSpec: tokens.map(() => null),
          arrivals: tokens.map((t) => t + lag)};
}
const quiet = {settings: {}, loads: []};

test("a first token late by less than the request's queueing is not called the network's fault", () => {
  // queued ~2 s behind a full batch, read 0.64 s late by a page on a busy machine
  assert.equal(diagnoseDelivery(request(2.56, 0.64), quiet, 2.4), null);
});

test("a first token late by more than every engine part is the network's", () => {
  const d = diagnoseDelivery(request(0.3, 0.64), quiet, 0.25);
  assert.equal(d.cause, "network");
  assert.match(d.text, /the network between the server and you/);
});

test("an injected delay is named even when the engine's own parts are larger", () => {
  const d = diagnoseDelivery(request(2.56, 0.35), {settings: {net_latency_ms: 300}, loads: []}, 2.4);
  assert.equal(d.cause, "network");
  assert.match(d.text, /300 ms injected/);
});
