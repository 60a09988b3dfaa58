"""Who runs in the next forward, and how many of their tokens: the waiting queue, batch slots,
a per-step token budget, and the policy that fills each step from them (engine/core/policies.py:
mixed, prefill-first, static). Which KV blocks each request holds is the block manager's
(engine/core/block_manager.py); the scheduler asks it whether blocks are there and decides who
runs, who waits and who is preempted.

It owns its queue: requests come in through `add`, wait in a request queue whose order is the
queue policy's (engine/core/queues.py: first come, first served by default), and leave through
`finish` (done, cancelled, failed, refused, or gone on to another engine), the one way out.

A step's moves, in the order a policy composes them: `decode` (every decoding request's next
token), `prefill` (running requests' prompt work, in chunks the policy sets), `admit`
(waiting requests, in the queue's order, nobody overtaking its head). Each spends the step's token
budget (`max_batched_tokens`) and returns what is left.

Blocks are taken as tokens are written. When a step needs a block and none is free within the
budget, a running request is preempted, the one the queue's policy names (first come, first
served: the most recently admitted): its blocks are freed, its tokens kept, and it goes back to
the queue (first come, first served: its front) to be recomputed (vLLM V1's recompute preemption). Requests with the KV cache on and off never
share a step; after the setting flips, new admissions wait for the running ones to drain.

Speculative decoding (the `speculation` setting): a decoding request's segment also carries
the proposer's guesses (engine/model/speculate.py), charged to the step's token budget like any
token (vLLM V1), never taking the one token each later decode of the step is owed, and only
as many as its blocks and free ones hold without preempting anyone. Under a step-time
target the guesses count as decode rows (the step's output counts them so): they leave
less room for prompt work, and are never cut for it.
"""
from dataclasses import dataclass, field

from .connector import KVConnector
from .policies import BY_SETTING, Blocked
from .queues import MAX_WAITING, create_request_queue
from ..model.runner import Segment
from .sequence import Status
from ..settings import Policy
from ..model.speculate import Speculator


@dataclass
class Schedule:
    segments: list = field(default_factory=list)    # this forward's work, decode rows first
    admitted: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    refused: list = field(default_factory=list)     # (seq, reason): can never fit the live budget
    prefill_cap: int | None = None  # prompt tokens the step-time target allowed (None: no target)


