"""The engine as a step function: `Engine.step()` admits, schedules, runs one forward,
samples, finishes, and returns the typed events it produced.

It owns no thread and takes no locks: one caller (the driver thread in engine/driver.py,
or a test) calls `add`, `cancel`, `apply_settings`, `reset` and `step` in turn, and
publishes what they return. The only method other threads may call is `new_sequence`,
which validates and tokenizes a request in the caller's thread (measured as the
request's tokenize stage) and touches no engine state.

An exception in a forward or in sampling fails the requests of that batch (reason
"error") and the step carries on; any other exception escapes `step()` and the driver
fails everything in flight.
"""
import itertools
import queue

from . import bandwidth, presets, sampler
from .detok import Detokenizer, StopStrings
from .config import EngineConfig
from .events import PROTOCOL, Clock, Error, Hello, Rejected, Request, Reset, Settings, Tokenized
from .kv_cache import BlockManager, PagedKVStore, kv_bytes_per_token
from .loadgen import LoadGenerator
from .runner import Runner
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .settings import SettingError, check_text, coerce, make_settings
from .timing import StepRecorder

MAX_PROMPT_CHARS = 200_000
MAX_LABEL_CHARS = 64   # a request's label (a classroom name; the classroom itself allows fewer)
CHIPS_OWN, CHIPS_LOAD = 512, 48   # prompt tokens shown as chips in `tokenized` events


