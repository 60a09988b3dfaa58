// Node's module hooks for the page's modules under `node --test` (tests/page/node/*.test.mjs):
// `ft/NAME` resolves to static/JOB/ft-NAME.js, as the page's import map maps it (server/pages.py
// MODULES), and loads as an ES module (the repository has no package.json saying so).
import {readdirSync} from "node:fs";

const STATIC = new URL("../../../static/", import.meta.url);
const MODULES = new Map();
for (const job of readdirSync(STATIC, {withFileTypes: true})) {
  if (!job.isDirectory()) continue;
  for (const f of readdirSync(new URL(`${job.name}/`, STATIC))) {
    const m = /^ft-(.+)\.js$/.exec(f);
    if (m) MODULES.set(`ft/${m[1]}`, new URL(`${job.name}/${f}`, STATIC).href);
  }
}

export async function resolve(spec, context, next) {
  if (MODULES.has(spec)) return {url: MODULES.get(spec), format: "module", shortCircuit: true};
  return next(spec, context);
}

export async function load(url, context, next) {
  if ([...MODULES.values()].includes(url)) return next(url, {...context, format: "module"});
  return next(url, context);
}
