"""The engine as a step function: `Engine.step()` is schedule (preemptions, refusals,
admissions), run (one forward over the scheduled tokens) and postprocess (sample, hand each
token out, finish what stopped), returning the typed events it produced. The step writes what
it did, with the clock read at its fixed points, into one `StepOutput`
(engine/core/step_output.py); the step recorder (engine/timing/recorder.py) reads that once at the step's
end and makes each request's stage accounting and the events that carry it. Commands that
end requests outside a step (cancel, clear the queue, reset, fail all) go the same way. The
step-cost model the scheduler sizes prompt work by (engine/timing/stepcost.py) is the engine's, fed
each forward's time from the step's output.

It owns no thread and takes no locks: one caller (the driver thread in engine/driver.py,
or a test) calls `add`, `cancel`, `apply_settings`, `reset` and `step` in turn, and
publishes what they return. Other threads may call only `new_sequence` (engine/core/intake.py:
validation and the tokenize stage), which touches no engine state.

An exception in a forward or in sampling fails that batch's requests (reason "error") and the
step carries on; any other exception escapes `step()` and the driver fails everything in flight.

Keys and values computed elsewhere come and go through the engine's one connector
(engine/core/connector.py: a colocated engine's does nothing), whose hooks the engine calls before
the forward (`load`) and after it (`leaves`), and the scheduler where a request is admitted and
where it ends; what the connector says to other engines goes out with each call's events.
"""
from dataclasses import replace

import torch

from ..model import sampler, speculate, structured
from ..model.agreement import measure as agreement_of
from ..model.runner import Runner
from ..config import EngineConfig
from ..events import PROTOCOL, SHOWN, Clock, Error, Hello, Reset, Settings
from ..settings import Live, defaults, make_settings
from ..teach import presets
from ..teach.loadgen import LoadGenerator
from ..timing import bandwidth
from ..timing.memory import rss_bytes
from ..timing.recorder import StepRecorder, stats_view
from ..timing.roofline import Roofline
from ..timing.stepcost import StepCost
from .block_manager import BlockManager
from .connector import KVConnector
from .detok import Detokenizer, Pieces, StopStrings
from .intake import Intake
from .kv_cache import BlockPool, PagedKVStore, head_dim, kv_bytes_per_token, kv_heads
from ..model.archs import model_facts
from .scheduler import Scheduler
from .step_output import Ended, Placed, Refused, StepOutput


