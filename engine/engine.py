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

from . import bandwidth, sampler
from .config import EngineConfig
from .events import (PROTOCOL, Admitted, Clock, Error, Finished, Hello, Prefill, Rejected, Request, Reset,
                     Settings, Stats, Step, Token, Tokenized)
from .kv_cache import BlockAccount, SlotKVStore, kv_bytes_per_token
from .loadgen import LoadGenerator
from .runner import Runner
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .settings import SettingError, coerce, make_settings
from .stats import RollingStats

STATS_EVERY_S = 0.5
MAX_PROMPT_CHARS = 200_000
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
        self.account = BlockAccount(config.block_size, config.cache_tokens // config.block_size)
        self.scheduler = Scheduler(self.account, config.slots)
        self.store = SlotKVStore(cfg, config.slots, self.max_context, bundle.dtype, bundle.device)
        self.runner = Runner(model, self.store)
        self.specs = make_settings(config.slots, self.account.capacity * config.block_size,
                                   config.block_size, self.max_context)
        self.settings = {name: spec.default for name, spec in self.specs.items()}
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
        self._out = []

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
            block_size=self.account.block_size, cache_blocks=self.account.capacity,
            max_slots=self.scheduler.max_slots, max_context=self.max_context, settings=dict(self.settings),
            limits={n: s.describe() for n, s in self.specs.items()}, bandwidth=self.bandwidth, bench=self.bench)

    @property
    def in_flight(self):
        return len(self._by_id)

    # ------------------------------------------- any thread: validate + tokenize
    def new_sequence(self, prompt=None, messages=None, source="api", max_new_tokens=None, temperature=None,
                     top_p=None, seed=None, stop=(), chat=None, stream=False, prompt_tokens=None):
        """A validated, tokenized request, not yet known to the engine (hand it to `add`).

        `prompt_tokens` cuts the prompt to that many tokens (the load generator's exact length).
        Raises SettingError for invalid parameters."""
        arrival = self.clock.now()
        params = self._params(max_new_tokens, temperature, top_p, seed, stop)
        text, ids = self._tokenize(prompt, messages, chat)
        if prompt_tokens is not None:
            ids = ids[:prompt_tokens]
        return Sequence(id=f"r{next(self._ids)}", source=source, prompt=text, prompt_ids=ids, params=params,
                        arrival=arrival, tokenize_end=self.clock.now(),
                        sink=queue.Queue() if stream else None)

    def _params(self, max_new_tokens, temperature, top_p, seed, stop):
        s = self.settings
        p = SamplingParams(
            max_new_tokens=coerce("max_new_tokens", "int", s["max_new_tokens"] if max_new_tokens is None
                                  else max_new_tokens, 1, self.max_context),
            temperature=coerce("temperature", "float", s["temperature"] if temperature is None
                               else temperature, 0.0, 2.0),
            top_p=coerce("top_p", "float", s["top_p"] if top_p is None else top_p, 0.0, 1.0),
            seed=None if seed is None else coerce("seed", "int", seed, 0, 2**63 - 1),
            stop=tuple(stop or ()))
        if p.top_p <= 0:
            raise SettingError("top_p", "must be greater than 0")
        if not all(isinstance(x, str) and x for x in p.stop) or len(p.stop) > 4:
            raise SettingError("stop", "must be up to 4 non-empty strings")
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
                           max_new_tokens=seq.params.max_new_tokens, preview=seq.prompt[:80]))
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
        if self.account.blocks_for(need) > self.account.capacity:
            return (f"needs {need} tokens of KV cache; the cache holds "
                    f"{self.account.capacity * self.account.block_size}", "exceeds_cache")
        if len(self.scheduler.waiting) >= self.scheduler.max_waiting:
            return f"queue full ({self.scheduler.max_waiting} waiting)", "queue_full"
        return None

    def cancel(self, rid):
        seq = self._by_id.get(rid)
        if seq is not None:
            self._finish(seq, "cancelled")
        return self._take()

    def apply_settings(self, changes):
        """Apply validated changes (`settings.validate`); return the `settings` event."""
        self.settings.update(changes)
        self.scheduler.slot_limit = self.settings["slots"]
        self.account.budget = self.settings["cache_tokens"] // self.account.block_size
        self._emit(Settings(t=self.clock.now(), settings=dict(self.settings), changed=sorted(changes)))
        return self._take()

    def reset(self):
        for seq in list(self._by_id.values()):
            self._finish(seq, "cancelled")
        self.stats = RollingStats()
        self._emit(Reset(t=self.clock.now()))
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
        """Admit, emit stats when due, run one forward (if there is work), sample, finish."""
        for seq in self.scheduler.admit(self.settings["kv_cache"]):
            seq.admitted = self.clock.now()
            self._emit(Admitted(t=seq.admitted, id=seq.id, slot=seq.slot, queue_s=seq.admitted - seq.arrival,
                                blocks=seq.blocks))
        # Right after admission, so whoever still waits really is blocked (stats say on what).
        if self.clock.now() >= self._next_stats:
            self._emit_stats()
        work = self.scheduler.next_work(self.settings["prefill_chunk"])
        if work is not None:
            try:
                if work[0] == "prefill":
                    self._prefill(*work[1:])
                else:
                    self._decode(work[1])
            except Exception as e:  # noqa: BLE001 -- fault isolation: fail the batch, not the engine
                self._fail(work, e)
        return self._take()

    def _step_event(self, kind, start, end, seqs, tokens):
        self._emit(Step(t=end, kind=kind, start=start, end=end, ids=[s.id for s in seqs], tokens=tokens,
                        kv_cache=seqs[0].kv_cache, cache_tokens=self.scheduler.cache_tokens,
                        cache_blocks_used=self.account.used,
                        per_request={s.id: s.length + 1 for s in seqs} if kind == "decode" else None))

    def _prefill(self, seqs, start, n):
        """One prefill forward: a chunk of one request (n given), or whole prompts of several."""
        t0 = self.clock.now()
        if n is not None:
            seq = seqs[0]
            logits = self.runner.prefill(seq.row, seq.prompt_ids[start:start + n], start)
        else:
            rows = [s.row for s in seqs] if seqs[0].kv_cache else None
            logits = self.runner.forward_full([s.prompt_ids for s in seqs], rows)
        t1 = self.clock.now()
        for seq in seqs:
            if seq.prefill_start is None:
                seq.prefill_start = t0
            seq.prefill_s += t1 - t0      # the shared forward is each one's prefill time
            seq.prefilled = start + n if n is not None else len(seq.prompt_ids)
            self._emit(Prefill(t=t1, id=seq.id, start=t0, end=t1, pos=start, tokens=seq.prefilled - start,
                               done=seq.prefill_done))
        self._step_event("prefill", t0, t1, seqs, sum(s.prefilled - start for s in seqs))
        done = [i for i, s in enumerate(seqs) if s.prefill_done]
        if done:
            self._sample_and_deliver([seqs[i] for i in done], logits[done], t1 - t0)

    def _decode(self, seqs):
        t0 = self.clock.now()
        if seqs[0].kv_cache:
            logits = self.runner.decode([s.row for s in seqs], [s.output_ids[-1] for s in seqs],
                                        [s.length for s in seqs])
            tokens = len(seqs)
        else:
            logits = self.runner.forward_full([s.total_ids for s in seqs])
            tokens = sum(len(s.total_ids) for s in seqs)
        t1 = self.clock.now()
        self._step_event("decode", t0, t1, seqs, tokens)
        self._sample_and_deliver(seqs, logits, t1 - t0)

    def _sample_and_deliver(self, seqs, logits, forward_s):
        t0 = self.clock.now()
        ids = sampler.sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        sampled = self.clock.now()
        sample_s = sampled - t0
        done = []
        for seq, tid in zip(seqs, ids):
            first = not seq.output_ids
            seq.output_ids.append(tid)
            text = self._increment(seq)
            handed = self.clock.now()
            self._emit(Token(t=handed, id=seq.id, index=len(seq.output_ids) - 1, token_id=tid, text=text,
                             first=first, sampled=sampled, sample_s=sample_s))
            if seq.sink is not None:
                seq.sink.put(("token", text, tid))
            delivered = self.clock.now()
            if first:
                seq.first_sampled, seq.first_sample_s, seq.first_delivered = sampled, sample_s, delivered
            else:
                seq.later_decode_s += forward_s
                seq.later_sample_s += sample_s
                seq.later_delivery_s += delivered - sampled
                self.stats.gap(delivered - seq.last_delivered)
            seq.last_delivered = delivered
            self.stats.token(delivered)
            reason = self._stop_reason(seq, tid)
            if reason:
                done.append((seq, reason))
        # Finish only after every row has its token: compaction copies `length` positions,
        # which counts this step's token only once it is appended.
        for seq, reason in done:
            self._finish(seq, reason)

    def _fail(self, work, error):
        """A forward or sampling raised (e.g. out of memory): end the requests it touched with
        reason "error", free their slots and blocks, say so, and keep serving the rest."""
        seqs = work[1]
        message = f"{work[0]} failed for {', '.join(s.id for s in seqs)}: {type(error).__name__}: {error}"
        self._emit(Error(t=self.clock.now(), message=message))
        for seq in seqs:
            if seq.id in self._by_id:
                self._finish(seq, "error", message)

    def _increment(self, seq):
        """The new text this token adds (held back while it ends in a partial UTF-8 character)."""
        full = self.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):
            return ""
        new, seq.text = full[len(seq.text):], full
        return new

    def _stop_reason(self, seq, tid):
        if tid in self.eos:
            return "stop"
        if any(s in seq.text for s in seq.params.stop):
            return "stop_string"
        if len(seq.output_ids) >= seq.params.max_new_tokens:
            return "length"
        return None

    def _finish(self, seq, reason, error=None):
        self._by_id.pop(seq.id, None)
        moved = self.scheduler.remove(seq)
        if moved is not None and seq.kv_cache:
            src, dst = moved
            mover = self.scheduler.running[dst]
            self.store.move_row(src, dst, mover.length)
        now = self.clock.now()
        ev = Finished(t=now, id=seq.id, reason=reason, source=seq.source, prompt_tokens=len(seq.prompt_ids),
                      output_tokens=len(seq.output_ids), e2e=now - seq.arrival, error=error)
        if seq.first_delivered is not None:
            ev.ttft, ev.tpot, ev.stages, ev.later = seq.stage_summary()
            self.stats.done(ev.ttft)
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
            cache_blocks_used=self.account.used, cache_blocks=self.account.budget,
            cache_tokens=sched.cache_tokens, subscribers=self.subscribers(),
            blocked_on=sched.blocked_on(self.settings["kv_cache"]), **self.stats.snapshot(now)))
