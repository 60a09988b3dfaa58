"""DisaggBackend: the web process's side of a disaggregated server, a `Backend`
(engine/backend.py) over two engine processes (engine/disagg/child.py).

As vLLM's P/D proxy with the NixlConnector: a request goes to the prefill instance, which
computes its prompt (no sampling) and hands it off with its blocks held; the coordinator passes
the hand-off to the decode instance, which waits for blocks (WAITING_FOR_REMOTE_KVS), copies
the keys and values of all prompt positions but the last from the prefill instance's store
(shared memory), recomputes the last, samples the first token and decodes; its `Release` goes
back to the prefill instance, which frees the blocks then (vLLM's delayed free).

It is an `EngineDriver` whose engine is `Instances`, the two processes seen as one engine: the
driver's inbox, commands, bounds, presets' timed bursts, load generator and failure handling
are the driver's own, run on its thread in this process; `Instances` turns each command into
messages to the processes. The requests' handles live here: a reader thread per process
publishes that process's events and hands each request's `token`, `finished` and `rejected`
to its handle, and routes the instances' messages to each other. Tokenizing (the tokenize
stage) happens here too, in the submitting thread, with the decode instance's tokenizer.

One `finished` per request, from the instance that owns it then: the prefill instance's before
its hand-off (cancelled, failed, rejected), the decode instance's after. A cancel goes to the
owner; one that reaches the prefill instance after it handed the request off is sent on to the
decode instance when the hand-off passes through here. If either process dies, every request in
flight fails (reason "error"), /healthz answers 503, new requests are refused, the other
process is stopped and the shared memory freed.
"""
import atexit
import itertools
import multiprocessing
import threading
from dataclasses import replace

from ..core.intake import Intake
from ..core.step_output import Ended, StepOutput
from ..driver import Add, Cancel, ChangeSettings, ClearQueue, EngineDriver, ResetEngine
from ..events import Error, Finished, Rejected, Reset, Settings, Stats, Token
from ..settings import Live, SettingError, defaults, validate
from ..teach.loadgen import LoadGenerator
from ..timing.recorder import STATS_EVERY_S, StepRecorder, to_client
from . import child, shm
from .messages import Ack, HandOff, Release

ROLES = ("prefill", "decode")
ACK_TIMEOUT_S = 60      # a liveness bound on a command both instances must run (reset, settings)
PUBLISHED_BY_DECODE_ONLY = (Settings, Reset)   # both instances apply them; the page hears of it once


class Instance:
    """One engine process as the coordinator holds it: the process, its pipe (sends under a
    lock: the driver's thread and the readers both send), what it said when ready."""

    def __init__(self, ctx, role, factory, configs, threads, origin, bench):
        self.role = role
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=child.main, name=f"first-token-{role}", daemon=True,
                                   args=(role, factory, configs, threads, origin, theirs, bench))
        self.process.start()
        theirs.close()
        self.lock = threading.Lock()
        self.info = None

    def send(self, message):
        with self.lock:
            self.conn.send(message)

    def receive(self, what):
        """The next message while it starts; RuntimeError if the process exits first."""
        while not self.conn.poll(0.2):
            if not self.process.is_alive():
                raise RuntimeError(f"the {self.role} instance exited (code {self.process.exitcode}) while {what}")
        return self.conn.recv()

    def stop(self, timeout=10):
        try:
            self.send(None)
        except OSError:
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)


