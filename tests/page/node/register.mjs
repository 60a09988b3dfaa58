// `node --import ./tests/page/node/register.mjs --test tests/page/node/`: the page's `ft/NAME`
// imports resolved as the page resolves them (resolve.mjs).
import {register} from "node:module";

register("./resolve.mjs", import.meta.url);
