"""Helpers the tests share: the tiny random model, greedy references, engine drivers, apps served
in this process, websocket frames."""
import json
from pathlib import Path
import threading
import time
from types import SimpleNamespace

import torch

from bench.launch import App, free_port
from engine.model import loading as model_mod
from engine.teach.loadgen import CORPUS

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"   # screenshots and server logs from a test run (git-ignored)
SCHEMA = ROOT / "docs" / "events.schema.json"

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer(bos=False, chat_template=CHAT_TEMPLATE):
    """A byte-level BPE (vocab 400) trained in well under a second on the shipped corpus. `bos`: it
    has a `<bos>` token and adds it in front of a text, as Gemma's and Llama's do (SmolLM2's adds
    none); `chat_template` None: it has none, as a base model's file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<|user|>", "<|assistant|>"] + ["<bos>"] * bos,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([CORPUS.read_text()], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>",
                                  **(dict(bos_token="<bos>", add_bos_token=True) if bos else {}))
    tok.chat_template = chat_template
    return tok


def tiny_bundle(seed=0, layers=2, **tokenizer):
    """A randomly initialised Llama from a config; init scaled up so logits are well separated.
    `tokenizer`: `tiny_tokenizer`'s keywords."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = tiny_tokenizer(**tokenizer)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.2, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.eos_token_id
    return model_mod.ModelBundle(m, tok, "tiny-random-llama", "cpu", torch.float32, 0.0, False)


def tiny_quant_bundle(seed=0, layers=2, kind=None):
    """`tiny_bundle` with its weights stored as a GGUF would store them: every linear layer and the
    (tied) embedding quantised to ggml blocks (Q4_1 by default, as SmolLM2's file has its layers),
    and the model's fp32 weights set to exactly what those blocks mean, so `generate` on the model
    is the reference for the engine reading either copy."""
    from engine.model import weights
    bundle = tiny_bundle(seed, layers)
    kind = kind or weights.Q4_1
    quant = {}
    with torch.no_grad():
        for name, p in bundle.model.named_parameters():
            if p.dim() == 2:                 # the linear layers and the embedding (= the tied head)
                quant[name] = weights.quantise(p, kind)
                p.copy_(quant[name].dequantise())
    quant["lm_head.weight"] = quant["model.embed_tokens.weight"]
    bundle.quant = quant
    return bundle


def reference(bundle, text, max_new, add_special_tokens=False):
    """`model.generate`'s greedy continuation of `text` (token ids), run alone."""
    ids = bundle.tokenizer(text, add_special_tokens=add_special_tokens, return_tensors="pt").input_ids.to(bundle.model.device)
    out = bundle.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def wait_until(predicate, timeout, what, every=0.02):
    """Poll `predicate()` until it returns something truthy, which is returned; fail after
    `timeout` seconds naming `what` was awaited (a string, or a function that says it then). The one polling loop of the suite: `timeout`
    is a liveness bound (it only catches a hang, so it is set an order of magnitude over the
    need), never a claim about speed."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(every)


def ticking_clock(monkeypatch, module, tick):
    """`module`'s `time.perf_counter` (the module's alone) made a synthetic clock that reads
    `tick` seconds more at each reading, from 0: a measurement's budget judged on it, not on this
    machine's speed. The list of readings, one entry each, to count them."""
    readings = []

    def perf_counter():
        readings.append(len(readings) * tick)
        return readings[-1]
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=perf_counter))
    return readings


def idle(driver):
    """Nothing in flight and every KV block back: the engine's accounting returned to zero."""
    eng = driver.engine
    return (not eng.scheduler.running and not eng.scheduler.waiting and eng.in_flight == 0
            and eng.blocks.used == 0 and driver._inbox.empty())


def wait_idle(driver, timeout=30):
    """Wait until `driver`'s engine is idle (`idle`)."""
    eng = driver.engine
    wait_until(lambda: idle(driver), timeout, lambda: f"the engine idle (blocks used {eng.blocks.used}, "
                                                      f"in flight {eng.in_flight})")


def frames(conn, seconds, until=None):
    """Events from a websocket for up to `seconds`, or until `until(events)` holds."""
    events, end = [], time.time() + seconds
    while time.time() < end:
        raw = conn.receive(timeout=0.2)
        if raw:
            events += json.loads(raw)
            if until and until(events):
                break
    return events


def schema_validator():
    """A validator for one event against docs/events.schema.json."""
    import jsonschema
    defs = json.loads(SCHEMA.read_text())["$defs"]
    return jsonschema.Draft202012Validator({"$defs": defs, "$ref": "#/$defs/event"})


