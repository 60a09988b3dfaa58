"""Observe mode's `Backend` (engine/backend.py), as the engine's driver is one, so the same
page works: the controls a page may use on a server it only watches, and `hello` and
/healthz for it."""
import threading
import time

from engine.backend import Mode
from engine.broadcast import Broadcaster
from engine.core.fields import BY_NAME, FIELDS, SETTING_FIELDS
from engine.events import PROTOCOL, SHOWN, Clock, Hello, Reset, Settings
from engine.settings import Live, SettingError, coerce, defaults, make_settings, validate
from .flights import Flights
from .load import WordLoad
from .target import Target
from .ticker import Ticker
from .watch import Watch

SETTINGS = ("load", "rate", "prompt_tokens") + SETTING_FIELDS   # the request fields a setting fills in
API_KEY_ENV = "FIRST_TOKEN_OBSERVE_API_KEY"
# GenerateRequest's fields beyond a prompt and the request registry's (engine/core/fields.py),
# which a page or a classroom student never sends, at the values that leave them out.
BEYOND_PAGE = {"messages": None, "stop": (), "prompt_tokens": None}
# hello's facts about a model and its engine, which a client of another server cannot know.
UNKNOWN = ("device", "dtype", "params", "layers", "kv_heads", "head_dim", "hidden", "vocab", "kv_bytes_per_token",
           "weight_bytes", "block_size", "cache_blocks", "kv_store_bytes", "max_slots", "bench", "bandwidth")


class Observer:
    mode = Mode.OBSERVE
    api_model = None   # no model of its own: /v1 is the observed server's

    def __init__(self, base_url, api_key=None, metrics_url=None):
        self.target = Target(base_url, api_key, metrics_url)
        self.clock = Clock()
        self.events = Broadcaster()
        # Only the settings that shape requests apply to an external server; the engine's own
        # definitions are reused (the slot/cache arguments only bound settings not used here).
        every = make_settings(1, 16, 16, 4096)
        self.specs = {n: s for n, s in every.items() if n in SETTINGS}
        # The engine's typed value, the others at their defaults (no delivery line between: all 0)
        self.settings = Live(defaults(every))
        self.load = WordLoad()
        self.flights = Flights(self.target, self.clock, self.events, self.load)
        self.watch = Watch(self.target, self.clock, self.flights)
        self._ticker = Ticker(self)
        self._lock = threading.Lock()     # settings
        self._stop = threading.Event()

    @property
    def max_context(self):
        return self.watch.max_context

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        self._ticker.start(self._stop)
        self.watch.start(self._stop)
        return self

    def shutdown(self):
        self._stop.set()
        self._ticker.wake.set()
        self.reset()

    def health(self):
        """(/healthz body, HTTP status): ok once the server's /v1/models answers."""
        watch = self.watch
        view = watch.scraper.view(self.clock.now())
        gauges = view["gauges"] if view else {}
        body = {"status": "ok" if watch.reachable else "unreachable", "mode": self.mode.value,
                "target": self.target.base_url, "model": watch.model, "metrics": view is not None,
                "server": view and view["profile"], "in_flight": len(self.flights),
                "running": gauges.get("running"), "waiting": gauges.get("waiting")}
        return body, 200 if watch.reachable else 503

    def hello(self):
        scraper = self.watch.scraper
        return Hello(t=self.clock.now(), protocol=PROTOCOL, mode=self.mode.value, server_time=time.time(),
                     target=self.target.base_url, model=self.watch.model, max_context=self.max_context,
                     metrics=scraper.readable, server=scraper.describe(), settings=self.current_settings(),
                     limits={n: s.describe() for n, s in self.specs.items()}, **{k: None for k in UNKNOWN})

    def current_settings(self):
        """The settings this mode has, as the wire carries them."""
        return {n: v for n, v in self.settings.now.wire().items() if n in self.specs}

    # ------------------------------------------------------------------ controls
    def update_settings(self, changes):
        changes = validate(self.specs, changes)
        with self._lock:    # two pages changing settings at once: neither change is lost
            self.settings.now = self.settings.now.replace(changes)
        settings = self.current_settings()
        if "rate" in changes:
            self.load.restart()
        self.events.publish(Settings(t=self.clock.now(), settings=settings, changed=sorted(changes)))
        self._ticker.wake.set()
        return changes

    def burst(self, n, seed=None):
        if seed is not None:
            raise SettingError("seed", "observe mode draws its own prompts; a seeded burst needs this app's engine")
        for _ in range(coerce("n", "int", n, 1, 64)):
            self.send_load()

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
        self.flights.reset()
        self.events.publish(Reset(t=self.clock.now()))

    def cancel(self, rid):
        self.flights.cancel(rid)

    def clear_queue(self):
        self.flights.cancel_waiting()

    # ------------------------------------------------------------------ requests
    def submit(self, request):
        """Send a page's or a classroom student's `GenerateRequest` (already validated) to the
        server (chat template applied there when `chat`); return its handle (the page follows
        it through events; with `stream`, as for a student, the handle's `outputs` yields its
        chunks too).

        Raises SettingError for a field beyond the page's (BEYOND_PAGE) or a value outside this
        mode's settings; nothing is sent then."""
        for name, neutral in BEYOND_PAGE.items():
            if getattr(request, name) != neutral:
                raise SettingError(name, "observe mode sends a prompt (or chat), a student's label and the "
                                         "request fields (engine/core/fields.py) only")
        overrides = {k: getattr(request, k) for k in SETTING_FIELDS if getattr(request, k) is not None}
        params = self._params(validate(self.specs, overrides) if overrides else {})
        # the other fields it sets, by the API's names (the observed server judges them)
        params |= {f.body_name: getattr(request, f.name) for f in FIELDS
                   if not f.setting and getattr(request, f.name) != f.default}
        prompt = request.prompt
        if request.chat:
            path, body = "/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
        else:
            path, body = "/completions", {"prompt": prompt}
        return self._launch(request.source, path, {**body, **params}, prompt, label=request.label,
                            stream=request.stream)

    def send_load(self):
        """One load-generator request, its prompt the `prompt_tokens` setting's size (observe/load.py)."""
        text, estimate = self.load.prompt(self.settings.now.load.prompt_tokens)
        return self._launch("observe", "/completions", {"prompt": text, **self._params({})}, text, estimate=estimate)

    def _params(self, overrides):
        s = self.settings.now.replace(overrides).sampling
        return {BY_NAME[name].body_name: getattr(s, name) for name in SETTING_FIELDS}

    def _launch(self, source, path, body, prompt, **kw):
        """Send one request; while a page shows candidates, asking for the server's log-probabilities
        of the page's SHOWN most likely tokens (vLLM, SGLang, llama.cpp and First Token serve them;
        a server that refuses them answers with an HTTP error, drawn as a rejection)."""
        if self.events.candidates_shown():
            body = {**body, **({"logprobs": True, "top_logprobs": SHOWN} if path == "/chat/completions"
                               else {"logprobs": SHOWN})}
        return self.flights.launch(source, path, body, prompt, self.watch.model, self.watch.scraper.profile, **kw)