class Instances:
    """The two processes as the one engine `EngineDriver` drives: its commands become messages
    to them; what they send back is published and routed by `route` (on the reader threads)."""

    forward_s = (0.0, 0.0)   # the instances run the forwards, in their processes
    busy = False

    def __init__(self, factory, configs, threads, clock, bench=None):
        self.clock = clock
        self.config = configs["decode"]
        ctx = multiprocessing.get_context("spawn")
        self.by_role = {r: Instance(ctx, r, factory, configs, threads[r], clock.origin(), bench) for r in ROLES}
        self.segments = []
        try:
            sizes = {r: self._expect(i.receive("loading its model"), "store") for r, i in self.by_role.items()}
            self.segments = [shm.create(sizes[r]) for r in ROLES]
            names = {r: seg.name for r, seg in zip(ROLES, self.segments)}
            for inst in self.by_role.values():
                inst.send(names)
            for inst in self.by_role.values():
                inst.info = self._expect(inst.receive("building its engine"), "ready")
        except BaseException:
            self.stop()
            raise
        self.prefill, self.decode = self.by_role["prefill"], self.by_role["decode"]
        info = self.decode.info
        self.specs = info["specs"]
        self.settings = Live(defaults(self.specs))
        self.max_context = info["max_context"]
        self.name = info["name"]
        self.intake = Intake(info["tokenizer"], clock, self.max_context, scheduler=None)
        self.intake.sampling = self.settings.now.sampling
        self.loadgen = LoadGenerator(info["tokenizer"])
        self.subscribers = lambda: 0
        self.flights = {}       # request id -> its Sequence here (its handle, its tokens so far)
        self.owner = {}         # request id -> the instance that owns it now
        self.cancelled = set()  # ids cancelled while in flight (a hand-off passing through carries it on)
        self.stats = {}         # role -> its latest `stats` event
        self.lock = threading.Lock()    # flights, owner, cancelled: the driver's thread vs the readers
        self._acks = {}
        self._tokens = itertools.count(1)
        self._ends = StepRecorder(clock)   # the `finished` of requests failed here (no instance can)

    @staticmethod
    def _expect(message, kind):
        got, value = message
        assert got == kind, f"expected {kind!r} from an instance, got {got!r}"
        return value

    # ------------------------------------------------- the engine the driver drives
    def hello(self):
        return replace(self.decode.info["hello"], t=self.clock.now(), server_time=self.clock.wall0 + self.clock.now(),
                       settings=self.settings.now.wire(), instances=[
                           {"name": r, **{k: i.info[k] for k in ("pid", "threads", "max_slots", "cache_blocks",
                                                                  "kv_store_bytes")}}
                           for r, i in self.by_role.items()])

    def new_sequence(self, request):
        return self.intake.new_sequence(request)

    def add(self, seq):
        with self.lock:
            self.flights[seq.id] = seq
            self.owner[seq.id] = self.prefill
            self.prefill.send(Add(seq))     # its inter-process form: without its handle, which stays here
        return []

    def cancel(self, rid):
        with self.lock:
            owner = self.owner.get(rid)
            if owner is not None:
                self.cancelled.add(rid)
                owner.send(Cancel(rid))
        return []

    def clear_queue(self):
        return self._both(ClearQueue())

    def reset(self):
        return self._both(ResetEngine())

    def apply_settings(self, changes):
        """To both instances (each applies them to its own engine); the decode instance's
        `settings` event is published. The KV cache stays on: a preset turning it off gets an
        `error` saying so for that one setting."""
        out = []
        if changes.get("kv_cache") is False:
            changes = {k: v for k, v in changes.items() if k != "kv_cache"}
            out.append(Error(t=self.clock.now(), field="kv_cache", fatal=False,
                             message="disaggregated serving moves KV blocks: the KV cache stays on"))
        s = self.settings.now = self.settings.now.replace(changes)
        self.intake.sampling = s.sampling
        return out + self._both(ChangeSettings(changes))

    def _both(self, command):
        """Run `command` on the prefill instance, then, once it has, on the decode instance, and
        wait for that too. In that order, a request the prefill instance handed off just before
        (a reset, a queue clearing) has reached the decode instance before the command does: its
        `HandOff` comes down the pipe before the `Ack`, and is routed (a `Take`) first."""
        for inst in (self.prefill, self.decode):
            token, done = next(self._tokens), threading.Event()
            self._acks[token] = done
            inst.send(child.Acked(command, token))
            done.wait(ACK_TIMEOUT_S)
            self._acks.pop(token, None)
        return []

    def release_waits(self):
        """An instance died: whoever waits for an `Ack` stops waiting (none will come)."""
        for done in list(self._acks.values()):
            done.set()

    def fail_all(self, message):
        """Every request in flight ends with reason "error" (an instance died), its `finished` made
        here (by a step recorder, as an engine's are), where the handles are; whatever the
        instances still send of them is dropped. Both processes are stopped, the shared memory freed."""
        with self.lock:
            flights, self.flights = self.flights, {}
            self.owner.clear()
            self.cancelled.clear()
        self.release_waits()
        out = StepOutput(self.clock)
        out.ended = [Ended(seq, "error", message, self.clock.now()) for seq in flights.values()]
        events = self._ends.record(out)
        self.stop()
        return events

    def step(self):
        return []           # the instances step themselves

    def idle_timeout(self):
        return STATS_EVERY_S

    @property
    def in_flight(self):
        return len(self.flights)

    # ------------------------------------------------- what the instances send
    def route(self, inst, message):
        """One message from `inst`: the events to publish (none for the instances' own messages,
        which go to the other instance or wake a waiting command)."""
        if isinstance(message, HandOff):
            with self.lock:
                if message.id in self.flights:
                    self.owner[message.id] = self.decode
                    self.decode.send(child.Take(message))
                    if message.id in self.cancelled:
                        self.decode.send(Cancel(message.id))
                else:       # failed here meanwhile: only its blocks matter now
                    self.prefill.send(child.ReleaseBlocks(message.id))
            return []
        if isinstance(message, Release):
            self.prefill.send(child.ReleaseBlocks(message.id))
            return []
        if isinstance(message, Ack):
            done = self._acks.get(message.token)
            if done is not None:
                done.set()
            return []
        if isinstance(message, PUBLISHED_BY_DECODE_ONLY) and inst is self.prefill:
            return []
        if isinstance(message, Stats):
            self.stats[inst.role] = message
        if isinstance(message, (Token, Finished, Rejected)):
            return self._to_client(message)
        return [message]

    def _to_client(self, event):
        """A request's own event to its handle: one end per request (whatever comes of a request
        already ended here is dropped)."""
        with self.lock:
            seq = self.flights.get(event.id)
            if seq is None:
                return []
            if isinstance(event, Token):
                seq.output_ids.append(event.token_id)
            else:
                del self.flights[event.id]
                self.owner.pop(event.id, None)
                self.cancelled.discard(event.id)
            to_client(seq, event)
        return [event]

    def stop(self):
        for inst in getattr(self, "by_role", {}).values():
            inst.stop()
        shm.free(self.segments)
        self.segments = []


