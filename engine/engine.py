"""The engine as a step function: `Engine.step()` is schedule (preemptions, refusals,
admissions), run (one forward over the scheduled tokens) and postprocess (sample, hand each
token out, finish what stopped), returning the typed events it produced. Clock reads, each
request's stage accounting and the events that carry them are the step recorder's
(engine/timing.py), called at fixed points of the step.

It owns no thread and takes no locks: one caller (the driver thread in engine/driver.py,
or a test) calls `add`, `cancel`, `apply_settings`, `reset` and `step` in turn, and
publishes what they return. Other threads may call only `new_sequence` (engine/intake.py:
validation and the tokenize stage), which touches no engine state.

An exception in a forward or in sampling fails that batch's requests (reason "error") and the
step carries on; any other exception escapes `step()` and the driver fails everything in flight.
"""
from . import bandwidth, presets, sampler, speculate
from .detok import Detokenizer, StopStrings
from .config import EngineConfig
from .events import PROTOCOL, Clock, Error, Hello, Reset, Settings
from .block_manager import BlockManager
from .intake import Intake
from .kv_cache import BlockPool, PagedKVStore, head_dim, kv_bytes_per_token, kv_heads
from .loadgen import LoadGenerator
from .runner import Runner
from .roofline import Roofline
from .scheduler import Scheduler
from .settings import make_settings
from .timing import StepRecorder