def flag_error(capsys, *args):
    """What `python app.py ARGS` says to a bad command line, from its own parser in process (one
    subprocess a flag paid ~4.5 s of imports each): its exit status and stderr."""
    import pytest
    from app import parse_args
    with pytest.raises(SystemExit) as exited:
        parse_args(list(args))
    return exited.value.code, capsys.readouterr().err


def start_app(*args, port=None):
    """`python app.py` on the real model, its output in test-artifacts/server-PORT.log."""
    port = port or free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    return App(*args, port=port, log=ARTIFACTS / f"server-{port}.log")


def page_module(page, name):
    """A handle to the page's module `ft/NAME` (static/JOB/ft-NAME.js), the same instance the page
    runs: pass it as the argument of page.evaluate / wait_for_function to read its exports
    (`page.evaluate("m => m.runs", page_module(page, "compare"))`). A page or frame."""
    return page.evaluate_handle(f"import({json.dumps('ft/' + name)})")


def ask_on_phone(page, url, prompt, name="Ada"):
    """On /join (the code in its address): join as `name`, send `prompt` (the answer then streams)."""
    page.goto(url + "/join?code=owl")
    page.fill("#name", name)
    page.click("#join-form button")
    page.wait_for_selector("#ask-form:not([hidden])")
    page.fill("#prompt", prompt)
    page.click("#btn-ask")


def loopback_http(answer_get=None, answer_post=None):
    """A threaded HTTP server on a free loopback port (call `.shutdown()`), its `.url` set.
    `answer_get(handler)` / `answer_post(handler)` -> (status, body bytes) answer each request."""
    import http.server
    import threading

    def reply(handler, answer):
        status, body = answer(handler)
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            reply(self, answer_get)

        def do_POST(self):
            reply(self, answer_post)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def collect(sub, until, timeout=30.0):
    """Events from a broadcaster subscription `sub` until `until(events)` holds (or fail after
    `timeout` seconds, naming the event types that came)."""
    events = []

    def more():
        events.extend(sub.get(0.2))   # waits up to 0.2 s for news itself
        return until(events)
    wait_until(more, timeout, lambda: f"the events awaited; got {sorted({e['type'] for e in events})}", every=0)
    return events


def switched_to_stored(events):
    """Whether the `weights` preset's switch to the blocks has come, as the engine made it: a
    `settings` event to `stored` after the `preset` event (the page's `stored` can be the last
    lesson's, before this one's fp32 came)."""
    kinds = [e["type"] for e in events]
    return "preset" in kinds and any(e["type"] == "settings" and "weights" in e["changed"] and e["settings"]["weights"] == "stored"
                                     for e in events[kinds.index("preset"):])


def tiny_factory(seed=0, layers=2):
    """`tiny_bundle`, as a disaggregated server's instances build it in their own processes
    (engine/disagg/: a module-level function pickles by name; spawn gives them this sys.path)."""
    return tiny_bundle(seed, layers)


def engine_driver(bundle, slots=4, kv_tokens=4096, max_context=512, start=True, **driver):
    """An engine driver on `bundle` (the engine's dimensions as given), started unless `start` is
    false (never started: whatever a message queues stays in its inbox); `driver`: EngineDriver's
    own keywords (`loader`, `inbox`). The one way the tests build a driver (conftest's `driver`
    fixture is this on the tiny model); the caller shuts it down."""
    from engine import Engine, EngineConfig, EngineDriver
    d = EngineDriver(Engine(bundle, EngineConfig(slots=slots, kv_tokens=kv_tokens, max_context=max_context)),
                     **driver)
    return d.start() if start else d


class Served:
    """A WSGI app (`create_app`'s) served in this process on a free loopback port by Werkzeug's
    threaded server, for HTTP and websocket clients: `.url`, `.ws_url`, `.stop()`. The one
    in-process server of the suite."""

    def __init__(self, app):
        from werkzeug.serving import make_server
        self.app = app
        self.http = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        self.ws_url = f"ws://127.0.0.1:{self.http.server_port}/ws"
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, name="served",
                         daemon=True).start()   # a short poll: shutdown() waits for it

    def stop(self):
        self.http.shutdown()


class LiveApp(Served):
    """The app from `create_app` served in this process (`Served`) over an engine driver on
    `bundle` (no subprocess, no real model). `loader`, when given, is what a reload (a cold
    start) calls for the model again."""

    def __init__(self, bundle, config, app_config=None, classroom=None, loader=None):
        from engine import Engine, EngineDriver
        from server import create_app
        self.driver = EngineDriver(Engine(bundle, config), loader=loader).start()
        super().__init__(create_app({"TESTING": True, **(app_config or {})}, backend=self.driver,
                                    classroom=classroom))

    def stop(self):
        super().stop()
        self.driver.shutdown()