class Engine:
    def __init__(self, bundle, config=None, bench=None):
        """`bench`: the committed `python -m bench` results for this model, carried in `hello`."""
        self.config = config = config or EngineConfig()
        self.bundle = bundle
        model, tok = bundle.model, bundle.tokenizer
        cfg = model.config
        self.tokenizer = tok
        self.clock = Clock()
        self.max_context = min(config.max_context, getattr(cfg, "max_position_embeddings", config.max_context))
        self.bytes_per_token = kv_bytes_per_token(cfg, bundle.dtype)
        self.blocks = BlockManager(config.block_size, config.cache_tokens // config.block_size)
        self.scheduler = Scheduler(self.blocks, config.slots)
        self._out = []
        self.timing = StepRecorder(self.clock, self._emit, self.scheduler)
        self.store = PagedKVStore(cfg, self.blocks.capacity, config.block_size, bundle.dtype, bundle.device)
        self.runner = Runner(model, self.store)
        self.specs = make_settings(config.slots, self.blocks.capacity * config.block_size,
                                   config.block_size, self.max_context)
        self.settings = {}
        self.apply_settings({name: spec.default for name, spec in self.specs.items()})
        self._take()   # the defaults' `settings` event: `hello` carries them
        self.loadgen = LoadGenerator(tok)
        self.params = sum(p.numel() for p in model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # Measured memory read bandwidth -> the decode-step floor the page draws (~0.5 s, once per process).
        self.bandwidth = bandwidth.floor(self.weight_bytes, bundle.device)
        self.bench = bench
        self.subscribers = lambda: 0   # how many pages listen (the driver knows; stats report it)
        eos = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._ids = itertools.count(1)
        self._by_id = {}

    # ------------------------------------------------------------------ facts
    def hello(self):
        cfg = self.bundle.model.config
        b = self.bundle
        return Hello(
            t=self.clock.now(), protocol=PROTOCOL, mode="engine", server_time=self.clock.wall0 + self.clock.now(),
            model=b.name, device=b.device, dtype=b.dtype_name, params=self.params,
            weight_bytes=self.weight_bytes, layers=cfg.num_hidden_layers,
            kv_heads=getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            hidden=cfg.hidden_size, vocab=cfg.vocab_size, kv_bytes_per_token=self.bytes_per_token,
            block_size=self.blocks.block_size, cache_blocks=self.blocks.capacity, kv_store_bytes=self.store.nbytes,
            max_slots=self.scheduler.max_slots, max_context=self.max_context, settings=dict(self.settings),
            limits={n: s.describe() for n, s in self.specs.items()}, bandwidth=self.bandwidth, bench=self.bench,
            presets=[p.describe() for p in presets.PRESETS.values()])

    @property
    def in_flight(self):
        return len(self._by_id)

    # ------------------------------------------- any thread: validate + tokenize
    def new_sequence(self, prompt=None, messages=None, source="api", max_new_tokens=None, temperature=None,
                     top_p=None, seed=None, stop=(), chat=None, stream=False, prompt_tokens=None,
                     ignore_eos=False, min_tokens=0, label=None):
        """A validated, tokenized request, not yet known to the engine (hand it to `add`).

        `prompt_tokens` cuts the prompt to that many tokens (the load generator's exact length);
        `label` names who asked (the `request` event carries it). Raises SettingError for
        invalid parameters."""
        arrival = self.clock.now()
        if label is not None and (not isinstance(label, str) or not label or len(label) > MAX_LABEL_CHARS):
            raise SettingError("label", f"must be a non-empty string of up to {MAX_LABEL_CHARS} characters")
        if label is not None:
            check_text("label", label)
        params = self._params(max_new_tokens, temperature, top_p, seed, stop, ignore_eos, min_tokens)
        text, ids = self._tokenize(prompt, messages, chat)
        if prompt_tokens is not None:
            ids = ids[:prompt_tokens]
        return Sequence(id=f"r{next(self._ids)}", source=source, prompt=text, prompt_ids=ids, params=params,
                        arrival=arrival, tokenize_end=self.clock.now(), label=label,
                        sink=queue.Queue() if stream else None)

    def _params(self, max_new_tokens, temperature, top_p, seed, stop, ignore_eos, min_tokens):
        s = self.settings
        p = SamplingParams(
            max_new_tokens=coerce("max_new_tokens", "int", s["max_new_tokens"] if max_new_tokens is None
                                  else max_new_tokens, 1, self.max_context),
            temperature=coerce("temperature", "float", s["temperature"] if temperature is None
                               else temperature, 0.0, 2.0),
            top_p=coerce("top_p", "float", s["top_p"] if top_p is None else top_p, 0.0, 1.0),
            seed=None if seed is None else coerce("seed", "int", seed, 0, 2**63 - 1),
            stop=tuple(stop or ()), ignore_eos=coerce("ignore_eos", "bool", ignore_eos),
            min_tokens=coerce("min_tokens", "int", min_tokens, 0, self.max_context))
        if p.min_tokens > p.max_new_tokens:
            raise SettingError("min_tokens", f"must be at most max_new_tokens ({p.max_new_tokens})")
        if p.top_p <= 0:
            raise SettingError("top_p", "must be greater than 0")
        if not all(isinstance(x, str) and x for x in p.stop) or len(p.stop) > 4:
            raise SettingError("stop", "must be up to 4 non-empty strings")
        for x in p.stop:
            check_text("stop", x)
        return p

    def _tokenize(self, prompt, messages, chat):
        if messages is not None:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        elif isinstance(prompt, str) and prompt:
            if len(prompt) > MAX_PROMPT_CHARS:
                raise SettingError("prompt", f"longer than {MAX_PROMPT_CHARS} characters")
            text = prompt
            if chat and self.tokenizer.chat_template:
                text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                          tokenize=False, add_generation_prompt=True)
        else:
            raise SettingError("prompt", "must be a non-empty string")
        check_text("prompt", text)   # a lone surrogate is a TypeError in the tokenizer
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise SettingError("prompt", "tokenizes to nothing")
        return text, ids

    # ------------------------------------------------ commands (the caller's turn)
    def _emit(self, event):
        self._out.append(event)

    def _take(self):
        out, self._out = self._out, []
        return out

    def add(self, seq):
        """Queue a request from `new_sequence` (or reject it, with a reason); return the events."""
        n = len(seq.prompt_ids)
        self._emit(Request(t=seq.arrival, id=seq.id, source=seq.source, prompt_tokens=n,
                           max_new_tokens=seq.params.max_new_tokens, preview=seq.prompt[:80], label=seq.label))
        # Token chips: a person's own prompt in full (up to 512), a generated one abridged, to
        # keep the stream small under heavy load.
        shown = seq.prompt_ids[:CHIPS_LOAD if seq.source == "load" else CHIPS_OWN]
        self._emit(Tokenized(t=seq.tokenize_end, id=seq.id, start=seq.arrival, end=seq.tokenize_end, n=n,
                             ids=shown, pieces=self.tokenizer.batch_decode([[i] for i in shown]),
                             truncated=n > len(shown)))
        refusal = self._refusal(seq)
        if refusal:
            reason, code = refusal
            self._emit(Rejected(t=self.clock.now(), id=seq.id, reason=reason, code=code))
            if seq.sink is not None:
                seq.sink.put(("rejected", reason, code))
            return self._take()
        if seq.params.seed is not None:
            seq.generator = sampler.make_generator(seq.params.seed, self.runner.device)
        seq.detok, seq.stops = Detokenizer(self.tokenizer), StopStrings(seq.params.stop)
        self._by_id[seq.id] = seq
        self.scheduler.waiting.append(seq)
        return self._take()

    def _refusal(self, seq):
        """(reason, code) when the request can never run here, else None. The code is a stable
        name for API clients; the reason is prose."""
        n, new = len(seq.prompt_ids), seq.params.max_new_tokens
        need = n + new
        if need > self.max_context:
            return (f"prompt ({n} tokens) + max_new_tokens ({new}) exceeds the context of "
                    f"{self.max_context} tokens", "context_length_exceeded")
        if self.blocks.blocks_for(need) > self.blocks.budget:
            return (f"needs {need} tokens of KV cache; the cache budget is "
                    f"{self.blocks.budget * self.blocks.block_size} tokens", "exceeds_cache")
        if len(self.scheduler.waiting) >= self.scheduler.max_waiting:
            return f"queue full ({self.scheduler.max_waiting} waiting)", "queue_full"
        return None

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
        sched, s = self.scheduler, self.settings
        sched.slot_limit, sched.policy, sched.max_batched_tokens = s["slots"], s["schedule"], s["max_batched_tokens"]
        if sched.prefix_caching and not s["prefix_caching"]:
            self.blocks.forget_hashes()
        sched.prefix_caching = s["prefix_caching"]
        self.blocks.budget = s["cache_tokens"] // self.blocks.block_size
        self._emit(Settings(t=self.clock.now(), settings=dict(self.settings), changed=sorted(changes)))
        return self._take()

    def reset(self):
        for seq in list(self._by_id.values()):
            self._finish(seq, "cancelled")
        self.timing.reset()
        self.blocks.reset_counters()
        self.scheduler.reset_counters()
        # Every block is free now: forget their prefixes too, as vLLM's reset_prefix_cache does, so
        # a lesson run again (a preset resets first) starts from the same empty cache.
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
        for seq, reason in plan.refused:
            self._refuse_waiting(seq, reason)
        self.timing.admitted(plan.admitted, at)
        self.timing.stats_if_due(self.settings["kv_cache"], self.subscribers)
        return plan

    def _refuse_waiting(self, seq, reason):
        """A waiting request the lowered cache budget can never hold: rejected (or, if it had
        started before a preemption, finished with an error) instead of waiting forever."""
        if seq.output_ids:
            self._finish(seq, "error", reason)
            return
        self._by_id.pop(seq.id, None)
        self._emit(Rejected(t=self.clock.now(), id=seq.id, reason=reason, code="exceeds_cache"))
        if seq.sink is not None:
            seq.sink.put(("rejected", reason, "exceeds_cache"))

    def _run(self, segments):
        """One forward over `segments`; their positions are computed after it. The logits of
        those that sample."""
        self.timing.forward_started()
        logits = self.runner.forward(segments)
        self.timing.forward_ended()
        for seg in segments:
            self.scheduler.computed(seg)
        self.timing.forward_recorded(segments)
        return logits

    def _postprocess(self, segments, logits):
        """A token for each segment that wanted one, handed out; requests that stopped finish.
        A request whose own sampling raised fails alone."""
        seqs = [seg.seq for seg in segments if seg.logits]
        if not seqs:
            return
        self.timing.sampling_started()
        failed = {}
        try:
            ids = sampler.sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        except sampler.RowsFailed as e:     # some requests' sampling raised: they alone fail
            ids, failed = e.tokens, e.failed
        self.timing.sampled()
        done = []
        for seq, tid in zip(seqs, ids):
            if tid is None:                 # its sampling failed: below
                continue
            reason = self._deliver(seq, tid)
            if reason:
                done.append((seq, reason))
        for i, error in failed.items():
            self._fail([seqs[i]], error, "sampling")
        for seq, reason in done:
            self._finish(seq, reason)

    def _deliver(self, seq, tid):
        """Append the token and hand its text out (event, then the request's consumer); return
        why it ends the request, if it does."""
        seq.output_ids.append(tid)
        text = seq.detok.add(tid)   # "" while a UTF-8 character is incomplete
        stopped = seq.stops.feed(text)
        self.timing.token(seq, tid, text)
        if seq.sink is not None:
            seq.sink.put(("token", text, tid))
        self.timing.delivered(seq)
        return self._stop_reason(seq, tid, stopped)

    def _fail(self, seqs, error, what="a step"):
        """A forward or sampling raised (e.g. out of memory): end the requests it touched with
        reason "error", free their slots and blocks, say so, and keep serving the rest."""
        message = f"{what} failed for {', '.join(s.id for s in seqs)}: {type(error).__name__}: {error}"
        self._emit(Error(t=self.clock.now(), message=message))
        for seq in seqs:
            if seq.id in self._by_id:
                self._finish(seq, "error", message)

    def _stop_reason(self, seq, tid, stop_string_seen):
        p, n = seq.params, len(seq.output_ids)
        if n >= p.min_tokens:
            if tid in self.eos and not p.ignore_eos:
                return "stop"
            if stop_string_seen:
                return "stop_string"
        if n >= p.max_new_tokens:
            return "length"
        return None

    def _finish(self, seq, reason, error=None):
        self._by_id.pop(seq.id, None)
        self.scheduler.remove(seq)
        ev = self.timing.finished(seq, reason, error)
        seq.finish_reason = reason
        if seq.sink is not None:
            seq.sink.put(("finished", ev))
