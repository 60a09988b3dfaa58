"""Which KV blocks each request holds (nano-vllm's BlockManager, on sequences): its block table
from admission to the end, prefix-cache hits, and the counters `stats` reports.

A request's block table holds its positions 0..bs-1, bs..2bs-1, ... in order. Blocks are
taken as tokens are written, never reserved up front for max_new_tokens: at admission the
cached blocks matching its prompt and fresh ones for its first step (`allocate`), then the
blocks for each step's next tokens (`may_append`), all given back when it finishes or is
preempted (`free`). Whom to preempt when blocks run out is the scheduler's decision; this
module only answers whether they are there (`can_allocate`, `can_append`).

Prefix caching: a full prompt block's chained hash (engine/core/kv_cache.py) names its contents.
Once the block's last position is computed its name is registered (`computed`), and a later
request whose prompt starts with the same blocks takes them instead of computing them. Names
are given to prompt blocks only, so speculative guesses are never findable; after
verification the block table is cut back to the positions holding accepted tokens
(`accepted`).
"""
from .kv_cache import block_hashes


def _pool_figure(name):
    return property(lambda self: getattr(self.pool, name), doc=f"The pool's `{name}`.")


class BlockManager:
    def __init__(self, pool):
        self.pool = pool                # engine/core/kv_cache.py's BlockPool: the blocks by number
        self.block_size = pool.block_size
        self.capacity = pool.capacity
        self.prefix_caching = True      # live setting (`configure`)
        self.queries = 0                # prompt tokens looked up in the prefix cache
        self.hits = 0                   # ... of which found

    def configure(self, prefix_caching, cache_tokens):
        """Take the live settings: prefix caching on or off (off forgets every cached prefix),
        and the cache budget in tokens (the most blocks in use at once)."""
        if self.prefix_caching and not prefix_caching:
            self.pool.forget_hashes()
        self.prefix_caching = prefix_caching
        self.pool.block_budget = cache_tokens // self.block_size

    def reset_counters(self):
        """Zero the prefix-cache query and hit counts (the engine's reset)."""
        self.queries = self.hits = 0

    def forget_hashes(self):
        """Drop every cached prefix (the engine's reset: a lesson run again starts empty)."""
        self.pool.forget_hashes()

    # the pool's figures that `stats` and `step` events report
    used = _pool_figure("used")
    block_budget = _pool_figure("block_budget")
    shared = _pool_figure("shared")
    cached_free = _pool_figure("cached_free")

    # ------------------------------------------------------------------ admission
    def never_fits(self, seq):
        """Why the request can never be held by the live block budget, or None: the one rule for
        refusing it (at intake, and when a lowered budget leaves it waiting)."""
        need = len(seq.prompt_ids) + seq.params.max_new_tokens
        if self.pool.blocks_for(need) > self.pool.block_budget:
            return (f"needs {need} tokens of KV cache; the cache budget is "
                    f"{self.pool.block_budget * self.block_size} tokens")
        return None

    def can_allocate(self, seq, limit, external=0):
        """Whether the fresh blocks for the request's first step (at most `limit` tokens after
        any prefix hit, or after the `external` positions whose keys and values its connector
        loads) are free now; nothing is taken."""
        bs = self.block_size
        cached = self.pool.peek(self._prefix_hashes(seq)) if self.prefix_caching and not external else 0
        done = cached * bs or external
        first = min(seq.num_tokens - done, limit)
        return self.pool.can_allocate(self.pool.blocks_for(done + first) - cached)

    def allocate(self, seq, limit, external=0):
        """Give the admitted request the cached blocks that match its prompt, then fresh ones for
        its first step's tokens (at most `limit`): how many tokens that step computes, or None
        (nothing taken) when the blocks are not free. With `external` positions whose keys and
        values its connector loads (engine/core/connector.py), no prefix is looked up: fresh
        blocks hold those too, counted computed (as vLLM's decode instance reads every remote
        block it is told of), and they are no prefix hit."""
        cached = self._match(seq) if not external else []
        seq.num_computed = len(cached) * self.block_size or external
        n = min(seq.num_tokens - seq.num_computed, limit)
        need = self.pool.blocks_for(seq.num_computed + n) - len(cached)
        # A preempted request comes back only when all it had fits again (plus its next token);
        # readmitted on a first chunk's worth it would be preempted again at once, and again.
        whole_need = self.pool.blocks_for(seq.num_tokens + 1) - len(cached)
        fresh = None
        if not seq.preemptions or self.pool.can_allocate(whole_need):
            fresh = self.pool.allocate(need) if need > 0 else []
        if fresh is None:
            self.pool.release(cached)
            seq.num_computed = 0
            return None
        seq.block_table = cached + fresh
        seq.admitted_cached = seq.num_computed
        if not seq.preemptions and not external:   # counted once per request: its prompt, at its first admission
            seq.cached_tokens = seq.num_computed
            self.queries += seq.num_tokens
            self.hits += seq.num_computed
        return n

    def _match(self, seq):
        """The cached blocks of the request's prompt prefix, taken; none when prefix caching is
        off or taking them would exceed the budget."""
        if not self.prefix_caching:
            return []
        return self.pool.match(self._prefix_hashes(seq)) or []

    def _prefix_hashes(self, seq):
        """The hashes of the request's full prompt blocks that a prefix hit may cover: all but
        what would leave nothing to compute (its last token's logits are needed); none for a
        request that asks for its prompt's log-probabilities. Those are the logits at every
        prompt position, which a hit never computes: such a request recomputes its whole prompt
        (as vLLM's skip reading the prefix cache), and its blocks are still cached for others."""
        if seq.params.prompt_logprobs is not None:
            return []
        return self._hashes(seq)[:(seq.num_tokens - 1) // self.block_size]

    def _hashes(self, seq):
        """The chained hashes of the request's full prompt blocks, made once (on first need:
        prefix caching may be turned on after it was admitted)."""
        if not seq.block_hashes:
            seq.block_hashes = block_hashes(seq.prompt_ids, self.block_size)
        return seq.block_hashes

    # ------------------------------------------------------------------ running
    @property
    def over_budget(self):
        """More blocks in use than a lowered budget allows (until preemptions bring it back)."""
        return self.pool.used > self.pool.block_budget

    def can_append(self, seq, n):
        """Whether the blocks for the request's next `n` tokens are held already or free now."""
        need = self._new_blocks(seq, n)
        return need <= 0 or self.pool.can_allocate(need)

    def may_append(self, seq, n):
        """Give the request the blocks for its next `n` tokens it does not hold yet (`can_append`
        said they are free)."""
        need = self._new_blocks(seq, n)
        if need > 0:
            seq.block_table += self.pool.allocate(need)

    def _new_blocks(self, seq, n):
        return self.pool.blocks_for(seq.num_computed + n) - len(seq.block_table)

    def computed(self, seg):
        """Record a finished segment (engine/model/runner.py): its positions hold keys/values now (its
        guesses wait for `accepted`), and its request's full prompt blocks become findable by
        later requests with the same prefix. A segment without the cache holds nothing."""
        seq = seg.seq
        if not seg.cached:
            return
        before, seq.num_computed = seq.num_computed, seg.start + seg.n - len(seg.draft)
        if self.prefix_caching:
            bs = self.block_size
            for i in range(before // bs, min(seq.num_computed, len(seq.prompt_ids)) // bs):
                self.pool.register(seq.block_table[i], self._hashes(seq)[i])

    def accepted(self, seg, n):
        """`n` of the segment's guesses were accepted: their positions hold keys/values of the
        request's tokens now; the rest are given back (blocks past the last such position freed)."""
        seq = seg.seq
        seq.num_computed += n
        keep = self.pool.blocks_for(seq.num_computed)
        self.pool.release(seq.block_table[keep:])
        del seq.block_table[keep:]

    def free(self, seq):
        """Give back every block the request holds (finished, or preempted): nothing of it is
        in the cache any more, except prefixes other requests may still find."""
        self.pool.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0

