"""The driver: the one thread that calls `Engine.step()`, and the one place that handles failure.

Web threads call the thread-safe methods here (`submit`, `cancel`, `update_settings`,
`burst`, `reset`, `clear_queue`, `apply_preset`, `measure`); they validate in the caller's
thread, then queue a command in the inbox: a small typed message (`Add`, `Cancel`,
`ChangeSettings`, ...) whose `run` the engine thread calls as it drains the inbox, before it
calls `step()`; it publishes every event they return. The load generator has a thread of its own and submits like any client,
so its arrivals happen on time even while a long forward runs (open loop).

If anything raises outside a forward (a forward's own failure only fails its batch, inside
`step()`), the driver fails every request in flight with reason "error", publishes a fatal
`error` event, answers /healthz with 503 and the reason, and refuses new requests at once.

The inbox is bounded so that no web thread ever waits on the engine: past `inbox` commands
waiting, a submit is rejected at once (code `queue_full`) and a settings change gets a
SettingError. Cancels, resets and queue clearings always go in (they free capacity; there is at most one
cancel per request in flight), so the bound holds within that margin.
"""
from dataclasses import dataclass
import queue
import random
import threading
import time
import traceback

from .backend import Mode
from .broadcast import Broadcaster
from .events import Error
from .teach.loadgen import TASKS
from .timing.memory import rss_bytes
from .core.request import GenerateRequest
from .teach import presets
from .settings import SettingError, coerce, validate
from .timing.recorder import STATS_EVERY_S, to_client

INBOX = 1024   # commands waiting for the engine thread before submits and settings are refused


# ------------------------------------------------------------------ the inbox's commands
# What web threads ask of the engine thread, one small message each: `run(driver)` applies it
# there (the one dispatch, in `_drain_inbox`) and returns the events to publish.
@dataclass(frozen=True)
class Add:
    seq: object   # a Sequence from Engine.new_sequence

    def run(self, driver):
        return driver.engine.add(self.seq)


@dataclass(frozen=True)
class Cancel:
    rid: str

    def run(self, driver):
        return driver.engine.cancel(self.rid)


@dataclass(frozen=True)
class ChangeSettings:
    changes: dict   # validated (settings.validate)

    def run(self, driver):
        events = driver.engine.apply_settings(self.changes)
        driver._load_wake.set()   # the generator redraws its next gap under the new rate
        return events


@dataclass(frozen=True)
class ResetEngine:
    def run(self, driver):
        driver._actions.clear()   # a preset's bursts still to come are cancelled too
        return driver.engine.reset()


@dataclass(frozen=True)
class ClearQueue:
    def run(self, driver):
        return driver.engine.clear_queue()


@dataclass(frozen=True)
class ApplyPreset:
    preset: presets.Preset
    overrides: dict   # validated settings over the preset's own

    def run(self, driver):
        events = self.preset.apply(driver.engine, self.overrides)
        # timed from the lesson's start, once its settings are in: the `weights` preset's switch to
        # fp32 makes the copy (seconds on a busy machine), and timed from before it, its switch back
        # "4 s in" was already due, so its request never read fp32 at all
        driver._actions[:] = [(driver.clock.now() + a.at, a) for a in self.preset.timed(self.overrides)]
        driver._load_wake.set()
        return events


@dataclass(frozen=True)
class ReloadModel:
    def run(self, driver):
        """A failed load changes nothing (the running model stays) and is said, not fatal."""
        from .model import reload   # here: it imports torch, which observe mode never loads
        if driver.loader is None:
            return [Error(t=driver.clock.now(), message="the reload was skipped: this engine's model was not "
                                                        "loaded from disk", fatal=False)]
        try:
            return reload.run(driver.engine, driver.loader)
        except Exception as e:  # noqa: BLE001 -- the old model is still in place; say why and carry on
            return [Error(t=driver.clock.now(), message=f"the reload failed ({type(e).__name__}: {e}); "
                                                        "the running model stays", fatal=False)]


@dataclass(frozen=True)
class MeasureDecode:
    def run(self, driver):
        from .timing import measure   # here: it imports torch, which observe mode never loads
        driver.publish(measure.announce(driver.engine))
        return measure.run(driver.engine, publish=driver.publish)


