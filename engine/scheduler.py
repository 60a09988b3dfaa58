"""Who runs in the next forward, and how many of their tokens: the waiting queue, batch slots,
a per-step token budget and the KV blocks each scheduled token needs.

Policies (the `schedule` setting):
* `mixed` (default, as vLLM V1 and SGLang): every running request gets its next token (one
  for a decoding request, a chunk for one still prefilling), then waiting requests are
  admitted first-come first-served, until the step's token budget (`max_batched_tokens`)
  is spent. Decodes ride along with prefill chunks, so a long prompt never stops others
  streaming. With a step-time target (`max_step_ms`), prompt work in a step is further
  cut to what the forwards measured lately say fits beside its decode rows under the
  target (engine/stepcost.py): the streams' steps stay short, the prompt takes more steps.
* `prefill-first` (vLLM v0): while any prompt is waiting or unfinished, steps carry whole
  prompts only and running requests wait; then one decode step for everyone.
* `static` (before continuous batching): a batch is formed from the queue, run until every
  request in it has finished, and only then is the next batch admitted.

Blocks are allocated as tokens are written. When a step needs a block and none is free
(or the budget is spent), the most recently admitted running request is preempted: its
blocks are freed, its tokens kept, and it goes back to the front of the queue to be
recomputed (vLLM V1's recompute preemption). With prefix caching on, an admitted request
first takes the cached blocks that match its prompt and computes only the rest.
Requests with the KV cache on and off never share a step; after the setting flips, new
admissions wait for the running ones to drain.

Speculative decoding (the `speculation` setting): a decoding request's segment also carries
the proposer's guesses (engine/speculate.py), charged to the step's token budget like any
token (vLLM V1), never taking the one token each later decode of the step is owed, and only
as many as free blocks hold without preempting anyone. After verification (`accepted`) its
block table is cut back to the positions that hold accepted tokens: blocks emptied are freed.
Prefix hashes only ever name prompt blocks, so no guess is ever findable. Under a step-time
target the guesses count as decode rows (the step's output counts them so): they leave
less room for prompt work, and are never cut for it.
"""
from collections import deque
from dataclasses import dataclass, field

from .kv_cache import block_hashes
from .runner import Segment
from .settings import Policy
from .speculate import Speculator


@dataclass
class Schedule:
    segments: list = field(default_factory=list)    # this forward's work, decode rows first
    admitted: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    refused: list = field(default_factory=list)     # (seq, reason): can never fit the live budget