class DisaggBackend(EngineDriver):
    """A Backend over a prefill and a decode engine process (module docstring): an EngineDriver
    whose engine is `Instances`, used through the driver's public surface."""

    def __init__(self, factory, prefill_config, decode_config=None, threads=(1, 1), bench=None, inbox=None):
        """`factory()`: the model bundle, in each process (picklable: a module-level function or a
        functools.partial of one); the instances' EngineConfigs; their model threads (prefill,
        decode)."""
        from ..events import Clock
        clock = Clock()
        configs = {"prefill": prefill_config, "decode": decode_config or prefill_config}
        self.instances = Instances(factory, configs, dict(zip(ROLES, threads)), clock, bench)
        super().__init__(self.instances, **({"inbox": inbox} if inbox else {}))
        self._readers = []
        atexit.register(self.instances.stop)    # the processes and the shared memory, even on Ctrl-C

    def start(self, load=True):
        for inst in self.instances.by_role.values():
            thread = threading.Thread(target=self._read, args=(inst,), name=f"reader-{inst.role}", daemon=True)
            thread.start()
            self._readers.append(thread)
        return super().start(load)

    def _read(self, inst):
        """Publish and route what one instance sends, until its pipe closes; if it closed
        without being told to, the instance died: fail everything."""
        while True:
            try:
                message = inst.conn.recv()
            except (EOFError, OSError):
                break
            try:
                self.publish(self.instances.route(inst, message))
            except Exception as e:  # noqa: BLE001 -- a reader that stops would leave its instance unread: fail it all
                self.fail(e)
                return
        if not self.stopping and self.failure is None:
            inst.process.join(5)
            self.fail(RuntimeError(f"the {inst.role} instance (pid {inst.info['pid']}) exited with code "
                                   f"{inst.process.exitcode}"))

    def health(self):
        if self.failure:
            return {"status": "error", "message": f"the engine stopped: {self.failure}"}, 503
        info, stats = self.instances.decode.info, self.instances.stats
        return {"status": "ok", "model": info["name"], "device": info["device"], "dtype": info["dtype"],
                "load_s": round(info["load_s"], 3), "weights_from_cache": info["from_cache"],
                "running": sum(s.running or 0 for s in stats.values()),
                "waiting": sum(s.queue or 0 for s in stats.values()),
                "instances": {r: {"pid": i.info["pid"], "alive": i.process.is_alive(),
                                  "running": getattr(stats.get(r), "running", None),
                                  "waiting": getattr(stats.get(r), "queue", None)}
                              for r, i in self.instances.by_role.items()}}, 200

    def update_settings(self, changes):
        changes = validate(self.specs, changes)
        if changes.get("kv_cache") is False:
            raise SettingError("kv_cache", "disaggregated serving moves KV blocks: the KV cache stays on")
        return super().update_settings(changes)

    def reload(self):
        raise SettingError("reload", "not available when disaggregated (two engine processes hold the model)")

    def measure(self):
        raise SettingError("measure", "not available when disaggregated: the sweep needs one engine's blocks")

    def shutdown(self):
        super().shutdown()
        self.instances.stop()
        for thread in self._readers:
            thread.join(timeout=10)
