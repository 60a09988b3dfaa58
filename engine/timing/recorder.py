"""The step recorder: what each request is charged, and the events that carry those figures.

`Engine.step()` does the work (schedule, forward, sample, hand out, finish) and reads the
clock at its fixed points into a `StepOutput` (engine/core/step_output.py). The recorder reads
that once per step (`record`) and turns it, in the order things happened, into each
request's stage accounting (a `RequestTimes`, engine/timing/request_times.py, kept from its
admission to its end), the rolling stats, and the `preempted`, `admitted`, `stats`,
`prefill`, `step`, `token` and `finished` events. It is never called from inside a step and
never changes an event it has returned.

It is also the one writer of a request's own output: each `token`, `finished` and `rejected` event
goes to the request's client (its RequestHandle) from here, as the events are made (`to_client`).

Where a connector moves requests between engines (engine/core/connector.py), the record travels
with the request (`Sequence.times`): an engine the request leaves notes when (`left`: it waits
from then, as after a preemption, until the next engine admits it), the next one adds its own
wait, the copy of its keys and values (`transfer`, with a `kv_transfer` event) and the rest.
Each recorder names its engine's instance in the events it makes; every engine of one server
reads one clock, so the stages of one request add up.
"""
from collections import deque

from ..events import Admitted, Finished, KVTransfer, Preempted, Prefill, Stats, Step
from .request_times import RequestTimes
from .stats import RollingStats
from ..core.step_output import Ended, Refused

STATS_EVERY_S = 0.5
COMPLETED = ("stop", "stop_string", "length")   # finish reasons judged against the SLOs (not cancels, errors)


def stats_view(sched, kv_cache_on, subscribers, now):
    """The queue and the cache as a `stats` event at `now` shows them (its fields other than
    the rolling figures); `subscribers`: how many pages listen."""
    blocks = sched.blocks
    busy = max([sched.slot_limit] + [i + 1 for i, s in enumerate(sched.slots) if s])
    return dict(
        t=now, queue=len(sched.waiting), running=len(sched.running),
        waiting_ids=[s.id for s in list(sched.waiting)[:50]],
        # every slot up to the limit, plus any still busy above a lowered limit
        slots=[s.id if s else None for s in sched.slots[:busy]],
        cache_blocks_used=blocks.used, cache_blocks=blocks.block_budget,
        cache_tokens=sched.kv_tokens_in_use, cache_blocks_shared=blocks.shared,
        cache_blocks_cached=blocks.cached_free,
        block_tables={s.id: list(s.block_table) for s in sched.running if s.kv_cache},
        prefix_queries=blocks.queries, prefix_hits=blocks.hits, preemptions=sched.preemptions,
        prefill_cap=sched.prefill_cap, subscribers=subscribers, blocked_on=sched.blocked_on(kv_cache_on))