class Engine:
    def __init__(self, bundle, config=None, bench=None):
        """`bench`: the committed `python -m bench` results for this model, carried in `hello`."""
        self.config = config = config or EngineConfig()
        self.bundle = bundle
        model, cfg, tok = bundle.model, bundle.model.config, bundle.tokenizer
        self.tokenizer = tok
        self.clock = Clock()
        self.max_context = min(config.max_context, getattr(cfg, "max_position_embeddings", config.max_context))
        self.bytes_per_token = kv_bytes_per_token(cfg, bundle.dtype)
        self.blocks = BlockManager(BlockPool(config.block_size, config.cache_capacity_tokens // config.block_size))
        self.scheduler = Scheduler(self.blocks, config.slots)
        self.settings = {}   # live: updated in place (the intake and the driver hold it too)
        self.intake = Intake(tok, self.clock, self.settings, self.max_context, self.scheduler)
        self._out = []
        self.params = sum(p.numel() for p in model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # Measured read bandwidth and matmul rate (~1 s, once a process): estimated floors (roofline.py)
        self.store = PagedKVStore(cfg, self.blocks.capacity, config.block_size, bundle.dtype, bundle.device)
        self.runner = Runner(model, self.store, bundle.quant)
        # What a decode step reads in the default format (the file's blocks where they can be read)
        self.bandwidth = bandwidth.floor(self.runner.formats.path(1, 1).weight_bytes, bundle.device)
        self.roofline = Roofline.measured(model, self.weight_bytes, self.bytes_per_token, bundle.device, bundle.dtype)
        self.timing = StepRecorder(self.clock, self._emit, self.scheduler, self.roofline, self.settings)
        self.specs = make_settings(config.slots, self.blocks.capacity * config.block_size,
                                   config.block_size, self.max_context, self.runner.formats.available)
        self.apply_settings({name: spec.default for name, spec in self.specs.items()})
        self._take()   # the defaults' `settings` event: `hello` carries them
        self.loadgen = LoadGenerator(tok)
        self.bench = bench
        self.subscribers = lambda: 0   # how many pages listen (the driver knows; stats report it)
        eos = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._by_id = {}
        if config.release_model_weights:      # after everything above has read the model's shapes
            self.runner.release_model_weights()

    # ------------------------------------------------------------------ facts
    def hello(self):
        b, cfg = self.bundle, self.bundle.model.config
        return Hello(
            t=self.clock.now(), protocol=PROTOCOL, mode="engine", server_time=self.clock.wall0 + self.clock.now(),
            model=b.name, device=b.device, dtype=b.dtype_name, params=self.params,
            weight_bytes=self.weight_bytes, layers=cfg.num_hidden_layers, kv_heads=kv_heads(cfg),
            head_dim=head_dim(cfg), hidden=cfg.hidden_size, vocab=cfg.vocab_size,
            kv_bytes_per_token=self.bytes_per_token, block_size=self.blocks.block_size,
            cache_blocks=self.blocks.capacity, kv_store_bytes=self.store.nbytes,
            max_slots=self.scheduler.max_slots, max_context=self.max_context, settings=dict(self.settings),
            limits={n: s.describe() for n, s in self.specs.items()}, bandwidth=self.bandwidth,
            roofline=self.roofline.describe(), bench=self.bench,
            weights=self.runner.formats.describe(self.roofline.bandwidth_bps),
            presets=[p.describe() for p in presets.PRESETS.values()])

    @property
    def in_flight(self):
        return len(self._by_id)

    # ------------------------------------------- any thread: validate + tokenize
    def new_sequence(self, request):
        """A `GenerateRequest` validated against this engine and tokenized (engine/intake.py): a
        Sequence not yet known to the engine (hand it to `add`). SettingError names a bad field."""
        return self.intake.new_sequence(request)

    # ------------------------------------------------ commands (the caller's turn)
    def _emit(self, event):
        self._out.append(event)

    def _take(self):
        out, self._out = self._out, []
        return out

    def add(self, seq):
        """Queue a request from `new_sequence` (or reject it, with a reason); return the events."""
        self._out += self.intake.announce(seq)
        refusal = self.intake.refusal(seq)
        if refusal:
            self._reject(seq, *refusal)
            return self._take()
        seq.generator = sampler.make_generator(seq.params.seed, self.runner.device)   # None: unseeded
        seq.detok, seq.stops = Detokenizer(self.tokenizer), StopStrings(seq.params.stop)
        self._by_id[seq.id] = seq
        self.scheduler.waiting.append(seq)
        return self._take()

    def _reject(self, seq, reason, code):
        self._by_id.pop(seq.id, None)
        self._emit(self.intake.reject(seq, reason, code))

    def cancel(self, rid):
        seq = self._by_id.get(rid)
        if seq is not None:
            self._finish(seq, "cancelled")
        return self._take()

    def clear_queue(self):
        """Cancel every waiting request (running ones carry on): the classroom's "clear the queue"."""
        for seq in list(self.scheduler.waiting):
            self._finish(seq, "cancelled")
        return self._take()

    def apply_settings(self, changes):
        """Apply validated changes (`settings.validate`); return the `settings` event."""
        self.settings.update(changes)
        self.scheduler.apply(self.settings)
        self.runner.formats.stored = self.settings["weights"] == "stored"
        self._emit(Settings(t=self.clock.now(), settings=dict(self.settings), changed=sorted(changes)))
        return self._take()

    def reset(self):
        for seq in list(self._by_id.values()):
            self._finish(seq, "cancelled")
        self.timing.reset()
        self.blocks.reset_counters()
        self.scheduler.reset_counters()
        # every block is free: forget their prefixes too (vLLM's reset_prefix_cache); a lesson run again starts empty
        self.blocks.forget_hashes()
        self._emit(Reset(t=self.clock.now(), cached_blocks=self.blocks.cached_free))
        return self._take()

    def fail_all(self, message):
        """End every request in flight with reason "error" (the driver's answer to a fault
        outside any forward), best effort: their clients must hear of it."""
        for seq in list(self._by_id.values()):
            self._finish(seq, "error", message)
        return self._take()

    # ------------------------------------------------------------------ the step
    @property
    def busy(self):
        """Whether the next `step()` will run a forward (someone holds a slot)."""
        return bool(self.scheduler.running)

    def idle_timeout(self):
        """How long the caller may wait for news before the next `step()` is due (stats)."""
        return self.timing.idle_timeout()

    def step(self):
        """Schedule, run one forward over the scheduled tokens, postprocess (sample, hand out,
        finish); return the events."""
        plan = self._schedule()
        if plan.segments:
            try:
                logits = self._run(plan.segments)
                self._postprocess(plan.segments, logits)
            except Exception as e:  # noqa: BLE001 -- fault isolation: fail the batch, not the engine
                self._fail([seg.seq for seg in plan.segments], e)
        return self._take()

    def _schedule(self):
        """The scheduler's plan for this step, its preemptions, refusals and admissions recorded;
        then stats when due, so whoever still waits really is blocked (stats say on what)."""
        plan = self.scheduler.schedule(self.settings["kv_cache"])
        at = self.timing.preempted(plan.preempted)
        for seq, reason in plan.refused:    # the lowered cache budget can never hold it: not left waiting
            if seq.output_ids:              # it started before a preemption
                self._finish(seq, "error", reason)
            else:
                self._reject(seq, reason, "exceeds_cache")
        self.timing.admitted(plan.admitted, at)
        self.timing.stats_if_due(self.settings["kv_cache"], self.subscribers)
        return plan

    def _run(self, segments):
        """One forward over `segments`; their positions are computed after it. The logits of
        those that sample."""
        self.timing.forward_started()
        logits = self.runner.forward(segments)
        self.timing.forward_ended()
        for seg in segments:
            self.blocks.computed(seg)
        self.timing.forward_recorded(segments, self.runner.first_shape, self.runner.path)
        return logits

    def _postprocess(self, segments, logits):
        """Tokens for each segment that wanted them (a speculating one's guesses verified), handed
        out; requests that stopped finish. A request whose own sampling raised fails alone."""
        segs = [seg for seg in segments if seg.logits]
        if not segs:
            return
        self.timing.sampling_started()
        runs, failed = sampler.verify(logits, [g.seq.params for g in segs], [g.seq.generator for g in segs],
                                      [g.draft for g in segs])
        self.timing.sampled()
        # every token out before anyone finishes; a None run is a failed request's
        delivered = [(seg.seq, self._deliver_run(seg, run)) for seg, run in zip(segs, runs) if run is not None]
        for i, error in failed.items():
            self._fail([segs[i].seq], error, "sampling")
        for seq, stop in delivered:
            if stop:
                self._finish(seq, stop)

    def _deliver_run(self, seg, run):
        """One request's tokens from this forward, in order; why the request ends, if one ends it."""
        if seg.draft:       # the rejected guesses' positions are given back first
            self.blocks.accepted(seg, len(run) - 1)
            self.timing.speculated(seg, len(run) - 1)
        kinds = speculate.kinds(len(run), len(seg.draft))   # map is lazy: none delivered after a stop
        return next(filter(None, map(self._deliver, [seg.seq] * len(run), run, kinds)), None)

    def _deliver(self, seq, tid, spec=None):
        """Append the token and hand its `token` event out (to pages, and to the request's
        client: its text under the stop rule, `Sequence.append`); return why it ends the
        request, if it does."""
        text, client_text, stop = seq.append(tid, tid in self.eos)
        seq.handle.put(self.timing.token(seq, tid, text, client_text, spec))
        self.timing.delivered(seq)
        return stop

    def _fail(self, seqs, error, what="a step"):
        """A forward or sampling raised (e.g. out of memory): end the requests it touched with
        reason "error", free their slots and blocks, say so, and keep serving the rest."""
        message = f"{what} failed for {', '.join(s.id for s in seqs)}: {type(error).__name__}: {error}"
        self._emit(Error(t=self.clock.now(), message=message))
        for seq in seqs:
            if seq.id in self._by_id:
                self._finish(seq, "error", message)

    def _finish(self, seq, reason, error=None):
        self._by_id.pop(seq.id, None)
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        seq.handle.put(self.timing.finished(seq, reason, error))
