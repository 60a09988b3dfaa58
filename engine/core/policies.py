"""The scheduler's policies (the `schedule` setting): how one step is filled.

A policy is an object that answers the questions below, given the scheduler `s`
(engine/core/scheduler.py), whose steps it composes from three moves: `s.decode` (every decoding request's next token, and its
guesses), `s.prefill` (running requests' prompt work) and `s.admit` (waiting requests, in the
order of the scheduler's request queue, engine/core/queues.py). Each move takes the token budget left and returns what it leaves.

* `plan(s, out, kv_cache_on)`: fill the step's Schedule `out`; return the budget left.
* `chunk_limit(budget)`: the most prompt tokens of one request a step computes.
* `admits_past_budget`: whether requests still join once the step's budget is spent (their
  first chunk waits for a later step).
* `admits(out, seq, budget)`: whether the head of the queue, which can fit the cache, may
  join this step.
* `blocked(s, why)`: what the head of the queue waits for (`Blocked`), given the reason every
  policy shares (`why`: a slot, a drain, free blocks, or None).
"""
from enum import Enum
import math

from ..settings import Policy


class Blocked(str, Enum):
    """What the head of the queue waits for (`stats.blocked_on`; the wire carries the value)."""
    SLOT = "slot"       # every batch slot is taken
    CACHE = "cache"     # not enough free KV blocks for its first step
    DRAIN = "drain"     # the KV-cache setting flipped: the running requests finish first
    BATCH = "batch"     # static batching: the running batch must finish first
    BUDGET = "budget"   # the step's token budget went to others


class SchedulingPolicy:
    """The defaults: prompts are computed in chunks of what the budget leaves, and the queue's
    head joins while budget is left."""
    admits_past_budget = False

    def plan(self, s, out, kv_cache_on):
        raise NotImplementedError

    def chunk_limit(self, budget):
        return max(budget, 0)

    def admits(self, out, seq, budget):
        return True

    def blocked(self, s, why):
        return why


class Mixed(SchedulingPolicy):
    """Continuous batching with mixed steps (the default, as vLLM V1 and SGLang): every running
    request gets its next token (a decoding one its one token, a prompt still being computed
    its next chunk), then waiting requests are admitted while budget is left. Decodes ride
    along with prompt chunks, so a long prompt never stops others streaming.

    With a step-time target (`max_step_ms`), prompt work is further cut to what the forwards
    measured lately say fits beside the step's decode rows under the target
    (engine/timing/stepcost.py): the streams' steps stay short, the prompt takes more steps. Guesses
    count as decode rows (the step recorder measures them so), and are never cut for it."""

    def plan(self, s, out, kv_cache_on):
        budget = s.decode(out, s.max_batched_tokens)
        if s.max_step_s is not None:
            rows = sum(1 + len(g.draft) for g in out.segments)    # guesses cost as rows do
            out.prefill_cap = s.step_cost.prefill_tokens(s.max_step_s, rows)
        if out.prefill_cap is not None:
            budget = min(budget, out.prefill_cap)
        return s.admit(out, s.prefill(out, budget), kv_cache_on)

    def blocked(self, s, why):
        return why or (Blocked.BUDGET if s.budget_left <= 0 else None)


class PrefillFirst(SchedulingPolicy):
    """vLLM v0: while any prompt is waiting or unfinished, steps carry whole prompts only (as
    many as fit the budget, at least one) and running requests wait; then one decode step for
    everyone."""

    def plan(self, s, out, kv_cache_on):
        if any(not seq.decoding for seq in s.running) or s.can_admit(kv_cache_on):
            return s.admit(out, s.prefill(out, s.max_batched_tokens), kv_cache_on)
        return s.decode(out, s.max_batched_tokens)

    def chunk_limit(self, budget):
        return math.inf

    def admits(self, out, seq, budget):
        return not out.segments or seq.num_tokens <= budget   # a whole prompt, or the step's only work


class Static(SchedulingPolicy):
    """Before continuous batching: a batch is formed from the queue when nothing runs, and run
    until every request in it has finished. Its prompts are chunked over the following steps
    (the budget cuts the first chunks; it admits no fewer)."""
    admits_past_budget = True

    def plan(self, s, out, kv_cache_on):
        if not s.running:
            return s.admit(out, s.max_batched_tokens, kv_cache_on)
        return s.prefill(out, s.decode(out, s.max_batched_tokens))

    def blocked(self, s, why):
        return Blocked.BATCH if s.running else why


BY_SETTING = {Policy.MIXED: Mixed(), Policy.PREFILL_FIRST: PrefillFirst(), Policy.STATIC: Static()}
