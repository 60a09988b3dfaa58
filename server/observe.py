"""Observe mode: the page's picture of an external OpenAI-compatible server (vLLM, SGLang,
TGI, llama.cpp, another First Token), drawn from what a client can measure.

`Observer` is a `Backend` (engine/backend.py), as the engine's driver is, so the same page
works. Its load generator (engine/loadgen.py's Poisson
arrivals and corpus prompts) sends streaming requests from worker threads and publishes
the same event vocabulary, from the client's side only:

* `request` when a request is sent; `token` for each streamed chunk that carries text, at the
  time it was read (vLLM streams one token per chunk; a server that groups tokens shows
  fewer, larger ones); `finished` with ttft, every gap between chunks, e2e, and the server's
  token counts from `usage`; `rejected` for an HTTP error.
* What happens inside the server (queueing, prefill, sampling) cannot be seen from here:
  those stages are `null` and the whole TTFT is `other`. Never invented.
* `stats.server` carries the server's own figures (running, waiting, KV usage, rates of its
  counters, llama.cpp's slots) read from its Prometheus `/metrics` through the profile of the
  server found there (server/profiles.py, scraped by server/scrape.py), with the scrape's age;
  `hello.server` names the server. `stats.measured_by` says which figures are whose.
* Classroom mode works here too: students' prompts are sent through `submit` with their
  name as label, and their answers stream back through the request's handle.
* The observed server's API key (`--observe-api-key` or FIRST_TOKEN_OBSERVE_API_KEY) is sent
  as `Authorization: Bearer` on every request to it and is never published or printed.

Prompt length is approximate. The server's tokenizer is unknown here, so prompts are cut
from the corpus in whole words; the number of words for a requested token count comes from
the tokens-per-word ratio measured from the server's own `usage.prompt_tokens` reports
(one word per token until the first report). `request.prompt_tokens` is that estimate and
says so (`estimated: true`); `finished.prompt_tokens` is the server's count.
"""
import http.client
import itertools
import json
import secrets
import socket
import threading
import time
import urllib.parse

from engine.request import RequestHandle
from engine.broadcast import Broadcaster
from engine.events import PROTOCOL, Clock, Finished, Hello, Rejected, Request, Reset, Settings, Stats, Token
from engine.loadgen import LoadGenerator
from engine.settings import SettingError, coerce, make_settings, validate
from engine.stats import RollingStats
from . import inputs
from .errors import ApiError
from .scrape import SCRAPE_EVERY_S, Scraper

SETTINGS = ("load", "rate", "prompt_tokens", "max_new_tokens", "temperature", "top_p")
STATS_EVERY_S = 0.5
PROBE_EVERY_S = 2.0       # the server's /v1/models, for reachability (/healthz) and the model name
PROBE_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 600.0    # a streamed request silent this long is given up as an error
MAX_IN_FLIGHT = 256       # each request is a thread; beyond this, new ones are refused
API_KEY_ENV = "FIRST_TOKEN_OBSERVE_API_KEY"
MAX_GET_BYTES = 4 << 20   # of a /v1/models, /metrics, /slots or version answer
# Who measured each figure of an observe-mode `stats` event (docs/protocol.md).
MEASURED_BY = {"queue": "server", "running": "server", "cache_usage": "server", "server": "server",
               "in_flight": "client", "tokens_per_s": "client", "ttft": "client", "itl": "client",
               "finished": "client"}
# GenerateRequest's fields a page or a classroom student never sends, at the values that leave them out.
BEYOND_PAGE = {"messages": None, "stop": (), "ignore_eos": False, "min_tokens": 0, "prompt_tokens": None}


def parse_target(text):
    """The base URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1), or ValueError."""
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"--observe needs an http(s) URL such as http://127.0.0.1:8000/v1, not {text!r}")
    if u.query or u.fragment:
        raise ValueError(f"--observe URL must not have a query or fragment: {text!r}")
    try:
        u.port
    except ValueError:
        raise ValueError(f"--observe URL has a bad port: {text!r}") from None
    return text.rstrip("/")