class Scheduler:
    def __init__(self, blocks, max_slots, step_cost, max_waiting=512):
        """`step_cost`: what forwards cost lately (engine/stepcost.py), which its owner feeds
        after every forward; the step-time target sizes prompt work by it."""
        self.blocks = blocks
        self.max_slots = max_slots
        self.slot_limit = max_slots     # live settings (`apply`)
        self.max_batched_tokens = 256
        self.policy = Policy.MIXED
        self.prefix_caching = True
        self.max_waiting = max_waiting
        self.waiting = deque()
        self.running = []               # admission order: the last is preempted first
        self.slots = [None] * max_slots
        self.preemptions = 0
        self.budget_left = 0            # of the last step's token budget
        self.max_step_s = None          # live: the step-time target (None: off)
        self.step_cost = step_cost
        self.prefill_cap = None         # prompt tokens the target allowed in the last mixed step
        self.speculator = Speculator()

    def reset_counters(self):
        """Zero the preemption count and forget the earlier outputs the suffix proposer learnt
        from (the engine's reset: a lesson run again starts from the same state)."""
        self.preemptions = 0
        self.speculator.forget()

    def apply(self, settings):
        """Take the settings that shape its steps (`SchedulingSettings`, from the engine's
        `apply_settings`), and the cache budget. Turning prefix caching off forgets every cached prefix."""
        s = settings
        self.slot_limit, self.max_batched_tokens = s.slots, s.max_batched_tokens
        self.policy = Policy(s.schedule)
        self.max_step_s = s.max_step_ms / 1000 or None
        if self.prefix_caching and not s.prefix_caching:
            self.blocks.forget_hashes()
        self.prefix_caching = s.prefix_caching
        self.blocks.block_budget = s.cache_tokens // self.blocks.block_size
        self.speculator.configure(s.speculation, s.spec_tokens)

    # ------------------------------------------------------------------ the step's plan
    def schedule(self, kv_cache_on):
        out = Schedule()
        budget = self.budget_left = self.max_batched_tokens
        if self.policy is Policy.PREFILL_FIRST:
            if any(not s.decoding for s in self.running) or self._admissible(kv_cache_on):
                budget = self._schedule_running(out, budget, only="prefill", whole=True)
                self._admit(out, budget, kv_cache_on, whole=True)
            else:
                self._schedule_running(out, budget, only="decode")
        else:
            admit = self.policy is Policy.MIXED or not self.running
            budget = self._schedule_running(out, budget, only="decode")
            decode_rows = sum(1 + len(s.draft) for s in out.segments)   # guesses cost as rows do
            budget = self._schedule_running(out, self._prefill_budget(budget, decode_rows), only="prefill")
            if admit:
                self._admit(out, budget, kv_cache_on, whole=False)
            self.budget_left = budget - sum(s.n for s in out.segments if s.seq in out.admitted)
        out.segments.sort(key=lambda s: not s.is_single_query)
        return out

    def _prefill_budget(self, budget, decode_rows):
        """The budget left for prompt work after `decode_rows` decodes: under a step-time target
        (mixed steps only), no more prompt tokens than the measured costs say fit beside them."""
        on = self.max_step_s is not None and self.policy is Policy.MIXED
        cap = self.step_cost.prefill_tokens(self.max_step_s, decode_rows) if on else None
        self.prefill_cap = cap     # one assignment: a reader on another thread never sees it half-done
        return budget if cap is None else min(budget, cap)

    def _schedule_running(self, out, budget, only, whole=False):
        """The next tokens of running requests whose next step is `only` ("decode" or "prefill"),
        oldest first, within the budget (`whole`: whole prompts); returns the budget left."""
        owed = sum(1 for s in self.running if s.decoding and s.kv_cache) if only == "decode" else 0
        for seq in list(self.running):
            if seq not in self.running or (only == "decode") != seq.decoding:
                continue
            if not seq.kv_cache:        # recompute everything; the budget counts the new token(s)
                out.segments.append(Segment(seq, 0, seq.num_tokens, cached=False, logits=True))
                budget -= 1 if seq.output_ids else seq.num_tokens
                continue
            remaining = seq.num_tokens - seq.num_computed
            n = remaining if whole else min(remaining, budget)
            if n <= 0:
                continue
            owed -= 1 if only == "decode" else 0
            draft = self._draft(seq, budget - n - owed) if only == "decode" else ()
            if not self._grow(seq, n + len(draft), out):
                continue                # it was preempted itself
            out.segments.append(Segment(seq, seq.num_computed, n + len(draft), cached=True,
                                        logits=seq.num_computed + n == seq.num_tokens, draft=draft))
            budget -= n + len(draft)
        return budget

    def _draft(self, seq, budget):
        """The proposer's guesses for a decoding request: within `budget` tokens, short of its
        max_new_tokens (the step emits one more than it guesses), and held by free blocks."""
        limit = min(budget, seq.params.max_new_tokens - len(seq.output_ids) - 1)
        draft = self.speculator.propose(seq, limit) if limit > 0 else []
        have = len(seq.block_table)
        while draft and not self.blocks.can_allocate(self.blocks.blocks_for(seq.num_tokens + len(draft)) - have):
            draft.pop()
        return tuple(draft)

    def _grow(self, seq, n, out):
        """Blocks for `seq`'s next `n` tokens, preempting the newest running requests if needed."""
        need = self.blocks.blocks_for(seq.num_computed + n) - len(seq.block_table)
        while need > 0 and not self.blocks.can_allocate(need):
            victim = self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            out.segments = [s for s in out.segments if s.seq is not victim]
            if victim is seq:
                return False
        if need > 0:
            seq.block_table += self.blocks.allocate(need)
        return True

    def _admissible(self, kv_cache_on):
        return bool(self.waiting) and self.blocked_on(kv_cache_on) is None

    def _admit(self, out, budget, kv_cache_on, whole):
        """First come, first served, while a slot and the blocks allow; nobody overtakes. Mixed
        steps admit while budget is left; `whole` prompts (prefill-first) fit the budget, or
        are the step's only work. Static batching admits a whole batch and chunks its prompts
        over the following steps."""
        static = self.policy is Policy.STATIC
        while self.waiting and len(self.running) < self.slot_limit:
            seq = self.waiting[0]
            if self.running and self.running[0].kv_cache != kv_cache_on:
                break                   # mode change: drain first
            if not static and budget <= 0:
                break
            reason = self.never_fits(seq) if kv_cache_on else None
            if reason:
                self.waiting.popleft()
                out.refused.append((seq, reason))
                continue
            if whole and out.segments and seq.num_tokens > budget:
                break
            n = self._place(seq, max(budget, 0), kv_cache_on, whole)
            if n is None:
                break                   # not enough free blocks: wait
            self.waiting.popleft()
            seq.kv_cache = kv_cache_on
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            self.running.append(seq)
            out.admitted.append(seq)
            if n:
                out.segments.append(Segment(seq, seq.num_computed, n, cached=kv_cache_on,
                                            logits=seq.num_computed + n == seq.num_tokens))
                budget -= n if kv_cache_on else seq.num_tokens

    def _place(self, seq, budget, kv_cache_on, whole):
        """Prefix hits and blocks for the admitted request's first chunk; its length, or None."""
        if not kv_cache_on:
            return seq.num_tokens
        cached = []
        if self.prefix_caching:
            cached = self.blocks.match(self._prefix_hashes(seq)) or []
        seq.num_computed = len(cached) * self.blocks.block_size
        remaining = seq.num_tokens - seq.num_computed
        n = remaining if whole else min(remaining, budget)
        need = self.blocks.blocks_for(seq.num_computed + n) - len(cached)
        # A preempted request comes back only when all it had fits again (plus its next token);
        # readmitted on a first chunk's worth it would be preempted again at once, and again.
        whole_need = self.blocks.blocks_for(seq.num_tokens + 1) - len(cached)
        fresh = None
        if not seq.preemptions or self.blocks.can_allocate(whole_need):
            fresh = self.blocks.allocate(need) if need > 0 else []
        if fresh is None:
            self.blocks.release(cached)
            seq.num_computed = 0
            return None
        seq.block_table = cached + fresh
        seq.admitted_cached = seq.num_computed
        if not seq.preemptions:     # counted once per request: its prompt, at its first admission
            seq.cached_tokens = seq.num_computed
            self.blocks.queries += seq.num_tokens
            self.blocks.hits += seq.num_computed
        return n

    # ------------------------------------------------------------------ after the forward
    def computed(self, seg):
        """Record a finished segment: its positions now hold keys/values; full prompt blocks
        become findable by later requests with the same prefix."""
        seq = seg.seq
        if not seg.cached:
            return
        before, seq.num_computed = seq.num_computed, seg.start + seg.n - len(seg.draft)   # guesses: `accepted`
        if self.prefix_caching:
            bs = self.blocks.block_size
            for i in range(before // bs, min(seq.num_computed, len(seq.prompt_ids)) // bs):
                self.blocks.register(seq.block_table[i], seq.block_hashes[i])

    def accepted(self, seg, n):
        """`n` of the segment's guesses were accepted: their positions hold keys/values of the
        request's tokens now; the rest are given back (blocks past the last such position freed)."""
        seq = seg.seq
        seq.num_computed += n
        keep = self.blocks.blocks_for(seq.num_computed)
        self.blocks.release(seq.block_table[keep:])
        del seq.block_table[keep:]

    def preempt(self, seq):
        """Free the request's blocks and slot; it waits at the front of the queue to be recomputed."""
        self._release(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def remove(self, seq):
        """The request is done (finished, cancelled, failed): free its slot and blocks."""
        self.speculator.finished(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self._release(seq)

    def _release(self, seq):
        self.blocks.release(seq.block_table)
        seq.block_table = []
        self.slots[seq.slot] = None
        seq.slot = None
        self.running.remove(seq)

    # ------------------------------------------------------------------ views
    def blocked_on(self, kv_cache_on):
        """Why the head of the queue is not admitted: "slot", "cache" (not enough free KV
        blocks), "drain" (the KV-cache mode changed), "batch" (static batching: the running
        batch must finish first), "budget" (the step's token budget went to others), or None."""
        if not self.waiting:
            return None
        if self.policy is Policy.STATIC and self.running:
            return "batch"
        if len(self.running) >= self.slot_limit:
            return "slot"
        if self.running and self.running[0].kv_cache != kv_cache_on:
            return "drain"
        if kv_cache_on and not self.blocks.can_allocate(self._first_chunk_blocks(self.waiting[0])):
            return "cache"
        if self.policy is Policy.MIXED and self.budget_left <= 0:
            return "budget"
        return None

    def _prefix_hashes(self, seq):
        """The hashes of the request's full prompt blocks that a prefix hit may cover: all but
        what would leave nothing to compute (its last token's logits are needed)."""
        if not seq.block_hashes:
            seq.block_hashes = block_hashes(seq.prompt_ids, self.blocks.block_size)
        return seq.block_hashes[:(seq.num_tokens - 1) // self.blocks.block_size]

    def _first_chunk_blocks(self, seq):
        """New blocks the request's first step would need (after any prefix hit)."""
        bs = self.blocks.block_size
        cached = self.blocks.peek(self._prefix_hashes(seq)) if self.prefix_caching else 0
        first = min(seq.num_tokens - cached * bs, self.max_batched_tokens)
        return self.blocks.blocks_for(cached * bs + first) - cached

    def never_fits(self, seq):
        """Why the request can never be held by the KV cache's live block budget, or None: the
        one rule for refusing it (at intake, and when a lowered budget leaves it waiting)."""
        need = len(seq.prompt_ids) + seq.params.max_new_tokens
        if self.blocks.blocks_for(need) > self.blocks.block_budget:
            return (f"needs {need} tokens of KV cache; the cache budget is "
                    f"{self.blocks.block_budget * self.blocks.block_size} tokens")
        return None

    @property
    def kv_tokens_in_use(self):
        """Positions whose keys/values are held in the cache by running requests."""
        return sum(s.num_computed for s in self.running if s.kv_cache)