def open_classroom(bundle):
    """The app on `bundle` in classroom mode, every entry point open (the API with the presenter's
    key, /join for a phone, the websocket as the presenter), a rate limit that hostile-input tests
    never reach, two tokens a request; `.room` is its Classroom. The caller stops it."""
    from engine import EngineConfig
    from server.classroom import Classroom
    room = Classroom(rate_burst=10**6, rate_every_s=0.001)
    served = LiveApp(bundle, EngineConfig(slots=4, kv_tokens=2048, max_context=512), classroom=room)
    served.room = room
    served.driver.update_settings({"max_new_tokens": 2})
    return served


# ------------------------------------------------------------------ pages: waits on what the page shows
def frames_drawn(page, n=2):
    """Wait until the page (or frame) has run `n` more animation frames: what was due to be drawn
    on its next frame, and any task its handlers queued (a timeout of 0) before, is done."""
    page.evaluate("n => new Promise(done => setTimeout(() => { const f = (k) => k ? requestAnimationFrame("
                  "() => f(k - 1)) : done(); f(n); }))", n)


STILL = """ms => {
  const at = [scrollX, scrollY], what = ['scroll', 'scroll'];
  for (const e of document.querySelectorAll('.spot, #lesson')) {
    const r = e.getBoundingClientRect(); at.push(r.left, r.top, r.right, r.bottom); what.push(...Array(4).fill(e.id || e.className)); }
  const now = performance.now(), w = window.__still || (window.__still = {at: [], since: now, moved: 0, last: null});
  // moved: more than 2 px anywhere (a panel the tour scrolls again each tick may swing by one)
  const i = at.length !== w.at.length ? 0 : at.findIndex((x, i) => Math.abs(x - w.at[i]) > 2);
  if (i >= 0) { w.at = at; w.since = now; w.moved++; w.last = what[i] || 'the parts outlined'; }
  return now - w.since >= ms && (delete window.__still, true);
}"""


def settled(page, ticks=2, timeout=60_000):
    """Wait until the page stands still: its scroll, its height and the boxes of the lesson and
    of the parts a step outlines (`.spot`) unchanged, read every animation frame, over `ticks`
    of the page's 4 Hz DOM ticks (ft-app.js: the panels written, then the tour's scroll to its
    parts on the next frame), so what a preset's events filled in has been scrolled for. A page
    or a frame."""
    from playwright.sync_api import TimeoutError as Timeout
    page.evaluate("() => { delete window.__still; }")
    try:
        page.wait_for_function(STILL, arg=250 * ticks + 50, polling="raf", timeout=timeout)
    except Timeout:
        moved = page.evaluate("() => window.__still && [window.__still.moved, window.__still.last]")
        raise AssertionError(f"the page never stood still for {ticks} ticks in {timeout} ms "
                             f"(moves, the last one's: {moved})") from None


def preset_arrives(page, start, preset, timeout=60_000):
    """Run `start()` (what sends a preset: a click, a tour step) and wait until the server's
    `preset` event for it has reached the page (ft-teach.js's `active`, a new one), then until
    the page stands still (`settled`). `preset` None: a step without one, only settled."""
    teach = page_module(page, "teach")
    page.evaluate("teach => { window.__presetBefore = teach.active; }", teach)
    start()
    if preset is not None:
        page.wait_for_function("([teach, name]) => teach.active !== window.__presetBefore && teach.active && "
                               "teach.active.name === name", arg=[teach, preset], timeout=timeout)
    settled(page)


RECORD_SENT = """() => {
  if (!window.__sent) {
    window.__sent = [];
    const send = WebSocket.prototype.send;
    WebSocket.prototype.send = function (data) { window.__sent.push(JSON.parse(data)); return send.call(this, data); };
  }
  return window.__sent.length;
}"""


def record_sent(page):
    """Record, in the page, every message it sends on a websocket from now on (the socket's own
    `send`, so a message is recorded as it is sent, not when the browser reports the frame);
    how many it has recorded so far, for `sent_since`."""
    return page.evaluate(RECORD_SENT)


def sent_since(page, n):
    """The messages (dicts) the page sent after the first `n` recorded, once what its handlers
    queued has run (`frames_drawn`), less its clock syncs (sent on timers of their own)."""
    frames_drawn(page)
    return page.evaluate("n => window.__sent.slice(n).filter(m => m.type !== 'sync')", n)


def csp(response):
    """A response's Content-Security-Policy as {directive: its sources, as written}."""
    directives = (d.strip().split(None, 1) for d in response.headers["Content-Security-Policy"].split(";"))
    return {d[0]: d[1] if len(d) > 1 else "" for d in directives if d}