class WordTokenizer:
    """Whitespace-separated words as tokens: lets LoadGenerator cut corpus prompts of N words."""

    def __init__(self):
        self.ids, self.words = {}, []

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self._id(w) for w in text.split()]}

    def _id(self, word):
        if word not in self.ids:
            self.ids[word] = len(self.words)
            self.words.append(word)
        return self.ids[word]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


class Flight:
    """One request in flight: its connection, so another thread can cancel it."""

    def __init__(self, source, prompt, sink=None, seed=None):
        self.source = source
        self.prompt = prompt      # matched against llama.cpp's /slots (never published from there)
        self.seed = seed          # as sent; how llama.cpp's /slots names its requests
        self.sink = sink          # the request's handle: its own events, when the caller streams them (a student)
        self.conn = None
        self.cancelled = False
        self.first = False        # a chunk with text has arrived

    def put(self, event):
        if self.sink is not None:
            self.sink.put(event)

    def cancel(self):
        self.cancelled = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)   # wakes the worker blocked reading the stream
            except OSError:
                pass


class Observer:
    api_model = None   # no model of its own: /v1 is the observed server's

    def __init__(self, base_url, api_key=None, metrics_url=None):
        self.base_url = parse_target(base_url)
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}   # never published
        u = urllib.parse.urlsplit(self.base_url)
        self._https = u.scheme == "https"
        self._host, self._port, self._path = u.hostname, u.port, u.path
        # Where /metrics is: the server's root unless told (a server that serves it on a port of its own).
        m = urllib.parse.urlsplit(parse_target(metrics_url)) if metrics_url else None
        self._metrics = (m.scheme == "https", m.hostname, m.port, m.path or "/metrics") if m else None
        self.clock = Clock()
        self.events = Broadcaster()
        # Only the settings that shape requests apply to an external server; the engine's own
        # definitions are reused (the slot/cache arguments only bound settings not used here).
        self.specs = {n: s for n, s in make_settings(1, 16, 16, 4096).items() if n in SETTINGS}
        self.settings = {n: s.default for n, s in self.specs.items()}
        self.loadgen = LoadGenerator(WordTokenizer())
        self.stats = RollingStats()
        self.model = None
        self.max_context = None
        self.reachable = False
        self.scraper = Scraper(self.clock)
        self._lock = threading.Lock()     # settings, loadgen, flights, token ratio
        self._flights = {}
        self._ids = itertools.count(1)
        self._words_sent = 0
        self._tokens_reported = 0
        self._wake = threading.Event()
        self._stop = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        threading.Thread(target=self._tick_loop, name="observe-ticker", daemon=True).start()
        threading.Thread(target=self._scrape_loop, name="observe-scraper", daemon=True).start()
        return self

    def shutdown(self):
        self._stop.set()
        self._wake.set()
        self.reset()

    def health(self):
        """(/healthz body, HTTP status): ok once the server's /v1/models answers."""
        view = self.scraper.view(self.clock.now())
        gauges = view["gauges"] if view else {}
        body = {"status": "ok" if self.reachable else "unreachable", "mode": "observe",
                "target": self.base_url, "model": self.model, "metrics": view is not None,
                "server": view and view["profile"], "in_flight": len(self._flights),
                "running": gauges.get("running"), "waiting": gauges.get("waiting")}
        return body, 200 if self.reachable else 503

    def hello(self):
        unknown = ("device", "dtype", "params", "layers", "kv_heads", "head_dim", "hidden", "vocab",
                   "kv_bytes_per_token", "weight_bytes", "block_size", "cache_blocks", "kv_store_bytes", "max_slots",
                   "bench", "bandwidth")
        with self._lock:
            settings = dict(self.settings)
        return Hello(t=self.clock.now(), protocol=PROTOCOL, mode="observe", server_time=time.time(),
                     target=self.base_url, model=self.model, max_context=self.max_context,
                     metrics=self.scraper.readable, server=self.scraper.describe(), settings=settings,
                     limits={n: s.describe() for n, s in self.specs.items()}, **{k: None for k in unknown})

    # ------------------------------------------------------------------ controls
    def update_settings(self, changes):
        changes = validate(self.specs, changes)
        with self._lock:
            self.settings.update(changes)
            if "rate" in changes:
                self.loadgen.restart()
            settings = dict(self.settings)
        self.events.publish(Settings(t=self.clock.now(), settings=settings, changed=sorted(changes)))
        self._wake.set()
        return changes

    def burst(self, n, seed=None):
        if seed is not None:
            raise SettingError("seed", "observe mode draws its own prompts; a seeded burst needs this app's engine")
        for _ in range(coerce("n", "int", n, 1, 64)):
            self._start_load()

    def apply_preset(self, name, settings=None):
        raise SettingError("preset", "presets set up this app's own engine; observe mode only watches "
                                     "another server")

    def measure(self):
        raise SettingError("measure", "measuring decode cost needs this app's own engine; observe mode "
                                      "only watches another server")

    def reload(self):
        raise SettingError("reload", "reloading reloads this app's own model; observe mode only watches "
                                     "another server")

    def reset(self):
        with self._lock:
            flights = list(self._flights.values())
        for f in flights:
            f.cancel()
        self.stats = RollingStats()
        self.events.publish(Reset(t=self.clock.now()))

    def cancel(self, rid):
        with self._lock:
            flight = self._flights.get(rid)
        if flight is not None:
            flight.cancel()

    def clear_queue(self):
        """Cancel every request still waiting for its first chunk: all a client can tell of the
        server's queue (some of them may be prefilling there already)."""
        with self._lock:
            waiting = [f for f in self._flights.values() if not f.first]
        for f in waiting:
            f.cancel()

    def submit(self, request):
        """Send a page's or a classroom student's `GenerateRequest` (already validated) to the
        server (chat template applied there when `chat`); return its handle (the page follows
        it through events; with `stream`, as for a student, the handle's `outputs` yields its
        chunks too).

        Raises SettingError for a field beyond the page's (BEYOND_PAGE) or a value outside this
        mode's settings; nothing is sent then."""
        for name, neutral in BEYOND_PAGE.items():
            if getattr(request, name) != neutral:
                raise SettingError(name, "observe mode sends the page's parameters only (prompt, chat, "
                                         "max_new_tokens, temperature, top_p, seed; a student's label)")
        overrides = {k: getattr(request, k) for k in ("max_new_tokens", "temperature", "top_p")
                     if getattr(request, k) is not None}
        params = self._params(validate(self.specs, overrides) if overrides else {})
        if request.seed is not None:
            params["seed"] = request.seed
        prompt = request.prompt
        if request.chat:
            path, body = "/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
        else:
            path, body = "/completions", {"prompt": prompt}
        return self._launch(request.source, path, {**body, **params}, prompt, estimate=None,
                            label=request.label, stream=request.stream)

    def _params(self, overrides):
        with self._lock:
            s = {**self.settings, **overrides}
        return {"max_tokens": s["max_new_tokens"], "temperature": s["temperature"], "top_p": s["top_p"]}

    def _start_load(self):
        with self._lock:
            n_tokens = self.settings["prompt_tokens"]
            ratio = self._tokens_reported / self._words_sent if self._tokens_reported else 1.0
            words = max(1, round(n_tokens / ratio))
            text = self.loadgen.prompt(words)
        return self._launch("observe", "/completions", {"prompt": text, **self._params({})}, text,
                            estimate=(words, round(words * ratio)))

    # ------------------------------------------------------------------ requests
    def _launch(self, source, path, body, prompt, estimate, label=None, stream=False):
        """Send one request (on a thread of its own); its handle, which carries its own events
        when `stream`."""
        rid = f"o{next(self._ids)}"
        handle = RequestHandle(rid, stream)
        profile = self.scraper.profile
        if profile is not None and profile.tag_seed and "seed" not in body:
            body = {**body, "seed": secrets.randbelow(2**31)}   # see Profile.tag_seed
        flight = Flight(source, prompt, handle, body.get("seed"))
        with self._lock:
            full = len(self._flights) >= MAX_IN_FLIGHT
            if not full and self.model is not None:
                self._flights[rid] = flight
        t = self.clock.now()
        self.events.publish(Request(t=t, id=rid, source=source, prompt_tokens=estimate[1] if estimate else None,
                                    estimated=estimate is not None, max_new_tokens=body["max_tokens"],
                                    preview=prompt[:80], label=label))
        refusal = (f"the observer already has {MAX_IN_FLIGHT} requests in flight" if full else
                   "the server has not answered /v1/models yet" if self.model is None else None)
        if refusal:
            code = "queue_full" if full else "unreachable"
            rejected = Rejected(t=t, id=rid, reason=refusal, code=code)
            self.events.publish(rejected)
            flight.put(rejected)
            return handle
        body = {**body, "model": self.model, "stream": True, "stream_options": {"include_usage": True}}
        threading.Thread(target=self._run, args=(rid, flight, path, body, t, estimate), daemon=True,
                         name=f"observe-{rid}").start()
        return handle

    def _connection(self, timeout, where=None):
        https, host, port = where or (self._https, self._host, self._port)
        cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
        return cls(host, port, timeout=timeout)

    def _headers(self, extra=None):
        return {**self._auth, **(extra or {})}

    def _run(self, rid, flight, path, body, sent, estimate):
        """Stream one request and publish what the client sees, as it sees it."""
        chunks, usage, finish, error = [], None, None, None
        try:
            flight.conn = self._connection(READ_TIMEOUT_S)
            if flight.cancelled:
                raise ConnectionAbortedError("cancelled")
            flight.conn.request("POST", self._path + path, body=json.dumps(body),
                                headers=self._headers({"Content-Type": "application/json",
                                                       "Accept": "text/event-stream"}))
            resp = flight.conn.getresponse()
            if resp.status != 200:
                rejected = Rejected(t=self.clock.now(), id=rid, code=f"http_{resp.status}",
                                    reason=f"HTTP {resp.status}: {_error_message(resp.read())}")
                self.events.publish(rejected)
                flight.put(rejected)
                return
            for line in resp:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = self.clock.now()
                texts, chunk_usage, chunk_finish, error = read_chunk(data)
                if error is not None:
                    break
                usage, finish = chunk_usage or usage, chunk_finish or finish
                for text in texts:
                    flight.put(self._token(rid, len(chunks), text, now, chunks[-1] if chunks else None, sent))
                    flight.first = True
                    chunks.append(now)
        except ApiError as e:
            error = f"the observed server sent {e.message}"
        except (OSError, http.client.HTTPException, ValueError) as e:
            error = str(e) or type(e).__name__
        finally:
            if flight.conn is not None:
                flight.conn.close()
            with self._lock:
                self._flights.pop(rid, None)
        if flight.cancelled:
            reason = "cancelled"
        elif error is not None:
            reason = "error"
        else:
            reason = finish if finish in ("stop", "length") else (finish or "error")
        flight.put(self._finished(rid, flight.source, reason, sent, chunks, usage, estimate, error))

    def _token(self, rid, index, text, now, previous, sent):
        """Publish the `token` event of a chunk with text; return it (for the request's handle)."""
        ev = Token(t=now, id=rid, index=index, token_id=None, text=text, first=index == 0, sampled=None,
                   sample_s=None)
        self.events.publish(ev)
        self.stats.token(now)
        if previous is None:
            self.stats.first_token(now - sent)
        else:
            self.stats.gap(now - previous)
        return ev

    def _finished(self, rid, source, reason, sent, chunks, usage, estimate, error):
        now = self.clock.now()
        usage = usage or {}
        output = usage.get("completion_tokens")   # None when the server sent no usage
        ev = Finished(t=now, id=rid, reason=reason, source=source, prompt_tokens=usage.get("prompt_tokens"),
                      output_tokens=output, e2e=now - sent, client_side=True, chunks=len(chunks), gaps=[],
                      error=error)
        if chunks:
            ev.ttft = ttft = chunks[0] - sent
            ev.gaps = [b - a for a, b in zip(chunks, chunks[1:])]
            ev.stages = {"tokenize": None, "load": None, "queue": None, "prefill": None, "first_sample": None,
                         "delivery": None, "other": ttft}
            later = (len(chunks) if output is None else output) - 1   # per chunk without usage
            if later > 0:
                ev.tpot = (chunks[-1] - chunks[0]) / later
            self.stats.finished += 1
        if estimate and usage.get("prompt_tokens"):
            with self._lock:
                self._words_sent += estimate[0]
                self._tokens_reported += usage["prompt_tokens"]
        self.events.publish(ev)
        return ev

    # ------------------------------------------------------------------ background
    def _tick_loop(self):
        """Load arrivals and `stats`; never touches the network, so arrivals keep their times."""
        next_stats = 0.0
        while not self._stop.is_set():
            now = self.clock.now()
            with self._lock:
                due = self.loadgen.due(now, self.settings["load"] and self.reachable, self.settings["rate"])
                next_arrival = self.loadgen.next_arrival
            for _ in range(due):
                self._start_load()
            if now >= next_stats:
                next_stats = now + STATS_EVERY_S
                self._emit_stats(now)
            wait = next_stats - now if next_arrival is None else min(next_stats, next_arrival) - now
            self._wake.wait(max(0.0, wait))
            self._wake.clear()

    def _emit_stats(self, now):
        view = self.scraper.view(now)
        gauges = view["gauges"] if view else {}
        count = lambda v: None if v is None else int(v)   # noqa: E731 -- gauges are floats
        self.events.publish(Stats(
            t=now, queue=count(gauges.get("waiting")), running=count(gauges.get("running")),
            in_flight=len(self._flights), waiting_ids=[], slots=[], cache_blocks_used=None, cache_blocks=None,
            cache_tokens=None, cache_usage=gauges.get("kv_usage"), server=view, measured_by=MEASURED_BY,
            subscribers=self.events.subscribers, **self.stats.snapshot(now)))

    def _scrape_loop(self):
        next_probe = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_EVERY_S
                self._probe()
            if self.reachable:
                with self._lock:
                    ours = {rid: (f.prompt, f.seed) for rid, f in self._flights.items()}
                self.scraper.scrape(self._get, ours)
            self._stop.wait(SCRAPE_EVERY_S)

    def _get(self, path):
        """GET a path of the server (`/metrics` and the like are served at its root; /metrics
        where --observe-metrics says, when given)."""
        where = None
        if path == "/metrics" and self._metrics:
            where, path = self._metrics[:3], self._metrics[3]
        conn = self._connection(PROBE_TIMEOUT_S, where)
        try:
            conn.request("GET", path, headers=self._headers())
            resp = conn.getresponse()
            return resp.status, resp.read(MAX_GET_BYTES)   # a server gone wrong cannot fill memory
        finally:
            conn.close()

    def _probe(self):
        try:
            status, raw = self._get(self._path + "/models")
            first = inputs.loads(raw)["data"][0] if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError, ApiError):
            first = None
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            self.model, self.max_context = first["id"], first.get("max_model_len")
        self.reachable = self.model is not None and first is not None


def read_chunk(data):
    """One streamed chunk's (texts, usage, finish reason, error message) from its JSON `data`:
    an observed server is a client too, so its depth and text are checked (ApiError),
    anything of the wrong shape is skipped, and usage keeps whole-number counts only."""
    msg = inputs.loads(data)
    if not isinstance(msg, dict):
        raise ValueError(f"a stream chunk that is not a JSON object: {data[:80]!r}")
    if msg.get("error"):
        return [], None, None, _error_message(data)
    usage = None
    if isinstance(msg.get("usage"), dict):
        usage = {k: v for k, v in msg["usage"].items()
                 if type(v) is int and v >= 0 and k in ("prompt_tokens", "completion_tokens")}
    texts, finish = [], None
    choices = msg.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = choice.get("text") if "text" in choice else (delta.get("content") if isinstance(delta, dict) else None)
        if isinstance(text, str) and text:
            texts.append(text)
        if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
            finish = choice["finish_reason"]
    return texts, usage, finish, None


def _error_message(raw):
    """The message of an OpenAI-shaped error body, else the start of the body."""
    try:
        return str(inputs.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError, ApiError):
        return raw[:200].decode(errors="replace")