class EngineDriver:
    mode = Mode.ENGINE

    def __init__(self, engine, inbox=INBOX, loader=None):
        """`loader()`: loads the model bundle again (a cold start on demand, `reload`); None
        when this engine's model cannot be reloaded (one built in memory)."""
        self.engine = engine
        self.loader = loader
        self.clock = engine.clock
        self.specs = engine.specs
        self.settings = engine.settings   # settings.Live: the engine thread replaces its value
        self.api_model = engine.name
        self.max_context = engine.max_context
        self.events = Broadcaster(history=engine.config.history)
        engine.subscribers = lambda: self.events.subscribers
        engine.candidates = self.events.candidates_shown   # the tokens' odds while a page shows them
        self.publishing = True     # off: events are built but not published (the bench's A/B)
        self.failure = None        # why the engine stopped, once it has
        self.inbox_max = inbox
        self._inbox = queue.Queue()   # unbounded as a queue: `_put` enforces the bound, never blocking
        self._lock = threading.Lock()       # failure vs inbox; the load generator's random state
        self._wake = threading.Event()
        self._load_wake = threading.Event()
        self._stop = False
        self._threads = []
        self._actions = []         # a preset's bursts to come: (engine time, presets.Action); engine thread only
        # The engine thread's turns that ran a forward, outside the forward: wall seconds, and the
        # CPU seconds it ran. The difference is time it was ready but not running: waiting for
        # the GIL (every streaming request's thread wakes per token) or for a core.
        self.between_wall_s = self.between_cpu_s = 0.0

    # ------------------------------------------------------------------ facts
    @property
    def tokenizer(self):
        """The tokenizer requests are tokenized with (the API's /tokenize, /detokenize)."""
        return self.engine.intake.tokenizer

    def hello(self):
        return self.engine.hello()

    def health(self):
        eng = self.engine
        if self.failure:
            return {"status": "error", "message": f"the engine stopped: {self.failure}"}, 503
        b = eng.bundle
        loads = eng.timing.loads
        return {"status": "ok", "model": b.name, "device": b.device, "dtype": b.dtype_name,
                "load_s": round(loads[-1][1] - loads[-1][0] if loads else b.load_s, 3),
                "loaded_at": round(eng.clock.wall0 + (loads[-1][1] if loads else 0.0), 3),
                "weights_from_cache": b.from_cache, "weights": self._weights(), "memory": self._memory(),
                "running": len(eng.scheduler.running), "waiting": len(eng.scheduler.waiting),
                "engine_thread": {"between_forwards_s": self.between_wall_s,
                                  "between_forwards_cpu_s": self.between_cpu_s}}, 200

    def _weights(self):
        """/healthz's `weights`: the format in force (the `weights` setting), the bytes of weights a
        batch-1 decode step reads in it and what multiplies them (engine/model/linears.py), and the
        formats this engine can switch between."""
        formats = self.engine.runner.formats
        path = formats.path(1, 1)
        return {"format": path.weights, "decode_bytes": path.weight_bytes, "kernel": path.kernel,
                "formats": list(formats.available)}

    def _memory(self):
        """/healthz's `memory`: the process's resident bytes (measured), and what the engine holds
        of them: the 4-bit blocks, the fp32 copy (only while the `dequantised` format is read, or
        always for a model without blocks) and the KV store."""
        eng, formats = self.engine, self.engine.runner.formats
        return {"rss_bytes": rss_bytes(), "blocks_bytes": sum(formats.q) if formats.quant else 0,
                "fp32_copy": formats.fp32_resident, "fp32_made_s": formats.made_s,
                "kv_store_bytes": eng.store.nbytes}

    # ------------------------------------------------------------------ lifecycle
    def start(self, load=True):
        """Start the engine thread, and the load generator's unless `load` is false (a
        disaggregated instance's driver: the coordinator generates the load, engine/disagg/)."""
        loops = ((self._loop, "engine"), (self._load_loop, "load-generator"))
        for target, name in loops if load else loops[:1]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def shutdown(self):
        self._stop = True
        self._wake.set()
        self._load_wake.set()
        for thread in self._threads:
            thread.join(timeout=10)

    # ------------------------------------------------------------ any thread
    def submit(self, request):
        """Queue a `GenerateRequest`; its handle. SettingError (nothing queued) names a bad field."""
        seq = self.engine.new_sequence(request)
        with self._lock:
            failure = self.failure
            queued = failure is None and self._put(Add(seq))
        if failure is not None:
            self._refuse(seq, f"the engine stopped: {failure}", "engine_error")
        elif not queued:
            self._refuse(seq, f"the engine's inbox is full ({self.inbox_max} commands waiting)", "queue_full")
        return seq.handle

    def cancel(self, rid):
        self._command(Cancel(rid))

    def update_settings(self, changes):
        changes = validate(self.specs, changes)
        self._put_or_refuse(ChangeSettings(changes))
        return changes

    def burst(self, n, prompt_tokens=None, shared_prefix=0, seed=None, max_new_tokens=None, task=None):
        """`n` load-generator requests now; with a `seed`, the same prompts every time; with a
        `task` (loadgen.TASKS), chat requests asking for it on each prompt."""
        n = coerce("n", "int", n, 1, 64)
        rng = None if seed is None else random.Random(coerce("seed", "int", seed, 0, 2**63 - 1))
        for _ in range(n):
            self._submit_load(prompt_tokens, shared_prefix, rng, max_new_tokens, task)

    def reset(self):
        self._command(ResetEngine())

    def clear_queue(self):
        self._command(ClearQueue())

    def apply_preset(self, name, settings=None):
        """Reset, then the preset's settings (with `settings` over them: one side of a
        comparison), then its timed bursts (engine/teach/presets.py)."""
        preset = presets.get(name)   # SettingError: nothing changed
        overrides = validate(self.specs, settings) if settings is not None else {}
        self._put_or_refuse(ApplyPreset(preset, overrides))

    def reload(self):
        """Load the model again from its on-disk cache (a cold start, engine/model/reload.py); SettingError
        when it cannot be (nothing changed)."""
        if self.loader is None:
            raise SettingError("reload", "this engine's model was not loaded from disk; nothing to reload")
        self._put_or_refuse(ReloadModel())

    def measure(self):
        """Pause serving for a decode-cost sweep (engine/timing/measure.py); results arrive as events."""
        self._put_or_refuse(MeasureDecode())

    def _put_or_refuse(self, command):
        """Queue a command that may be refused: SettingError (nothing changed) when the inbox is full."""
        with self._lock:
            queued = self._put(command)
        if not queued:
            raise SettingError("message", f"the engine is busy ({self.inbox_max} commands waiting); "
                                          "nothing changed, try again")

    def _command(self, command):
        """A command that must land whatever the bound (cancel, reset)."""
        self._inbox.put(command)
        self._wake.set()

    def _put(self, command):
        """Queue `command` unless the inbox is full (the caller holds the lock); whether it was."""
        if self._inbox.qsize() >= self.inbox_max:
            return False
        self._inbox.put(command)
        self._wake.set()
        return True

    def publish(self, events):
        """Publish events to every subscriber (the engine's, or, for a coordinator of engine
        processes, what they sent)."""
        if self.publishing:
            for ev in events:
                self.events.publish(ev)

    def _refuse(self, seq, reason, code):
        """A request that cannot be queued (the engine stopped, or the inbox is full): rejected
        at once in the caller's thread, never left waiting."""
        event = self.engine.intake.reject(seq, reason, code)
        to_client(seq, event)
        self.events.publish(event)

    # ------------------------------------------------------------ engine thread
    def _loop(self):
        eng = self.engine
        try:
            while not self._stop:
                w0, c0 = time.perf_counter(), time.thread_time()
                f0w, f0c = eng.forward_s
                self._drain_inbox()
                self._run_due_actions()
                self.publish(eng.step())
                f1w, f1c = eng.forward_s
                if f1w != f0w:   # a forward ran: the rest of this turn was between forwards
                    self.between_wall_s += time.perf_counter() - w0 - (f1w - f0w)
                    self.between_cpu_s += time.thread_time() - c0 - (f1c - f0c)
                if not eng.busy:
                    self._wake.wait(self._wait_s())
                    self._wake.clear()
        except Exception as e:  # noqa: BLE001 -- the one place a fault outside a forward lands
            self.fail(e)

    def _drain_inbox(self):
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            self.publish(command.run(self))

    def _run_due_actions(self):
        """A preset's bursts whose time has come (on this thread: `reset` cancels the rest).
        A burst is cut to fit the context with the preset's max_new_tokens."""
        now = self.clock.now()
        due = [a for at, a in self._actions if at <= now]
        self._actions[:] = [(at, a) for at, a in self._actions if at > now]
        for a in due:
            if a.reload:    # on this thread, so the bursts queued before it wait for the load
                self.publish(ReloadModel().run(self))
                continue
            if a.settings:  # a lesson's switch mid-run; one this engine lacks is said, not applied
                self.publish(self._timed_settings(a.settings))
                continue
            s = self.settings.now
            new = a.max_new_tokens or s.sampling.max_new_tokens
            question = a.question(new)
            if question is not None:    # a fixed question, with its own sampling (the sampling lesson)
                for _ in range(a.burst):
                    self.submit(question)
                continue
            n = max(1, min(a.prompt_tokens or s.load.prompt_tokens, self.max_context - new))
            self.burst(a.burst, n, a.shared_prefix, seed=a.seed, max_new_tokens=new, task=a.task)

    def _timed_settings(self, changes):
        """A preset's timed settings change, applied here (its `settings` event), or an `error` saying
        why not (e.g. `weights: stored` where no 4-bit kernel or blocks exist)."""
        try:
            return self.engine.apply_settings(validate(self.specs, changes))
        except SettingError as e:
            return [Error(t=self.clock.now(), message=f"the lesson's change of {e.field} was not applied: {e.message}",
                          field=e.field, fatal=False)]

    def _wait_s(self):
        """How long the idle engine thread may sleep: until stats are due or a preset's next burst."""
        wait = self.engine.idle_timeout()
        if self._actions:
            wait = min(wait, max(0.0, min(at for at, _ in self._actions) - self.clock.now()))
        return wait

    @property
    def stopping(self):
        """Whether `shutdown` was asked for (its threads end)."""
        return self._stop

    def fail(self, error):
        """The engine stopped on `error`: every request in flight fails, every page is told, new
        requests are refused (once: a second failure changes nothing)."""
        message = f"{type(error).__name__}: {error}"
        traceback.print_exception(error)
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
            pending = []
            while not self._inbox.empty():
                pending.append(self._inbox.get_nowait())
        try:
            events = self.engine.fail_all(message)
        except Exception as e:  # noqa: BLE001 -- the state is broken; still tell everyone below
            traceback.print_exception(e)
            events = []
        events.append(Error(t=self.clock.now(), message=f"the engine stopped: {message}", fatal=True))
        for ev in events:
            self.events.publish(ev)
        for command in pending:
            if isinstance(command, Add):
                self._refuse(command.seq, f"the engine stopped: {message}", "engine_error")

    # ------------------------------------------------------------ load thread
    def _load_loop(self):
        """Open-loop Poisson arrivals while `load` is on."""
        gen = self.engine.loadgen
        while not self._stop and self.failure is None:
            with self._lock:
                load = self.settings.now.load
                due = gen.due(self.clock.now(), load.load, load.rate)
                nxt = gen.next_arrival
            for _ in range(due):
                self._submit_load()
            if self._load_wake.wait(STATS_EVERY_S if nxt is None else max(0.0, nxt - self.clock.now())):
                self._load_wake.clear()
                with self._lock:
                    gen.restart()   # exponential gaps are memoryless: redrawing is exact

    def _submit_load(self, prompt_tokens=None, shared_prefix=0, rng=None, max_new_tokens=None, task=None):
        n = prompt_tokens or self.settings.now.load.prompt_tokens
        with self._lock:
            text = self.engine.loadgen.prompt(n, shared_prefix, rng)
        if task:    # the window inside a chat message asking for the task (so more than n tokens)
            self.submit(GenerateRequest(prompt=TASKS[task].format(text=text), chat=True, source="load",
                                        max_new_tokens=max_new_tokens))
        else:
            self.submit(GenerateRequest(prompt=text, source="load", prompt_tokens=n, max_new_tokens=max_new_tokens))
