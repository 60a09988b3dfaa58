"""The two halves of prefill/decode disaggregation as KV connectors (engine/core/connector.py),
one per engine process (engine/disagg/child.py), as vLLM's P/D with the NixlConnector.

The prefill instance's connector (`PrefillConnector`): prompts are computed in chunks as the
policy sizes them, and no position wants logits (unlike vLLM's prefill instance, which samples
one token that its proxy throws away, it never samples). Once a request's whole prompt is
computed it leaves (`leaves`): its slot is free, its blocks are held (vLLM's delayed free) and
the request itself, in its own inter-process form (`Sequence.__getstate__`, its record of times
with it), goes to the coordinator in a `HandOff`; its blocks are given back when the decode
instance says it no longer needs them (`release`, after a `Release`).

The decode instance's connector (`DecodeConnector`): a handed-off request (`adopt`) waits in the
queue like any, its prompt's keys and values on the prefill instance. When the scheduler admits
it, blocks for the whole prompt are allocated and positions 0..p-2 counted as computed
(`external_tokens`); before that step's forward they are copied from the prefill instance's
store, which this process maps (`load`, engine/disagg/transfer.py), and the prefill instance is
told to let them go. vLLM's decode instance reads every remote prompt block, then computes the
last prompt position again for the first token's logits; that position's keys and values are
computed again anyway, so only 0..p-2 are copied. A request that ends before its copy (cancelled,
refused) lets them go too.
"""
from ..core.connector import KVConnector
from ..core.sequence import Status
from ..core.step_output import Loaded
from . import transfer
from .messages import HandOff, Release


class PrefillConnector(KVConnector):
    name = "prefill"
    samples = False

    def __init__(self):
        self.held = {}      # request id -> a request that left, whose blocks the decode instance reads
        self._out = []

    def bind(self, engine):
        self.blocks = engine.blocks

    def leaves(self, seq):
        return seq.num_computed >= seq.num_tokens

    def finished(self, seq):
        """One that left (no finish reason: its prompt is computed) keeps its blocks until
        `release`, and goes to the decode instance; any other end frees them."""
        if seq.finish_reason is not None:
            return False
        self.held[seq.id] = seq
        self._out.append(HandOff(seq))
        return True

    def release(self, rid):
        """The decode instance no longer needs the blocks of a request that left: given back."""
        seq = self.held.pop(rid, None)
        if seq is not None:
            self.blocks.free(seq)
        return []

    def outbox(self):
        out, self._out = self._out, []
        return out


class DecodeConnector(KVConnector):
    name = "decode"

    def __init__(self, peer_store):
        """`peer_store`: the prefill instance's KV store (engine/core/kv_cache.py), mapped here."""
        self.peer = peer_store
        self.remote = {}    # request id -> its blocks on the prefill instance, until copied (or it ends)
        self._loading = []  # admitted this step with external tokens: copied before the forward
        self._out = []

    def bind(self, engine):
        self.store, self.clock, self.block_size = engine.store, engine.clock, engine.blocks.block_size

    def adopt(self, handoff):
        """A request the prefill instance handed off, as this engine queues it: its blocks there
        remembered, none here yet (its client is the coordinator's: no handle here)."""
        seq = handoff.seq
        self.remote[seq.id], seq.block_table = seq.block_table, []
        seq.num_computed, seq.status = 0, Status.WAITING
        return seq

    def external_tokens(self, seq):
        return len(seq.prompt_ids) - 1 if seq.id in self.remote else 0

    def allocated(self, seq):
        if seq.id in self.remote:   # (a one-token prompt too: nothing to copy, its blocks there let go)
            self._loading.append(seq)

    def load(self, out):
        """Copy each admitted request's positions 0..p-2 from the prefill instance's blocks into
        those just allocated here, timed; the prefill instance may let them go then."""
        bs = self.block_size
        for seq in self._loading:
            tokens, src = seq.num_computed, self.remote.pop(seq.id)
            start = self.clock.now()
            nbytes = transfer.pull(self.peer, self.store, src, seq.block_table, tokens)
            out.loaded.append(Loaded(seq, start, self.clock.now(), tokens, nbytes, transfer.blocks_moved(src, tokens, bs),
                                     transfer.blocks_moved(seq.block_table, tokens, bs)))
            self._out.append(Release(seq.id))
        self._loading = []

    def finished(self, seq):
        """Ended before its keys and values were copied: the prefill instance lets them go."""
        if self.remote.pop(seq.id, None) is not None:
            self._out.append(Release(seq.id))
        self._loading = [s for s in self._loading if s is not seq]
        return False

    def outbox(self):
        out, self._out = self._out, []
        return out