class StepRecorder:
    def __init__(self, clock, roofline=None):
        """`roofline`: predicts each forward's time (engine/timing/roofline.py), carried in `step` events."""
        self.clock = clock
        self.roofline = roofline
        self.instance = None           # the engine's instance name (its connector's), carried in its events
        # What completed requests are judged by (settings.Targets), handed in by the engine
        # whenever its settings change; None: nobody is judged.
        self.targets = None
        self.stats = RollingStats(started=clock.now())
        self.loads = deque(maxlen=8)   # (start, end) of the latest model loads (engine/model/reload.py)
        self._next_stats = 0.0

    def reset(self):
        """Start the rolling stats afresh (the engine's reset)."""
        self.stats = RollingStats(started=self.clock.now())

    def model_loaded(self, start, end):
        """The model was (re)loaded from `start` to `end`: requests waiting then are charged it."""
        self.loads.append((start, end))

    def stats_due(self, now):
        """Whether a step scheduled at `now` carries a `stats` event (one every STATS_EVERY_S)."""
        return now >= self._next_stats

    def idle_timeout(self):
        """How long until the next `stats` event is due (at most STATS_EVERY_S)."""
        return max(0.0, min(self._next_stats - self.clock.now(), STATS_EVERY_S))

    # ------------------------------------------------------------------ the one entry
    def record(self, out):
        """A step's outcome (or a command's: only requests ended) as its events, in the order
        they happened: scheduling's, the forward's, each token handed out, then each end."""
        events = []
        if out.scheduled is not None:
            events += [self._preempted(p, out.scheduled) for p in out.preempted]
            events += [self._end(e) for e in out.refused]
            events += [self._admitted(p, out.scheduled) for p in out.admitted]
            if out.stats is not None:
                self._next_stats = out.stats["t"] + STATS_EVERY_S
                events.append(Stats(**out.stats, **self.stats.snapshot(out.stats["t"]), instance=self.instance))
        events += [self._loaded(m) for m in out.loaded]
        if out.forward is not None:
            events += self._forward(out)
        for handed in out.tokens:
            to_client(handed.seq, handed.event)
            self._delivered(handed, out.sampling, self.clock.now())
            events.append(handed.event)
        for seq in out.left:
            self._times_of(seq).queued_at = out.forward[1]   # it waits from then, for the next engine
        events += [self._end(e) for e in out.ended]
        return events

    def _times_of(self, seq):
        if seq.times is None:
            seq.times = RequestTimes(seq.arrival, seq.tokenize_end, queued_at=seq.arrival)
        return seq.times

    def _loaded(self, m):
        """Its keys and values were copied in through the connector before the forward: the
        `transfer` stage, and the `kv_transfer` event."""
        self._times_of(m.seq).transfer_s += m.end - m.start
        return KVTransfer(t=m.end, id=m.seq.id, start=m.start, end=m.end, tokens=m.tokens, bytes=m.bytes,
                          src_blocks=m.src_blocks, dst_blocks=m.dst_blocks)

    # ------------------------------------------------------------------ scheduling
    def _preempted(self, placed, now):
        """Preempted at `now`: a request past its first token is recovering until its next one."""
        times = self._times_of(placed.seq)
        times.queued_at, times.preempted = now, True
        if times.first_delivered is not None and times.recovering_since is None:
            times.recovering_since = now
        return Preempted(t=now, id=placed.seq.id, tokens=placed.tokens, preemptions=placed.preemptions,
                         instance=self.instance)

    def _admitted(self, placed, now):
        """Took a slot at `now`: how long it waited since it last joined the queue (its arrival, a
        preemption, or leaving an engine before this one); a wait before its first token other than
        its first is its queue stage too."""
        seq, times = placed.seq, self._times_of(placed.seq)
        resumed, waited = times.preempted, now - times.queued_at
        if times.admitted is None:      # the part of its wait the model was loading: its `load` stage
            times.load_s = sum(max(0.0, min(e, now) - max(s, times.tokenize_end)) for s, e in self.loads)
            times.admitted = now
        elif times.first_delivered is None:
            times.requeue_s += waited
        times.preempted = False
        return Admitted(t=now, id=seq.id, slot=placed.slot, queue_s=waited, blocks=placed.blocks,
                        prompt_tokens=placed.tokens, cached_tokens=placed.cached_tokens, resumed=resumed,
                        instance=self.instance)

    # ------------------------------------------------------------------ the forward
    def _forward(self, out):
        """Charge the forward: `prefill` events and prefill time for prompt work, each running
        request's later-token share, its guesses' counts, and the `step` event (the cache
        figures as the forward left them, the guesses kept as sampling found them)."""
        (t0, t1), segments = out.forward, out.segments
        events = []
        for seg in segments:
            if seg.decode:
                continue
            times = self._times_of(seg.seq)
            if times.first_delivered is None:       # the shared forward is each one's prefill time
                times.prefill_start = times.prefill_start if times.prefill_start is not None else t0
                times.prefill_s += t1 - t0
            events.append(Prefill(t=t1, id=seg.seq.id, start=t0, end=t1, pos=seg.start, tokens=seg.n,
                                  done=seg.logits or (not seg.seq.output_ids and seg.start + seg.n == len(seg.seq.prompt_ids)),
                                  instance=self.instance))
        decode_tokens, prefill_tokens = out.work()
        self._charge_later(out.running, segments, t1 - t0, prefill_tokens)
        spec = {}
        for seg in segments:
            if seg.draft:
                spec[seg.seq.id] = {"proposed": len(seg.draft), "accepted": out.accepted.get(seg.seq.id, 0)}
                self._speculated(seg, out.accepted)
        path = out.path
        read = path.weight_bytes if path else None
        predicted_s, bound = self.roofline.predict_segments(segments, read) if self.roofline else (None, None)
        kind = "mixed" if prefill_tokens and decode_tokens else "decode" if decode_tokens else "prefill"
        events.append(Step(t=t1, kind=kind, start=t0, end=t1, ids=[g.seq.id for g in segments],
                           predicted_s=predicted_s, bound=bound,
                           tokens=decode_tokens + prefill_tokens, prefill_tokens=prefill_tokens,
                           decode_tokens=decode_tokens, kv_cache=segments[0].seq.kv_cache,
                           cache_tokens=out.cache[0], cache_blocks_used=out.cache[1],
                           per_request={g.seq.id: g.start + g.n for g in segments}, spec=spec or None,
                           first_shape=out.first_shape, weights=path and path.weights,
                           kernel=path and path.kernel, weight_bytes=read, instance=self.instance))
        return events

    def _speculated(self, seg, accepted):
        """The segment's guesses were verified (if its sampling did not fail): its counts."""
        if seg.seq.id in accepted:
            times = self._times_of(seg.seq)
            times.spec_drafts += 1
            times.spec_draft_tokens += len(seg.draft)
            times.spec_accepted += accepted[seg.seq.id]

    def _charge_later(self, running, segments, forward_s, prefill_tokens):
        """Charge this forward to every running request past its first token: to `decode` or
        `mixed` (other requests' prompt chunks shared the forward) if it was in the forward, to
        `stalled` if it waited outside it. A request recovering from preemption is charged as a
        whole when its next token comes (`_delivered`)."""
        inside = {seg.seq.id for seg in segments}
        for seq in running:
            times = seq.times
            if times is None or times.first_delivered is None or times.recovering_since is not None:
                continue
            if seq.id not in inside:
                times.later_stalled_s += forward_s
            elif prefill_tokens:
                times.later_mixed_s += forward_s
            else:
                times.later_decode_s += forward_s

    # ------------------------------------------------------------------ tokens
    def _delivered(self, handed, sampling, delivered):
        """A token reached its client by `delivered`: its first token's stages, or a later token's
        share of sampling, delivery and any preemption it recovered from."""
        times = self._times_of(handed.seq)
        (sampling_start, sampled), sample_s = sampling, sampling[1] - sampling[0]
        if handed.event.first:
            times.first_sampled, times.first_sample_s, times.first_delivered = sampled, sample_s, delivered
            self.stats.first_token(delivered - times.arrival)   # the headline counts it now, not at the end
        else:
            if times.recovering_since is not None:
                times.later_preempted_s += sampling_start - times.recovering_since
                times.recovering_since = None
            # a later token of the same forward (speculation) shares its sampling; its delivery
            # starts when the previous one's ended
            again = times.last_delivered >= sampled
            times.later_sample_s += 0.0 if again else sample_s
            times.later_delivery_s += delivered - (times.last_delivered if again else sampled)
            if not again:   # one gap per forward that gave it tokens, as vLLM's inter-token latency
                self.stats.gap(delivered - times.last_delivered)
        times.last_delivered = delivered
        self.stats.token(delivered)

    # ------------------------------------------------------------------ ends
    def _end(self, end):
        """The event of an end: a request's `finished` (handed to its client too), or an event
        the engine made (`error`, `rejected`) passed on; the request's record is dropped."""
        if isinstance(end, Ended):
            ev = self._finished(end, end.seq.times)
            to_client(end.seq, ev)
            return ev
        if isinstance(end, Refused):    # before its first token (it may have been admitted)
            to_client(end.seq, end.event)
            return end.event
        return end

    def _finished(self, end, times):
        """The `finished` event, with its stages when it got a first token."""
        seq, now = end.seq, end.t
        common = dict(t=now, id=seq.id, reason=end.reason, source=seq.source, prompt_tokens=len(seq.prompt_ids),
                      output_tokens=len(seq.output_ids), e2e=now - seq.arrival, error=end.error,
                      cached_tokens=seq.cached_tokens, preemptions=seq.preemptions,
                      spec_drafts=times.spec_drafts if times else 0,
                      spec_draft_tokens=times.spec_draft_tokens if times else 0,
                      spec_accepted_tokens=times.spec_accepted if times else 0)
        if times is None or times.first_delivered is None:
            return Finished(**common)
        ttft, tpot, stages, later = times.stage_summary(len(seq.output_ids))
        self.stats.finished += 1
        slo = None
        if end.reason in COMPLETED and self.targets is not None:
            slo = self._judge(ttft, tpot)
            self.stats.slo(now, slo["met"])
        return Finished(**common, ttft=ttft, tpot=tpot, stages=stages, later=later, slo=slo)

    def _judge(self, ttft, tpot):
        """A completed request against the SLO targets, by its own measured TTFT and TPOT (a
        one-token answer has no TPOT: only its TTFT is judged)."""
        ttft_target, tpot_target = self.targets.slo_ttft_ms / 1000, self.targets.slo_tpot_ms / 1000
        ttft_met, tpot_met = ttft <= ttft_target, tpot is None or tpot <= tpot_target
        return {"ttft_met": ttft_met, "tpot_met": tpot_met, "met": ttft_met and tpot_met,
                "ttft_target_s": ttft_target, "tpot_target_s": tpot_target}


def to_client(seq, event):
    """The one place a request's own event (token, finished, rejected) is written to its client:
    its RequestHandle, which keeps it for a streaming client (none: a request taken over from
    another process, whose client is that process's)."""
    if seq.handle is not None:
        seq.handle.put(event)
