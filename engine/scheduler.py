"""Who runs next: the waiting queue, batch slots, KV-block admission and the work order.

Admission is first-come first-served: the head of the queue is admitted when a slot
is free and its blocks (prompt + max_new_tokens) fit the budget; nobody overtakes it,
so a big request is not starved by small ones. Requests with the KV cache off and on
never share a batch: after the setting flips, new admissions wait for the running
ones to drain.

Work order: without chunked prefill, the admitted requests' whole prompts go first, several
in one right-padded forward (up to PREFILL_BATCH_TOKENS padded positions), then one decode
step for everyone (vLLM v0 style). With chunked prefill, one request's chunk and one decode
step alternate, so long prompts do not stall running requests.
"""
from collections import deque

# Padded positions in one batched prefill forward: enough to amortise a forward's fixed
# cost (per-token prefill cost is lowest around 256-512 tokens here), small enough that one
# forward (~1.5 s on 2 CPU cores) does not stall running requests' decoding for long.
PREFILL_BATCH_TOKENS = 512


class Scheduler:
    def __init__(self, account, max_slots, max_waiting=512):
        self.account = account
        self.max_slots = max_slots
        self.slot_limit = max_slots     # live setting
        self.max_waiting = max_waiting
        self.waiting = deque()
        self.running = []               # ordered by row
        self.slots = [None] * max_slots
        self._last_was_prefill = False

    def blocks_needed(self, seq):
        return self.account.blocks_for(len(seq.prompt_ids) + seq.params.max_new_tokens)

    def admit(self, kv_cache_on):
        """Move waiting requests into free slots while they fit; return the admitted ones."""
        admitted = []
        while self.waiting and len(self.running) < self.slot_limit:
            seq = self.waiting[0]
            if self.running and self.running[0].kv_cache != kv_cache_on:
                break                    # mode change: drain first
            blocks = self.blocks_needed(seq) if kv_cache_on else 0
            if not self.account.can_reserve(blocks):
                break
            self.waiting.popleft()
            self.account.reserve(blocks)
            seq.blocks = blocks
            seq.kv_cache = kv_cache_on
            seq.slot = self.slots.index(None)
            self.slots[seq.slot] = seq
            seq.row = len(self.running)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def blocked_on(self, kv_cache_on):
        """Why the head of the queue is not admitted: "slot", "cache" (not enough free KV
        blocks), "drain" (the KV-cache mode changed; running requests finish first), or None."""
        if not self.waiting:
            return None
        if len(self.running) >= self.slot_limit:
            return "slot"
        if self.running and self.running[0].kv_cache != kv_cache_on:
            return "drain"
        if kv_cache_on and not self.account.can_reserve(self.blocks_needed(self.waiting[0])):
            return "cache"
        return None

    def next_work(self, prefill_chunk):
        """('prefill', [seqs], start, n), ('decode', [seqs]) or None.

        n is None for whole prompts from position 0 (one batched forward); otherwise the
        single request's positions start..start+n-1 (a chunk, or the rest of a chunked one)."""
        pending = [s for s in self.running if not s.prefill_done]
        ready = [s for s in self.running if s.prefill_done]
        if pending and not (prefill_chunk and ready and self._last_was_prefill):
            self._last_was_prefill = True
            seq = pending[0]
            remaining = len(seq.prompt_ids) - seq.prefilled
            if seq.kv_cache and (prefill_chunk or seq.prefilled):
                return ("prefill", [seq], seq.prefilled, min(prefill_chunk or remaining, remaining))
            batch = [seq]
            for other in pending[1:]:
                width = max(len(s.prompt_ids) for s in batch + [other])
                if other.prefilled or width * (len(batch) + 1) > PREFILL_BATCH_TOKENS:
                    break
                batch.append(other)
            return ("prefill", batch, 0, None)
        self._last_was_prefill = False
        if ready:
            return ("decode", ready)
        return None

    def remove(self, seq):
        """Free the request's slot and blocks; compact rows. Returns (src_row, dst_row) moved, or None."""
        if seq in self.waiting:
            self.waiting.remove(seq)
            return None
        self.account.release(seq.blocks)
        seq.blocks = 0
        self.slots[seq.slot] = None
        row = seq.row
        self.running.remove(seq)
        moved = None
        if self.running and row < len(self.running):
            last = self.running.pop()       # the request in the highest row fills the hole
            moved = (last.row, row)
            last.row = row
            self.running.insert(row, last)
        return moved

    @property
    def cache_tokens(self):
        return sum(s.length for s in self.running if s.kv_cache)
