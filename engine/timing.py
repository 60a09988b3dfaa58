"""The step recorder: every clock read of a step, what each request is charged, and the events
that carry those figures.

`Engine.step()` does the work (schedule, forward, sample, hand out, finish) and calls the
recorder at fixed points of it: after scheduling (preemptions, admissions), around the
forward, around sampling, as each token is handed out and delivered, and as a request
finishes. The recorder reads the engine clock there and only there, keeps the per-request
stage accounting on the Sequence (`prefill_s`, `first_sampled`, `later_*_s`, ...: what
`Sequence.stage_summary` and docs/engine.md explain), feeds the rolling stats, and emits the
`preempted`, `admitted`, `prefill`, `step`, `token`, `finished` and `stats` events.
"""
from .events import Admitted, Finished, Preempted, Prefill, Stats, Step, Token
from collections import deque

from .stats import RollingStats

STATS_EVERY_S = 0.5
COMPLETED = ("stop", "stop_string", "length")   # finish reasons judged against the SLOs (not cancels, errors)


class StepRecorder:
    def __init__(self, clock, emit, scheduler, roofline=None, targets=None):
        """`roofline`: predicts each forward's time (engine/roofline.py), carried in `step` events;
        `targets`: the SLOs finished requests are judged by (settings.Targets; the engine hands
        each new one over); None: none are judged."""
        self.clock = clock
        self.roofline = roofline
        self.targets = targets
        self._emit = emit
        self.scheduler = scheduler
        self.stats = RollingStats(started=clock.now())
        self.loads = deque(maxlen=8)   # (start, end) of the latest model loads (engine/reload.py)
        self._next_stats = 0.0
        # this step's forward (start, end) and sampling (start, end, seconds): every token of a
        # step is sampled at once, so each has the step's sampling times
        self._forward_start = self._forward_end = 0.0
        self._sampling = self._sampled = self._sample_s = 0.0
        self._step = None   # this step's `step` event (speculation's counts are filled in after sampling)

    def reset(self):
        """Start the rolling stats afresh (the engine's reset)."""
        self.stats = RollingStats(started=self.clock.now())

    # ------------------------------------------------------------------ scheduling
    def preempted(self, seqs):
        """The step's scheduling time (one clock read, returned for `admitted`); `seqs` were
        preempted then. A request past its first token is recovering until its next one."""
        now = self.clock.now()
        for seq in seqs:
            seq.preempted_at = now
            if seq.first_delivered is not None and seq.recovering_since is None:
                seq.recovering_since = now
            self._emit(Preempted(t=now, id=seq.id, tokens=seq.num_tokens, preemptions=seq.preemptions))
        return now

    def admitted(self, seqs, now):
        """`seqs` took a slot at `now`: how long each waited, since it arrived or was preempted
        (before its first token that wait is its queue stage too)."""
        for seq in seqs:
            resumed = seq.admitted is not None
            waited = now - (seq.preempted_at if resumed else seq.arrival)
            if resumed and seq.first_delivered is None:
                seq.requeue_s += waited
            if not resumed:     # the part of its wait the model was loading: its `load` stage
                seq.load_s = sum(max(0.0, min(e, now) - max(s, seq.tokenize_end)) for s, e in self.loads)
            seq.admitted = seq.admitted or now
            self._emit(Admitted(t=now, id=seq.id, slot=seq.slot, queue_s=waited, blocks=len(seq.block_table),
                                prompt_tokens=seq.num_tokens, cached_tokens=seq.admitted_cached, resumed=resumed))

    def model_loaded(self, start, end):
        """The model was (re)loaded from `start` to `end`: requests waiting then are charged it."""
        self.loads.append((start, end))

    def idle_timeout(self):
        """How long until the next `stats` event is due (at most STATS_EVERY_S)."""
        return max(0.0, min(self._next_stats - self.clock.now(), STATS_EVERY_S))

    def stats_if_due(self, kv_cache_on, subscribers):
        """A `stats` event every STATS_EVERY_S; `subscribers()` says how many pages listen."""
        if self.clock.now() < self._next_stats:
            return
        now = self.clock.now()
        self._next_stats = now + STATS_EVERY_S
        sched, blocks = self.scheduler, self.scheduler.blocks
        busy = max([sched.slot_limit] + [i + 1 for i, s in enumerate(sched.slots) if s])
        self._emit(Stats(
            t=now, queue=len(sched.waiting), running=len(sched.running),
            waiting_ids=[s.id for s in list(sched.waiting)[:50]],
            # every slot up to the limit, plus any still busy above a lowered limit
            slots=[s.id if s else None for s in sched.slots[:busy]],
            cache_blocks_used=blocks.used, cache_blocks=blocks.block_budget,
            cache_tokens=sched.kv_tokens_in_use, cache_blocks_shared=blocks.shared,
            cache_blocks_cached=blocks.cached_free,
            block_tables={s.id: list(s.block_table) for s in sched.running if s.kv_cache},
            prefix_queries=blocks.queries, prefix_hits=blocks.hits, preemptions=sched.preemptions,
            prefill_cap=sched.prefill_cap,
            subscribers=subscribers(), blocked_on=sched.blocked_on(kv_cache_on), **self.stats.snapshot(now)))

    # ------------------------------------------------------------------ the forward
    def forward_started(self):
        self._forward_start = self.clock.now()

    def forward_ended(self):
        """The forward is done (the runner synchronised the device): its end, before any bookkeeping."""
        self._forward_end = self.clock.now()

    def forward_recorded(self, segments, first_shape, path=None):
        """Charge the forward that just ran over `segments` (their positions already marked
        computed, so the cache figures are after it): `prefill` events and prefill time for
        prompt work, each running request's later-token share, and the `step` event
        (`first_shape`: no forward of its shape had run in this process: engine/runner.py)."""
        t0, t1 = self._forward_start, self._forward_end
        prefill_tokens = decode_tokens = 0
        for seg in segments:
            seq = seg.seq
            if seg.decode:
                decode_tokens += seg.n      # its one token (its guesses too; KV cache off: all of them)
                continue
            prefill_tokens += seg.n
            if seq.first_delivered is None:       # the shared forward is each one's prefill time
                seq.prefill_start = seq.prefill_start if seq.prefill_start is not None else t0
                seq.prefill_s += t1 - t0
            self._emit(Prefill(t=t1, id=seq.id, start=t0, end=t1, pos=seg.start, tokens=seg.n, done=seg.logits))
        self._charge_later(segments, t1 - t0, prefill_tokens)
        self.scheduler.step_cost.observe(decode_tokens, prefill_tokens, t1 - t0)
        kind = "mixed" if prefill_tokens and decode_tokens else "decode" if decode_tokens else "prefill"
        read = path.weight_bytes if path else None
        predicted_s, bound = self.roofline.predict_segments(segments, read) if self.roofline else (None, None)
        spec = {g.seq.id: {"proposed": len(g.draft), "accepted": 0} for g in segments if g.draft}
        self._step = Step(t=t1, kind=kind, start=t0, end=t1, ids=[g.seq.id for g in segments],
                          predicted_s=predicted_s, bound=bound,
                          tokens=sum(g.n for g in segments), prefill_tokens=prefill_tokens,
                          decode_tokens=decode_tokens, kv_cache=segments[0].seq.kv_cache,
                          cache_tokens=self.scheduler.kv_tokens_in_use, cache_blocks_used=self.scheduler.blocks.used,
                          per_request={g.seq.id: g.start + g.n for g in segments}, spec=spec or None,
                          first_shape=first_shape, weights=path and path.weights,
                          kernel=path and path.kernel, weight_bytes=read)
        self._emit(self._step)

    def speculated(self, seg, accepted):
        """`accepted` of the segment's guesses were kept: its counts, and the step event's (still
        in the engine's hands until the step returns, so it goes out complete)."""
        seq = seg.seq
        seq.spec_drafts += 1
        seq.spec_draft_tokens += len(seg.draft)
        seq.spec_accepted += accepted
        self._step.spec[seq.id]["accepted"] = accepted

    def _charge_later(self, segments, forward_s, prefill_tokens):
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

    # ------------------------------------------------------------------ tokens
    def sampling_started(self):
        self._sampling = self.clock.now()

    def sampled(self):
        """Sampling is done: the time every token of this step was sampled."""
        self._sampled = self.clock.now()
        self._sample_s = self._sampled - self._sampling

    def token(self, seq, token_id, text, client_text, spec=None):
        """The `token` event for the token just appended to `seq.output_ids`, as it is handed out
        (emitted, and returned for the request's client); `client_text` is carried only where
        stop strings made it differ from the token's text; `spec`: what speculative decoding
        made of it (`speculate.kinds`)."""
        index = len(seq.output_ids) - 1
        ev = Token(t=self.clock.now(), id=seq.id, index=index, token_id=token_id, text=text,
                   first=index == 0, sampled=self._sampled, sample_s=self._sample_s,
                   client_text=None if client_text == text else client_text, spec=spec)
        self._emit(ev)
        return ev

    def delivered(self, seq):
        """The token reached its in-process consumer (if any): its first token's stages, or a
        later token's share of sampling, delivery and any preemption it recovered from."""
        delivered = self.clock.now()
        if len(seq.output_ids) == 1:
            seq.first_sampled, seq.first_sample_s, seq.first_delivered = self._sampled, self._sample_s, delivered
            self.stats.first_token(delivered - seq.arrival)   # the headline counts it now, not at the end
        else:
            if seq.recovering_since is not None:
                seq.later_preempted_s += self._sampling - seq.recovering_since
                seq.recovering_since = None
            # a later token of the same forward (speculation) shares its sampling; its delivery
            # starts when the previous one's ended
            again = seq.last_delivered >= self._sampled
            seq.later_sample_s += 0.0 if again else self._sample_s
            seq.later_delivery_s += delivered - (seq.last_delivered if again else self._sampled)
            if not again:   # one gap per forward that gave it tokens, as vLLM's inter-token latency
                self.stats.gap(delivered - seq.last_delivered)
        seq.last_delivered = delivered
        self.stats.token(delivered)

    def finished(self, seq, reason, error=None):
        """The `finished` event (emitted, and returned for the request's consumer), with its
        stages when it got a first token."""
        now = self.clock.now()
        ev = Finished(t=now, id=seq.id, reason=reason, source=seq.source, prompt_tokens=len(seq.prompt_ids),
                      output_tokens=len(seq.output_ids), e2e=now - seq.arrival, error=error,
                      cached_tokens=seq.cached_tokens, preemptions=seq.preemptions, spec_drafts=seq.spec_drafts,
                      spec_draft_tokens=seq.spec_draft_tokens, spec_accepted_tokens=seq.spec_accepted)
        if seq.first_delivered is not None:
            ev.ttft, ev.tpot, ev.stages, ev.later = seq.stage_summary()
            self.stats.finished += 1
            if reason in COMPLETED and self.targets is not None:
                ev.slo = self._judge(ev.ttft, ev.tpot)
                self.stats.slo(now, ev.slo["met"])
        self._emit(ev)
        return ev

    def _judge(self, ttft, tpot):
        """A completed request against the live SLO targets, by its own measured TTFT and TPOT
        (a one-token answer has no TPOT: only its TTFT is judged)."""
        ttft_target, tpot_target = self.targets.slo_ttft_ms / 1000, self.targets.slo_tpot_ms / 1000
        ttft_met, tpot_met = ttft <= ttft_target, tpot is None or tpot <= tpot_target
        return {"ttft_met": ttft_met, "tpot_met": tpot_met, "met": ttft_met and tpot_met,
                "ttft_target_s": ttft_target, "tpot_target_s": tpot_target}
