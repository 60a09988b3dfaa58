"""The engine thread: admits, runs forwards, samples, measures, and publishes events.

Other threads talk to it only through thread-safe methods (`submit`, `cancel`,
`update_settings`, `burst`, `reset`) which queue a command and wake the loop; the loop
owns all scheduling state, so there are no locks around it. The load generator has a
thread of its own and submits like any client, so its arrivals happen on time even while
a long forward runs (open loop), and are tokenized where an API request would be.
"""
import itertools
import queue
import threading
import time

from . import bandwidth, sampler
from .events import Broadcaster, Clock
from .kv_cache import BlockAccount, SlotKVStore, kv_bytes_per_token
from .loadgen import LoadGenerator
from .runner import Runner
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .settings import SettingError, coerce, make_settings, validate
from .stats import RollingStats

STATS_EVERY_S = 0.5
MAX_PROMPT_CHARS = 200_000
CHIPS_OWN, CHIPS_LOAD = 512, 48   # prompt tokens shown as chips in `tokenized` events


class RequestHandle:
    """What `submit` returns: the request id, and (when asked for) a stream of its outputs.

    `outputs` yields ("token", text, token_id) items, then one ("finished", event) or
    ("rejected", reason, code) item."""

    def __init__(self, rid, sink):
        self.id = rid
        self._sink = sink

    def outputs(self, timeout=None):
        while True:
            item = self._sink.get(timeout=timeout)
            yield item
            if item[0] in ("finished", "rejected"):
                return


