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
from .events import (PROTOCOL, Admitted, Clock, Error, Finished, Hello, Preempted, Prefill, Rejected, Request, Reset, Settings, Stats, Step, Token, Tokenized)
from .kv_cache import BlockManager, PagedKVStore, kv_bytes_per_token
from .loadgen import LoadGenerator
from .runner import Runner
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .settings import SettingError, check_text, coerce, make_settings
from .stats import RollingStats

STATS_EVERY_S = 0.5
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
        self.store = PagedKVStore(cfg, self.blocks.capacity, config.block_size, bundle.dtype, bundle.device)
        self.runner = Runner(model, self.store)
        self.specs = make_settings(config.slots, self.blocks.capacity * config.block_size,
                                   config.block_size, self.max_context)
        self.settings = {}
        self._out = []
        self.apply_settings({name: spec.default for name, spec in self.specs.items()})
        self._out = []
        self.loadgen = LoadGenerator(tok)
        self.params = sum(p.numel() for p in model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # Measured memory read bandwidth -> the decode-step floor the page draws (~0.5 s, once per process).
        self.bandwidth = bandwidth.floor(self.weight_bytes, bundle.device)
        self.bench = bench
        self.stats = RollingStats()
        self.subscribers = lambda: 0   # how many pages listen (the driver knows; stats report it)
        eos = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._ids = itertools.count(1)
        self._by_id = {}
        self._next_stats = 0.0

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
        self.stats = RollingStats()
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
        return max(0.0, min(self._next_stats - self.clock.now(), STATS_EVERY_S))

    def step(self):
        """Schedule, emit stats when due, run one forward over the scheduled tokens, sample, finish."""
        plan = self.scheduler.schedule(self.settings["kv_cache"])
        now = self.clock.now()
        for seq in plan.preempted:
            seq.preempted_at = now
            if seq.first_delivered is not None and seq.recovering_since is None:
                seq.recovering_since = now
            self._emit(Preempted(t=now, id=seq.id, tokens=seq.num_tokens, preemptions=seq.preemptions))
        for seq, reason in plan.refused:
            self._refuse_waiting(seq, reason)
        for seq in plan.admitted:
            resumed = seq.admitted is not None
            waited = now - (seq.preempted_at if resumed else seq.arrival)
            if resumed and seq.first_delivered is None:
                seq.requeue_s += waited
            seq.admitted = seq.admitted or now
            self._emit(Admitted(t=now, id=seq.id, slot=seq.slot, queue_s=waited, blocks=len(seq.block_table),
                                prompt_tokens=seq.num_tokens, cached_tokens=seq.admitted_cached, resumed=resumed))
        # Right after admission, so whoever still waits really is blocked (stats say on what).
        if self.clock.now() >= self._next_stats:
            self._emit_stats()
        if plan.segments:
            try:
                self._run(plan.segments)
            except Exception as e:  # noqa: BLE001 -- fault isolation: fail the batch, not the engine
                self._fail([seg.seq for seg in plan.segments], e)
        return self._take()

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
        t0 = self.clock.now()
        logits = self.runner.forward(segments)
        t1 = self.clock.now()
        prefill_tokens = decode_tokens = 0
        for seg in segments:
            seq = seg.seq
            if seg.decode:
                decode_tokens += 1 if seg.cached else seg.n
            else:
                prefill_tokens += seg.n
                if seq.first_delivered is None:       # the shared forward is each one's prefill time
                    seq.prefill_start = seq.prefill_start if seq.prefill_start is not None else t0
                    seq.prefill_s += t1 - t0
                self._emit(Prefill(t=t1, id=seq.id, start=t0, end=t1, pos=seg.start, tokens=seg.n,
                                   done=seg.logits))
            self.scheduler.computed(seg)
        self._account_later(segments, t1 - t0, prefill_tokens)
        kind = "mixed" if prefill_tokens and decode_tokens else "decode" if decode_tokens else "prefill"
        self._emit(Step(t=t1, kind=kind, start=t0, end=t1, ids=[g.seq.id for g in segments],
                        tokens=sum(g.n for g in segments), prefill_tokens=prefill_tokens,
                        decode_tokens=decode_tokens, kv_cache=segments[0].seq.kv_cache, cache_tokens=self.scheduler.cache_tokens, cache_blocks_used=self.blocks.used,
                        per_request={g.seq.id: g.start + g.n for g in segments}))
        sampling = [g.seq for g in segments if g.logits]
        if sampling:
            self._sample_and_deliver(sampling, logits)

    def _account_later(self, segments, forward_s, prefill_tokens):
        """Charge this forward to every running request past its first token: to `decode` or
        `mixed` (other requests' prompt chunks shared the forward) if it was in the forward, to
        `stalled` if it waited outside it. A request recovering from preemption is charged as a
        whole when its next token comes (`preempted`)."""
        inside = {seg.seq.id for seg in segments}
        for seq in self.scheduler.running:
            if seq.first_delivered is None or seq.recovering_since is not None:
                continue
            if seq.id not in inside:
                seq.later_stalled_s += forward_s
            elif prefill_tokens:
                seq.later_mixed_s += forward_s
            else:
                seq.later_decode_s += forward_s

    def _sample_and_deliver(self, seqs, logits):
        t0 = self.clock.now()
        failed = {}
        try:
            ids = sampler.sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        except sampler.RowsFailed as e:     # some requests' sampling raised: they alone fail
            ids, failed = e.tokens, e.failed
        sampled = self.clock.now()
        sample_s = sampled - t0
        done = []
        for seq, tid in zip(seqs, ids):
            if tid is None:
                continue
            first = not seq.output_ids
            seq.output_ids.append(tid)
            text = seq.detok.add(tid)   # "" while a UTF-8 character is incomplete
            stopped = seq.stops.feed(text)
            handed = self.clock.now()
            self._emit(Token(t=handed, id=seq.id, index=len(seq.output_ids) - 1, token_id=tid, text=text,
                             first=first, sampled=sampled, sample_s=sample_s))
            if seq.sink is not None:
                seq.sink.put(("token", text, tid))
            delivered = self.clock.now()
            if first:
                seq.first_sampled, seq.first_sample_s, seq.first_delivered = sampled, sample_s, delivered
                self.stats.first_token(delivered - seq.arrival)   # the headline counts it now, not at the end
            else:
                if seq.recovering_since is not None:
                    seq.later_preempted_s += t0 - seq.recovering_since
                    seq.recovering_since = None
                seq.later_sample_s += sample_s
                seq.later_delivery_s += delivered - sampled
                self.stats.gap(delivered - seq.last_delivered)
            seq.last_delivered = delivered
            self.stats.token(delivered)
            reason = self._stop_reason(seq, tid, stopped)
            if reason:
                done.append((seq, reason))
        for i, error in failed.items():
            self._fail([seqs[i]], error, "sampling")
        for seq, reason in done:
            self._finish(seq, reason)

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
        now = self.clock.now()
        ev = Finished(t=now, id=seq.id, reason=reason, source=seq.source, prompt_tokens=len(seq.prompt_ids),
                      output_tokens=len(seq.output_ids), e2e=now - seq.arrival, error=error,
                      cached_tokens=seq.cached_tokens, preemptions=seq.preemptions)
        if seq.first_delivered is not None:
            ev.ttft, ev.tpot, ev.stages, ev.later = seq.stage_summary()
            self.stats.finished += 1
        seq.finish_reason = reason
        self._emit(ev)
        if seq.sink is not None:
            seq.sink.put(("finished", ev))

    def _emit_stats(self):
        now = self.clock.now()
        self._next_stats = now + STATS_EVERY_S
        sched = self.scheduler
        busy = max([sched.slot_limit] + [i + 1 for i, s in enumerate(sched.slots) if s])
        self._emit(Stats(
            t=now, queue=len(sched.waiting), running=len(sched.running),
            waiting_ids=[s.id for s in list(sched.waiting)[:50]],
            # every slot up to the limit, plus any still busy above a lowered limit
            slots=[s.id if s else None for s in sched.slots[:busy]],
            cache_blocks_used=self.blocks.used, cache_blocks=self.blocks.budget,
            cache_tokens=sched.cache_tokens, cache_blocks_shared=self.blocks.shared,
            cache_blocks_cached=self.blocks.cached_free,
            block_tables={s.id: list(s.block_table) for s in sched.running if s.kv_cache},
            prefix_queries=self.blocks.queries, prefix_hits=self.blocks.hits, preemptions=sched.preemptions,
            subscribers=self.subscribers(),
            blocked_on=sched.blocked_on(self.settings["kv_cache"]), **self.stats.snapshot(now)))