class Scheduler:
    def __init__(self, blocks, max_slots, step_cost, max_waiting=MAX_WAITING, connector=None):
        """`step_cost`: what forwards cost lately (engine/timing/stepcost.py), which its owner feeds
        after every forward; the step-time target sizes prompt work by it. `connector`: the
        engine's (engine/core/connector.py), asked at admissions and ends."""
        self.connector = connector or KVConnector()
        self.blocks = blocks            # engine/core/block_manager.py's BlockManager
        self.max_slots = max_slots
        self.slot_limit = max_slots     # live settings (`apply`)
        self.max_batched_tokens = 256
        self.policy = BY_SETTING[Policy.MIXED]
        self.max_waiting = max_waiting
        self.queue_policy = "fcfs"      # live: the `scheduling_policy` setting (engine/core/queues.py)
        self.waiting = create_request_queue(self.queue_policy)
        self.running = []               # admission order
        self.slots = [None] * max_slots
        self.preemptions = 0
        self.budget_left = 0            # of the last step's token budget
        self.max_step_s = None          # live: the step-time target (None: off)
        self.step_cost = step_cost
        self.prefill_cap = None         # the last step's Schedule.prefill_cap
        self.speculator = Speculator()

    def reset_counters(self):
        """Zero the preemption and prefix-cache counts, forget the earlier outputs the suffix
        proposer learnt from, and, every block being free, their prefixes too (vLLM's
        reset_prefix_cache): the engine's reset, so a lesson run again starts from the same state."""
        self.preemptions = 0
        self.speculator.forget()
        self.blocks.reset_counters()
        self.blocks.forget_hashes()

    def apply(self, settings):
        """Take the settings that shape its steps (`SchedulingSettings`, from the engine's
        `apply_settings`), and the block manager's (prefix caching, the cache budget)."""
        s = settings
        self.slot_limit, self.max_batched_tokens = s.slots, s.max_batched_tokens
        self.policy = BY_SETTING[Policy(s.schedule)]
        if s.scheduling_policy != self.queue_policy:    # who waits keeps waiting, in the new order
            self.queue_policy, self.waiting = s.scheduling_policy, create_request_queue(s.scheduling_policy, self.waiting)
        self.max_step_s = s.max_step_ms / 1000 or None
        self.blocks.configure(s.prefix_caching, s.cache_tokens)
        self.speculator.configure(s.speculation, s.spec_tokens)

    # ------------------------------------------------------------------ the step's plan
    def schedule(self, kv_cache_on):
        """The next forward's work under the live policy, with its admissions, preemptions and
        refusals."""
        out = Schedule()
        self.budget_left = self.policy.plan(self, out, kv_cache_on)
        self.prefill_cap = out.prefill_cap     # one assignment: a reader on another thread never sees it half-done
        out.segments.sort(key=lambda s: not s.is_single_query)
        return out

    def decode(self, out, budget):
        """The next token of every running request that decodes, oldest first, with the
        proposer's guesses, within the budget; returns the budget left."""
        owed = sum(1 for s in self.running if s.decoding and s.kv_cache)   # guesses never take these
        for seq in self._running(decoding=True):
            if not seq.kv_cache:
                budget -= self._recompute(out, seq)
            elif budget > 0:
                owed -= 1
                draft = self._draft(seq, budget - 1 - owed)
                if self._grow(out, seq, 1 + len(draft)):
                    self._segment(out, seq, 1, draft)
                    budget -= 1 + len(draft)
        return budget

    def prefill(self, out, budget):
        """The next chunk of every running request still computing its prompt (or everything
        again, after a preemption), oldest first, as large as the policy allows (engine/core/policies.py
        `chunk_limit`); returns the budget left."""
        for seq in self._running(decoding=False):
            if not seq.kv_cache:
                budget -= self._recompute(out, seq)
                continue
            n = min(seq.num_tokens - seq.num_computed, self.policy.chunk_limit(budget))
            if n > 0 and self._grow(out, seq, n):
                self._segment(out, seq, n)
                budget -= n
        return budget

    def _refuse(self, out, seq, reason):
        """A waiting request the cache budget can never hold leaves, refused."""
        self.finish(seq)
        out.refused.append((seq, reason))

    def admit(self, out, budget, kv_cache_on):
        """Waiting requests in the queue's order, while a slot and the blocks allow and the policy
        lets the head join; nobody overtakes it. Keys and values the connector has for a prompt
        (`external_tokens`) are allocated blocks as a prefix hit is, and loaded before the
        forward. Returns the budget left."""
        while self.waiting and len(self.running) < self.slot_limit:
            seq = self.waiting.peek()
            if self.running and self.running[0].kv_cache != kv_cache_on:
                break                   # mode change: drain first
            if budget <= 0 and not self.policy.admits_past_budget:
                break
            reason = self.blocks.never_fits(seq) if kv_cache_on else None
            if reason:
                self._refuse(out, seq, reason)
                continue
            if not self.policy.admits(out, seq, budget):
                break
            external = self.connector.external_tokens(seq) if kv_cache_on else 0
            limit = self.policy.chunk_limit(budget)
            n = self.blocks.allocate(seq, limit, external) if kv_cache_on else seq.num_tokens
            if n is None:
                break                   # not enough free blocks: wait
            if kv_cache_on:
                self.connector.allocated(seq)
            self.waiting.remove(seq)
            seq.kv_cache, seq.status = kv_cache_on, Status.RUNNING
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            self.running.append(seq)
            out.admitted.append(seq)
            if n:
                self._segment(out, seq, n)
                budget -= n
        return budget

    def can_admit(self, kv_cache_on):
        """Whether the head of the queue could be admitted now."""
        return bool(self.waiting) and self.blocked_on(kv_cache_on) is None

    def _running(self, decoding):
        """Running requests whose next step is (or is not) a decode, oldest first; one preempted
        by an earlier request's blocks in this step is passed over."""
        for seq in list(self.running):
            if seq.status is Status.RUNNING and seq.decoding == decoding:
                yield seq

    def _segment(self, out, seq, n, draft=()):
        """The request's next `n` tokens (and its guesses) in this forward."""
        out.segments.append(Segment(seq, seq.num_computed, n + len(draft), cached=seq.kv_cache,
                                    logits=self.connector.samples and seq.num_computed + n == seq.num_tokens,
                                    draft=draft))

    def _recompute(self, out, seq):
        """KV cache off: the whole sequence again. Returns its cost to the budget: its new tokens."""
        self._segment(out, seq, seq.num_tokens)
        return 1 if seq.output_ids else seq.num_tokens

    def _draft(self, seq, budget):
        """The proposer's guesses for a decoding request: within `budget` tokens, short of its
        max_new_tokens (the step emits one more than it guesses), and held by blocks without
        preempting anyone. Over a just-lowered cache budget it guesses nothing: the next block
        anyone needs preempts someone already."""
        limit = min(budget, seq.params.max_new_tokens - len(seq.output_ids) - 1)
        draft = self.speculator.propose(seq, limit) if limit > 0 else []
        while draft and (self.blocks.over_budget or not self.blocks.can_append(seq, 1 + len(draft))):
            draft.pop()
        return tuple(draft)

    def _grow(self, out, seq, n):
        """Blocks for the request's next `n` tokens, preempting the newest running requests
        while they are not free; False if it was preempted itself."""
        while not self.blocks.can_append(seq, n):
            victim = self.waiting.victim(self.running)
            self.preempt(victim)
            out.preempted.append(victim)
            out.segments = [s for s in out.segments if s.seq is not victim]
            if victim is seq:
                return False
        self.blocks.may_append(seq, n)
        return True

    # ------------------------------------------------------------------ after the forward
    def computed(self, segments):
        """The forward ran: each segment's positions hold keys and values now (their full prompt
        blocks become findable; a speculating one's guesses wait for `accepted`)."""
        for seg in segments:
            self.blocks.computed(seg)

    def accepted(self, seg, n):
        """`n` of the segment's guesses were accepted; the rest's positions are given back."""
        self.blocks.accepted(seg, n)

    # ------------------------------------------------------------------ leaving
    def add(self, seq):
        """A new request joins the queue."""
        self.waiting.add(seq)

    def preempt(self, seq):
        """Free the request's blocks and slot; it waits in the queue to be recomputed."""
        self._release(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.prepend(seq)

    def finish(self, seq):
        """The request is done here (finished, cancelled, failed, refused, or gone on to another
        engine): out of the queue or its slot, its blocks given back unless the connector keeps
        them (`finished`: a delayed free, the connector frees them later)."""
        self.speculator.finished(seq)
        if seq.status is Status.RUNNING:
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if not self.connector.finished(seq):
            self.blocks.free(seq)
        seq.status = Status.FINISHED

    def _release(self, seq):
        self.slots[seq.slot] = None
        seq.slot = None
        self.running.remove(seq)

    # ------------------------------------------------------------------ views
    def blocked_on(self, kv_cache_on):
        """What the head of the queue waits for (`Blocked`), or None when nothing waits or it
        could be admitted; the policy has the last word (static: the running batch; mixed: the
        step's budget)."""
        if not self.waiting:
            return None
        head, why = self.waiting.peek(), None
        if len(self.running) >= self.slot_limit:
            why = Blocked.SLOT
        elif self.running and self.running[0].kv_cache != kv_cache_on:
            why = Blocked.DRAIN
        elif kv_cache_on and not self.blocks.can_allocate(head, self.max_batched_tokens,
                                                          self.connector.external_tokens(head)):
            why = Blocked.CACHE
        return self.policy.blocked(self, why)

    @property
    def kv_tokens_in_use(self):
        """Positions whose keys/values are held in the cache by running requests."""
        return sum(s.num_computed for s in self.running if s.kv_cache)