class Engine:
    mode = "engine"   # as in `hello`; observe mode's Observer offers the same interface with "observe"

    def __init__(self, bundle, slots=16, kv_tokens=None, block_size=16, max_context=4096,
                 history=2000):
        self.bundle = bundle
        model, tok = bundle.model, bundle.tokenizer
        cfg = model.config
        self.tokenizer = tok
        self.clock = Clock()
        self.events = Broadcaster(history=history)
        self.max_context = min(max_context, getattr(cfg, "max_position_embeddings", max_context))
        self.bytes_per_token = kv_bytes_per_token(cfg, bundle.dtype)
        kv_tokens = kv_tokens or slots * 1024
        self.account = BlockAccount(block_size, kv_tokens // block_size)
        self.scheduler = Scheduler(self.account, slots)
        self.store = SlotKVStore(cfg, slots, self.max_context, bundle.dtype, bundle.device)
        self.runner = Runner(model, self.store)
        self.specs = make_settings(slots, self.account.capacity * block_size, block_size, self.max_context)
        self.settings = {name: spec.default for name, spec in self.specs.items()}
        self.loadgen = LoadGenerator(tok)
        # Measured memory read bandwidth -> the decode-step floor the page draws (~0.5 s, once
        # per process), and the committed `python -m bench` tables for this model, if any.
        self.params = sum(p.numel() for p in model.parameters())
        self.weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.bandwidth = bandwidth.floor(self.weight_bytes, bundle.device)
        self.bench = bandwidth.bench_results(bundle.name, bundle.device, bundle.dtype_name)
        self.stats = RollingStats()
        eos = getattr(model.generation_config, "eos_token_id", None) or tok.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self._ids = itertools.count(1)
        self._inbox = queue.Queue()
        self._wake = threading.Event()
        self._stop = False
        self._thread = None
        self._load_thread = None
        self._load_wake = threading.Event()
        self._next_stats = 0.0
        self._by_id = {}

    # ------------------------------------------------------------------ facts
    def hello(self):
        cfg = self.bundle.model.config
        return {
            "type": "hello", "t": self.clock.now(), "protocol": 1, "mode": "engine",
            "server_time": time.time(), "model": self.bundle.name, "device": self.bundle.device,
            "dtype": self.bundle.dtype_name, "params": self.params,
            "weight_bytes": self.weight_bytes, "layers": cfg.num_hidden_layers,
            "kv_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
            "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
            "kv_bytes_per_token": self.bytes_per_token, "block_size": self.account.block_size,
            "cache_blocks": self.account.capacity, "max_slots": self.scheduler.max_slots,
            "max_context": self.max_context, "settings": dict(self.settings),
            "limits": {n: s.describe() for n, s in self.specs.items()},
            "bandwidth": self.bandwidth, "bench": self.bench,
        }

    # ------------------------------------------------------- thread-safe API
    def start(self):
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()
        self._load_thread = threading.Thread(target=self._load_loop, name="load-generator", daemon=True)
        self._load_thread.start()
        return self

    def shutdown(self):
        self._stop = True
        self._wake.set()
        self._load_wake.set()
        for thread in (self._thread, self._load_thread):
            if thread:
                thread.join(timeout=10)

    def submit(self, prompt=None, messages=None, source="api", max_new_tokens=None, temperature=None,
               top_p=None, seed=None, stop=(), chat=None, stream=False, prompt_tokens=None):
        """Tokenize (here, in the caller's thread, measured) and queue one request.

        `prompt_tokens` cuts the prompt to that many tokens (the load generator's exact length).
        Raises SettingError for invalid parameters; nothing is queued then."""
        arrival = self.clock.now()
        params = self._params(max_new_tokens, temperature, top_p, seed, stop)
        text, ids = self._tokenize(prompt, messages, chat)
        if prompt_tokens is not None:
            ids = ids[:prompt_tokens]
        seq = Sequence(id=f"r{next(self._ids)}", source=source, prompt=text, prompt_ids=ids, params=params,
                       arrival=arrival, tokenize_end=self.clock.now(),
                       sink=queue.Queue() if stream else None)
        self._inbox.put(("add", seq))
        self._wake.set()
        return RequestHandle(seq.id, seq.sink)

    def cancel(self, rid):
        self._command("cancel", rid)

    def update_settings(self, changes):
        """Validate all changes (SettingError on any bad one, nothing applied), then apply."""
        changes = validate(self.specs, changes)
        self._command("set", changes)
        return changes

    def burst(self, n):
        n = coerce("n", "int", n, 1, 64)
        for _ in range(n):
            self._submit_load()

    def reset(self):
        self._command("reset", None)

    def _command(self, kind, arg):
        self._inbox.put((kind, arg))
        self._wake.set()

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

    # ------------------------------------------------------------ the loop
    def _publish(self, event):
        if self.events.enabled:
            self.events.publish(event)

    def _loop(self):
        while not self._stop:
            self._drain_inbox()
            for seq in self.scheduler.admit(self.settings["kv_cache"]):
                self._on_admitted(seq)
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
            else:
                self._wake.wait(self._idle_timeout())
                self._wake.clear()

    def _idle_timeout(self):
        return max(0.0, min(self._next_stats - self.clock.now(), STATS_EVERY_S))

    def _drain_inbox(self):
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._enqueue(arg)
            elif kind == "cancel":
                seq = self._by_id.get(arg)
                if seq is not None:
                    self._finish(seq, "cancelled")
            elif kind == "set":
                self._apply_settings(arg)
            elif kind == "reset":
                for seq in list(self._by_id.values()):
                    self._finish(seq, "cancelled")
                self.stats = RollingStats()
                self._publish({"type": "reset", "t": self.clock.now()})

    def _apply_settings(self, changes):
        self.settings.update(changes)
        self.scheduler.slot_limit = self.settings["slots"]
        self.account.budget = self.settings["cache_tokens"] // self.account.block_size
        self._load_wake.set()   # the generator redraws its next gap under the new rate
        self._publish({"type": "settings", "t": self.clock.now(), "settings": dict(self.settings),
                       "changed": sorted(changes)})

    def _load_loop(self):
        """Open-loop Poisson arrivals while `load` is on (its own thread)."""
        while not self._stop:
            due = self.loadgen.due(self.clock.now(), self.settings["load"], self.settings["rate"])
            for _ in range(due):
                self._submit_load()
            nxt = self.loadgen.next_arrival
            if self._load_wake.wait(STATS_EVERY_S if nxt is None else max(0.0, nxt - self.clock.now())):
                self._load_wake.clear()
                self.loadgen.restart()   # exponential gaps are memoryless: redrawing is exact

    def _submit_load(self):
        n = self.settings["prompt_tokens"]
        self.submit(prompt=self.loadgen.prompt(n), source="load", prompt_tokens=n)

    def _enqueue(self, seq):
        n = len(seq.prompt_ids)
        self._publish({"type": "request", "t": seq.arrival, "id": seq.id, "source": seq.source,
                       "prompt_tokens": n, "max_new_tokens": seq.params.max_new_tokens,
                       "preview": seq.prompt[:80]})
        # Token chips: a person's own prompt in full (up to 512), a generated one abridged, to
        # keep the stream small under heavy load.
        shown = seq.prompt_ids[:CHIPS_LOAD if seq.source == "load" else CHIPS_OWN]
        self._publish({"type": "tokenized", "t": seq.tokenize_end, "id": seq.id, "start": seq.arrival,
                       "end": seq.tokenize_end, "n": n, "ids": shown,
                       "pieces": self.tokenizer.batch_decode([[i] for i in shown]), "truncated": n > len(shown)})
        need = n + seq.params.max_new_tokens
        reason = code = None   # code: a stable name for API clients (the reason is prose)
        if need > self.max_context:
            reason = (f"prompt ({n} tokens) + max_new_tokens ({seq.params.max_new_tokens}) exceeds the "
                      f"context of {self.max_context} tokens")
            code = "context_length_exceeded"
        elif self.account.blocks_for(need) > self.account.capacity:
            reason = f"needs {need} tokens of KV cache; the cache holds {self.account.capacity * self.account.block_size}"
            code = "exceeds_cache"
        elif len(self.scheduler.waiting) >= self.scheduler.max_waiting:
            reason, code = f"queue full ({self.scheduler.max_waiting} waiting)", "queue_full"
        if reason:
            self._publish({"type": "rejected", "t": self.clock.now(), "id": seq.id, "reason": reason,
                           "code": code})
            if seq.sink is not None:
                seq.sink.put(("rejected", reason, code))
            return
        if seq.params.seed is not None:
            seq.generator = sampler.make_generator(seq.params.seed, self.runner.device)
        self._by_id[seq.id] = seq
        self.scheduler.waiting.append(seq)

    def _on_admitted(self, seq):
        seq.admitted = self.clock.now()
        self._publish({"type": "admitted", "t": seq.admitted, "id": seq.id, "slot": seq.slot,
                       "queue_s": seq.admitted - seq.arrival, "blocks": seq.blocks})

    def _step_event(self, kind, start, end, seqs, tokens):
        ev = {"type": "step", "t": end, "kind": kind, "start": start, "end": end,
              "ids": [s.id for s in seqs], "tokens": tokens, "kv_cache": seqs[0].kv_cache,
              "cache_tokens": self.scheduler.cache_tokens, "cache_blocks_used": self.account.used}
        if kind == "decode":
            ev["per_request"] = {s.id: s.length + 1 for s in seqs}
        self._publish(ev)

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
            self._publish({"type": "prefill", "t": t1, "id": seq.id, "start": t0, "end": t1, "pos": start,
                           "tokens": seq.prefilled - start, "done": seq.prefill_done})
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
            self._publish({"type": "token", "t": handed, "id": seq.id, "index": len(seq.output_ids) - 1,
                           "token_id": tid, "text": text, "first": first, "sampled": sampled,
                           "sample_s": sample_s})
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
        self._publish({"type": "error", "t": self.clock.now(), "field": None,
                       "message": f"{work[0]} failed for {', '.join(s.id for s in seqs)}: "
                                  f"{type(error).__name__}: {error}"})
        for seq in seqs:
            if seq.id in self._by_id:
                self._finish(seq, "error")

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

    def _finish(self, seq, reason):
        self._by_id.pop(seq.id, None)
        moved = self.scheduler.remove(seq)
        if moved is not None and seq.kv_cache:
            src, dst = moved
            mover = self.scheduler.running[dst]
            self.store.move_row(src, dst, mover.length)
        now = self.clock.now()
        ev = {"type": "finished", "t": now, "id": seq.id, "reason": reason, "source": seq.source,
              "prompt_tokens": len(seq.prompt_ids), "output_tokens": len(seq.output_ids),
              "e2e": now - seq.arrival, "ttft": None, "tpot": None, "stages": None, "later": None}
        if seq.first_delivered is not None:
            ttft, tpot, stages, later = seq.stage_summary()
            ev.update(ttft=ttft, tpot=tpot, stages=stages, later=later)
            self.stats.done(ttft)
        seq.finish_reason = reason
        self._publish(ev)
        if seq.sink is not None:
            seq.sink.put(("finished", ev))

    def _emit_stats(self):
        now = self.clock.now()
        self._next_stats = now + STATS_EVERY_S
        sched = self.scheduler
        ev = {"type": "stats", "t": now, "queue": len(sched.waiting), "running": len(sched.running),
              "waiting_ids": [s.id for s in list(sched.waiting)[:50]],
              # every slot up to the limit, plus any still busy above a lowered limit
              "slots": [s.id if s else None for s in sched.slots[: max(
                  [sched.slot_limit] + [i + 1 for i, s in enumerate(sched.slots) if s])]],
              "cache_blocks_used": self.account.used, "cache_blocks": self.account.budget,
              "cache_tokens": sched.cache_tokens, "subscribers": self.events.subscribers,
              "blocked_on": sched.blocked_on(self.settings["kv_cache"])}
        ev.update(self.stats.snapshot(now))
        self._publish(ev)