class Engine:
    def __init__(self, bundle, config=None, bench=None, clock=None, kv_memory=None, connector=None):
        """`bench`: the committed `python -m bench` results for this model, carried in `hello`.
        `clock`: the engine's (one shared by every engine of a server), `kv_memory`: memory for its
        KV store to lie in (shared memory another process reads), `connector`: keys and values
        computed elsewhere (engine/core/connector.py; None: colocated)."""
        self.config = config = config or EngineConfig()
        self.bundle = bundle
        self.name = bundle.name
        model, cfg, tok = bundle.model, bundle.model.config, bundle.tokenizer
        self.tokenizer = tok
        self.clock = clock or Clock()
        self.max_context = min(config.max_context, getattr(cfg, "max_position_embeddings", config.max_context))
        self.bytes_per_token = kv_bytes_per_token(cfg, bundle.dtype)
        self.blocks = BlockManager(BlockPool(config.block_size, config.cache_capacity_tokens // config.block_size))
        self.step_cost = StepCost()     # fed every forward's time (`_run`)
        self.connector = connector or KVConnector()
        self.scheduler = Scheduler(self.blocks, config.slots, self.step_cost, connector=self.connector)
        self.intake = Intake(tok, self.clock, self.max_context, self.scheduler)
        self._out = []
        self.params = sum(p.numel() for p in model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.store = PagedKVStore(cfg, self.blocks.capacity, config.block_size, bundle.dtype, bundle.device,
                                  memory=kv_memory)
        self.runner = Runner(model, self.store, bundle.quant)
        # Measured read bandwidth and matmul rate (~1 s, once a process): estimated floors (roofline.py),
        # for what a decode step reads in the default format (the file's blocks where they can be read)
        self.bandwidth = bandwidth.floor(self.runner.formats.path(1, 1).weight_bytes, bundle.device)
        self.roofline = Roofline.measured(model, self.weight_bytes, self.bytes_per_token, bundle.device, bundle.dtype,
                                          int8="int8" in self.runner.formats.activations)
        self.timing = StepRecorder(self.clock, self.roofline)
        self.timing.instance = self.connector.name
        self.connector.bind(self)
        self.specs = make_settings(config.slots, self.blocks.capacity * config.block_size,
                                   config.block_size, self.max_context, self.runner.formats.available,
                                   self.runner.formats.activations)
        self.int8_agreement = None   # int8 against fp32 activations, measured when int8 is first chosen
        self.settings = Live(defaults(self.specs))   # the driver and the web threads read it too
        self.apply_settings(self.settings.now.wire())   # each part to its owner
        self._take()   # the defaults' `settings` event: `hello` carries them
        self.loadgen = LoadGenerator(tok)
        self.bench = bench
        self.subscribers = lambda: 0   # how many pages listen (the driver knows; stats report it)
        eos = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._by_id = {}
        # Whether every token's odds are wanted (a page's SHOWN candidates, engine/model/sampler.py): they
        # cost more than 2 % of a batch-1 decode step on a CPU (bench/candidates.py), so the driver
        # asks its pages (a page that shows candidates says so, `view`); off, only the requests that
        # ask (the API's logprobs, a student's phone) get them. A bare engine (one of several
        # processes of one server, a test) computes them always.
        self.candidates = lambda: True
        self.pieces = Pieces(tok)   # the candidates' texts
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
            max_slots=self.scheduler.max_slots, max_context=self.max_context, settings=self.settings.now.wire(),
            limits={n: s.describe() for n, s in self.specs.items()}, bandwidth=self.bandwidth,
            roofline=self.roofline.describe(), bench=self.bench,
            weights={**self.runner.formats.describe(self.roofline.bandwidth_bps), "int8_agreement": self.int8_agreement,
                     "fp32_made_s": self.runner.formats.made_s},
            presets=[p.describe() for p in presets.PRESETS.values()], **model_facts(cfg))

    @property
    def in_flight(self):
        return len(self._by_id)

    @property
    def forward_s(self):
        """(wall, CPU) seconds this engine's forwards have taken so far (the driver's between-forwards figures)."""
        return self.runner.wall_s, self.runner.cpu_s

    # ------------------------------------------- any thread: validate + tokenize
    def new_sequence(self, request):
        """A `GenerateRequest` validated against this engine and tokenized (engine/core/intake.py): a
        Sequence not yet known to the engine (hand it to `add`). SettingError names a bad field."""
        return self.intake.new_sequence(request)

    # ------------------------------------------------ commands (the caller's turn)
    def _take(self):
        """The events of this call so far, with the connector's messages for other engines after them."""
        out, self._out = self._out + self.connector.outbox(), []
        return out

    def _record(self, out):
        """A step's (or a command's) outcome through the step recorder: its events, in order,
        join those the caller returns."""
        self._out += self.timing.record(out)

    def add(self, seq):
        """Queue a request from `new_sequence` (or reject it, with a reason); return the events."""
        self._out += self.intake.announce(seq)
        return self.enqueue(seq)

    def enqueue(self, seq):
        """Queue a request already announced (a new one, or one its connector took over from
        another engine, engine/core/connector.py), or reject it, with a reason; return the events."""
        refusal = self.intake.refusal(seq)
        if refusal:
            out = StepOutput(self.clock)
            self.scheduler.finish(seq)      # never queued: what it holds elsewhere is let go
            out.ended.append(self._reject(seq, *refusal))
            self._record(out)
            return self._take()
        seq.generator = sampler.make_generator(seq.params.seed, self.runner.device)   # None: unseeded
        seq.detok, seq.stops = Detokenizer(self.tokenizer), StopStrings(seq.params.stop)
        if seq.params.structured_outputs and seq.grammar is None:   # taken over: its matcher made anew
            seq.grammar = self.intake.grammars.matcher(seq.params.structured_outputs, seq.output_ids)
        self._by_id[seq.id] = seq
        self.scheduler.add(seq)
        return self._take()

    def _reject(self, seq, reason, code):
        """The request's refusal (its `rejected` event; the recorder hands it to its client); it is
        no longer known."""
        self._by_id.pop(seq.id, None)
        return Refused(seq, self.intake.reject(seq, reason, code))

    def _end_all(self, seqs, reason, error=None):
        """End `seqs` outside a step (a command's work); their `finished` events join those the
        caller returns."""
        out = StepOutput(self.clock)
        for seq in list(seqs):
            out.ended.append(self._end(seq, reason, error))
        self._record(out)

    def cancel(self, rid):
        seq = self._by_id.get(rid)
        self._end_all([seq] if seq is not None else [], "cancelled")
        return self._take()

    def clear_queue(self):
        """Cancel every waiting request (running ones carry on): the classroom's "clear the queue"."""
        self._end_all(self.scheduler.waiting, "cancelled")
        return self._take()

    def apply_settings(self, changes):
        """Apply validated changes (`settings.validate`): a new `Settings`, each part handed to
        its owner; return the `settings` event."""
        s = self.settings.now = self.settings.now.replace(changes)
        self.scheduler.apply(s.scheduling)
        self.intake.sampling = s.sampling
        self.timing.targets = s.targets
        made = self.runner.formats.use(s.scheduling.weights)   # the fp32 copy made (timed) or freed
        self.runner.formats.int8 = s.scheduling.activations == "int8"
        self.roofline.int8 = self.runner.formats.stored and self.runner.formats.int8
        # int8 is another arithmetic: how close it stays is measured, here, the first time it is chosen
        agreement = None
        if self.runner.formats.int8 and self.int8_agreement is None:
            agreement = self.int8_agreement = agreement_of(self)
        self._out.append(Settings(t=self.clock.now(), settings=s.wire(), changed=sorted(changes), fp32_made_s=made,
                                  int8_agreement=agreement))
        return self._take()

    def reset(self):
        self._end_all(self._by_id.values(), "cancelled")
        self.timing.reset()
        self.scheduler.reset_counters()
        self._out.append(Reset(t=self.clock.now(), cached_blocks=self.blocks.cached_free))
        return self._take()

    def fail_all(self, message):
        """End every request in flight with reason "error" (the driver's answer to a fault
        outside any forward), best effort: their clients must hear of it."""
        self._end_all(self._by_id.values(), "error", message)
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
        finish); return the events (the recorder's, of what the step did: even if it raised)."""
        out = StepOutput(self.clock)
        try:
            self._schedule(out)
            if out.segments:
                try:
                    logits = self._run(out)
                    self._postprocess(out, logits)
                except Exception as e:  # noqa: BLE001 -- fault isolation: fail the batch, not the engine
                    self._fail(out, [seg.seq for seg in out.segments], e)
        finally:
            self._record(out)
        return self._take()

    def _schedule(self, out):
        """The scheduler's plan for this step, its preemptions, refusals and admissions noted;
        then the queue as stats show it when due, so whoever still waits really is blocked
        (stats say on what)."""
        kv_cache_on = self.settings.now.scheduling.kv_cache
        plan = self.scheduler.schedule(kv_cache_on)
        out.scheduled = self.clock.now()
        out.preempted = [Placed.of(seq) for seq in plan.preempted]
        for seq, reason in plan.refused:    # the lowered cache budget can never hold it: not left waiting
            if seq.output_ids:              # it started before a preemption
                out.refused.append(self._end(seq, "error", reason))
            else:
                out.refused.append(self._reject(seq, reason, "exceeds_cache"))
        out.admitted = [Placed.of(seq) for seq in plan.admitted]
        now = self.clock.now()
        if self.timing.stats_due(now):
            out.stats = {**stats_view(self.scheduler, kv_cache_on, self.subscribers(), now), "rss_bytes": rss_bytes()}
        out.running, out.segments = list(self.scheduler.running), plan.segments

    def _run(self, out):
        """The keys and values the connector brings in, then one forward over the step's segments;
        their positions are computed after it, and a request whose work here it ended leaves
        (the connector's `leaves`). The logits of those that sample."""
        self.connector.load(out)
        start = self.clock.now()
        logits = self.runner.forward(out.segments)
        out.forward = (start, self.clock.now())
        self.scheduler.computed(out.segments)
        out.first_shape, out.path = self.runner.first_shape, self.runner.path
        out.cache = (self.scheduler.kv_tokens_in_use, self.blocks.used)
        self.step_cost.observe(*out.work(), out.forward[1] - out.forward[0])
        for seg in out.segments:
            if self.connector.leaves(seg.seq):    # it ends here without a finish reason: it goes on elsewhere
                self._by_id.pop(seg.seq.id)
                self.scheduler.finish(seg.seq)
                out.left.append(seg.seq)
        return logits

    def _postprocess(self, out, logits):
        """Tokens for each segment that wanted them (a speculating one's guesses verified), handed
        out; requests that stopped finish. A request whose own sampling raised fails alone. First
        the odds of the prompt tokens whose logits the forward computed."""
        self._prompt_odds(out.segments)
        segs = [seg for seg in out.segments if seg.logits]
        if not segs:
            return
        shown = SHOWN if self.candidates() else None   # the page's candidates, or more if a client asked
        want = [shown if g.seq.params.logprobs is None else max(g.seq.params.logprobs, shown or 0) for g in segs]
        start = self.clock.now()
        runs, failed, odds = sampler.verify(logits, [g.seq.params for g in segs], [g.seq.generator for g in segs],
                                            [g.draft for g in segs], want,
                                            [(g.seq.prompt_ids, g.seq.output_ids) for g in segs],
                                            self._masks(segs, logits))
        out.sampling = (start, self.clock.now())
        # every token out before anyone finishes; a None run is a failed request's
        delivered = []
        for seg, run, chances in zip(segs, runs, odds):
            if run is None:
                continue
            try:
                delivered.append((seg.seq, self._deliver(out, seg, run, chances)))
            except structured.GrammarError as e:   # its matcher refused the token: it fails alone
                self._fail(out, [seg.seq], e, "structured output")
        for i, error in failed.items():
            self._fail(out, [segs[i].seq], error, "sampling")
        for seq, stop in delivered:
            if stop:
                out.ended.append(self._end(seq, stop))

    @staticmethod
    def _masks(segs, logits):
        """Per segment the tokens its grammar allows next (structured output, one batched mask
        built in the sampling stage, so its cost is the step's `sample_s`), None where it has no
        grammar; None when no segment has one (an unconstrained batch builds nothing)."""
        rows = [i for i, seg in enumerate(segs) if seg.seq.grammar is not None]
        if not rows:
            return None
        mask = structured.allowed([segs[i].seq.grammar for i in rows], logits.shape[-1], logits.device)
        out = [None] * len(segs)
        for j, i in enumerate(rows):
            out[i] = mask[j]
        return out

    def _prompt_odds(self, segments):
        """The odds of the prompt tokens whose logits this forward computed (the segments'
        `prompt_logits`, engine/model/runner.py), in one batched pass for every such request
        (sampler.prompt_chances, at the largest count asked), kept on the request until its first
        token hands them out."""
        asking = [seg for seg in segments if seg.prompt_logits is not None and len(seg.prompt_rows)]
        if not asking:
            return
        tokens = [t for seg in asking for t in seg.seq.prompt_ids[seg.prompt_rows.start + 1:seg.prompt_rows.stop + 1]]
        k = max(seg.seq.params.prompt_logprobs for seg in asking)
        chances = sampler.prompt_chances(torch.cat([seg.prompt_logits for seg in asking]), tokens, k)
        at = 0
        for seg in asking:
            rows, want = seg.prompt_rows, seg.seq.params.prompt_logprobs
            mine, at = chances[at:at + len(rows)], at + len(rows)
            seg.seq.prompt_odds[rows.start + 1:rows.stop + 1] = [replace(c, top=c.top[:want]) for c in mine]

    def _prompt_entries(self, seq):
        """The prompt's odds as its first token carries them to its client: per prompt token its
        id, its own text (`own_text`), the text it adds to the prompt decoded in order, special
        tokens included (`text`: "" inside a character), and, after the first (nothing comes
        before it), its rank and odds (`Pieces.odds`: p_raw, top)."""
        detok = Detokenizer(self.tokenizer, skip_special_tokens=False)
        entries = [{"token_id": t, "text": detok.add(t), "own_text": self.pieces(t)}
                   | ({} if c is None else {"rank": c.rank, **self.pieces.odds(t, c)})
                   for t, c in zip(seq.prompt_ids, seq.prompt_odds)]
        entries[-1]["text"] += detok.flush()   # a prompt that ends inside a character
        return entries

    def _deliver(self, out, seg, run, chances):
        """One request's tokens from this forward, in order, each appended and handed out with its
        odds (None: none asked for; its client gets its text under the stop rule,
        `Sequence.append`); why the request ends, if one of them ends it (none after that)."""
        seq = seg.seq
        if seg.draft:       # the rejected guesses' positions are given back first
            self.scheduler.accepted(seg, len(run) - 1)
            out.accepted[seq.id] = len(run) - 1
        for tid, spec, chance in zip(run, speculate.kinds(len(run), len(seg.draft)), chances or [None] * len(run)):
            text, client_text, stop = seq.append(tid, tid in self.eos)
            odds = self.pieces.odds(tid, chance)
            if seq.prompt_odds is not None and len(seq.output_ids) == 1:
                odds["prompt"] = self._prompt_entries(seq)
            out.hand_out(seq, tid, text, client_text, spec, odds)
            if stop:
                return stop
        return None

    def _fail(self, out, seqs, error, what="a step"):
        """A forward or sampling raised (e.g. out of memory): end the requests it touched with
        reason "error", free their slots and blocks, say so, and keep serving the rest."""
        message = f"{what} failed for {', '.join(s.id for s in seqs)}: {type(error).__name__}: {error}"
        out.ended.append(Error(t=self.clock.now(), message=message))
        for seq in seqs:
            if seq.id in self._by_id:
                out.ended.append(self._end(seq, "error", message))

    def _end(self, seq, reason, error=None):
        """The request is done: it leaves the scheduler (its slot and blocks given back), is
        forgotten, and is noted as ended now (its `finished` event is the recorder's)."""
        self._by_id.pop(seq.id, None)
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        return Ended(seq, reason, error, self.clock.now())
