"""What one engine step did, as facts: whom its scheduling preempted, refused and admitted, the
forward's start and end (and the keys and values the connector loaded before it), the sampling's,
each token handed out (its `token` event), each request that left for another engine and each
that ended, in the order these happened.

`Engine.step()` fills one as it works; reading the clock at the step's fixed points is its only
timing work. The step recorder (engine/timing/recorder.py) then reads it once and turns it into each
request's stage accounting and the step's events. The engine's commands outside a step (cancel,
clear the queue, reset, fail all) report the requests they end through one too.
"""
from dataclasses import dataclass, field

from ..events import Token


@dataclass(frozen=True)
class Placed:
    """A request preempted or admitted by the step's scheduling, as the scheduling left it (its
    slot, blocks and tokens move on later in the step: it may even finish in it)."""
    seq: object
    slot: int | None
    blocks: int
    tokens: int
    cached_tokens: int      # found in the prefix cache at this admission
    preemptions: int

    @classmethod
    def of(cls, seq):
        return cls(seq, seq.slot, len(seq.block_table), seq.num_tokens, seq.admitted_cached, seq.preemptions)


@dataclass(frozen=True)
class Ended:
    """A request that ended (finished, cancelled, failed, refused after it started): why, and when."""
    seq: object
    reason: str
    error: str | None
    t: float


@dataclass(frozen=True)
class Refused:
    """A request refused before its first token (it may have been admitted): its `rejected` event."""
    seq: object
    event: object


@dataclass(frozen=True)
class Handed:
    """A token handed out by the step: its request and its `token` event (the recorder gives it to
    the request's client, and notes when that ended: its delivery)."""
    seq: object
    event: Token


@dataclass(frozen=True)
class Loaded:
    """A request's keys and values copied in through the connector (engine/core/connector.py
    `load`), from `start` to `end`, into its blocks `dst_blocks` from `src_blocks` elsewhere."""
    seq: object
    start: float
    end: float
    tokens: int
    bytes: int
    src_blocks: list
    dst_blocks: list


@dataclass
class StepOutput:
    clock: object
    scheduled: float | None = None    # when scheduling ended: its preemptions and admissions happened then
    preempted: list = field(default_factory=list)   # Placed
    refused: list = field(default_factory=list)     # Ended (it had started) or Refused
    admitted: list = field(default_factory=list)    # Placed
    stats: dict | None = None         # the queue and cache as the `stats` event shows them, when one is due
    running: list = field(default_factory=list)     # the running requests when the forward ran
    segments: list = field(default_factory=list)    # the forward's work (runner Segments)
    forward: tuple | None = None      # (start, end); None: no forward ran (or it raised)
    first_shape: bool = False         # the forward was the first of its shape (engine/model/runner.py)
    path: object = None               # the weights it read (engine/model/linears.py Path)
    cache: tuple = (0, 0)             # (positions held, blocks used) right after the forward
    sampling: tuple = (0.0, 0.0)      # (start, end): every token of a step is sampled at once
    accepted: dict = field(default_factory=dict)    # request id -> its guesses the model kept
    tokens: list = field(default_factory=list)      # Handed, in hand-out order
    ended: list = field(default_factory=list)       # Ended, Refused, or the `error` event that ended those after it
    loaded: list = field(default_factory=list)      # Loaded, before the forward
    left: list = field(default_factory=list)        # Sequences whose work here the forward ended (`leaves`)

    def work(self):
        """(decode tokens, prompt tokens) of the forward: a decoding request's one token and its
        guesses (KV cache off: every token it recomputes) count as decode."""
        decode = sum(seg.n for seg in self.segments if seg.decode)
        return decode, sum(seg.n for seg in self.segments) - decode

    def hand_out(self, seq, token_id, text, client_text, spec=None, odds=None):
        """The token just appended to `seq.output_ids`, as its `token` event (the recorder hands it
        to the request's client); `client_text` is carried only where stop strings made it differ
        from the token's text; `spec`: what speculative decoding made of it (`speculate.kinds`);
        `odds`: what it was chosen from (the event's `p`, `p_raw`, `top`, `rejected`), when computed."""
        index, (_, sampled) = len(seq.output_ids) - 1, self.sampling
        self.tokens.append(Handed(seq, Token(
            t=self.clock.now(), id=seq.id, index=index, token_id=token_id, text=text, first=index == 0,
            sampled=sampled, sample_s=sampled - self.sampling[0],
            client_text=None if client_text == text else client_text, spec=spec, **(odds or {}))))
