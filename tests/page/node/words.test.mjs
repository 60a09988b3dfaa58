// The page's words for who sent a request and for a seeded lesson (static/core/ft-util.js).
import assert from "node:assert/strict";
import {test} from "node:test";

import {seededText, sourceText} from "ft/util";

test("a load-generator request is not read as a model load", () => {
  assert.equal(sourceText("load"), "load generator");
  assert.equal(sourceText("join"), "a student's phone");
  assert.equal(sourceText("something new"), "something new");   // a source this page does not know, as sent
});

test("a lesson that samples says it is seeded; one that draws nothing says nothing", () => {
  const sampling = {actions: [{at: 0, burst: 1, prompt: "q", temperature: 0}, {at: 0, burst: 1, prompt: "q", temperature: 0.7},
                              {at: 0, burst: 2, prompt: "q", temperature: 1.5}]};
  assert.match(seededText(sampling), /^ Its 3 sampled requests are seeded: .* repeats them token for token\.$/);
  assert.match(seededText({actions: [{at: 0, burst: 1, prompt: "q", temperature: 0.8}]}), /^ Its sampled request is seeded/);
  assert.equal(seededText({actions: [{at: 0, burst: 4}]}), "");   // corpus prompts at the settings' greedy default
  assert.equal(seededText({actions: [{at: 0, burst: 0, reload: true}]}), "");
  assert.equal(seededText(null), "");
});
