"""One request's measured times (engine clock, seconds) and speculation counts: the step
recorder's record of it (engine/timing/recorder.py), kept from its admission to its end, and the
article's accounting of its time to first token made from them (docs/engine.md).
"""
from dataclasses import dataclass

LATER = ("decode", "mixed", "stalled", "preempted", "sample", "delivery")   # Later in engine/events.py


@dataclass
class RequestTimes:
    arrival: float                  # the request's own facts (its Sequence's, from intake),
    tokenize_end: float             # copied so the record reads alone
    # when it last joined a queue: its arrival, a preemption, or leaving an engine that did part
    # of its work (engine/core/connector.py `leaves`: it joins the next engine's queue then)
    queued_at: float = 0.0
    preempted: bool = False         # it waits after a preemption (to be recomputed)
    admitted: float | None = None   # its first admission
    prefill_start: float | None = None
    prefill_s: float = 0.0          # forwards that computed its prompt, before its first token
    requeue_s: float = 0.0          # waiting again (after a preemption, in a next engine), before its first token
    transfer_s: float = 0.0         # its keys and values copied in through the connector (`load`)
    load_s: float = 0.0             # of its wait before admission, the part the model was loading
    first_sample_s: float = 0.0
    first_sampled: float | None = None
    first_delivered: float | None = None
    last_delivered: float | None = None
    # summed over later tokens (Later in engine/events.py says what each holds)
    later_decode_s: float = 0.0
    later_mixed_s: float = 0.0
    later_stalled_s: float = 0.0
    later_preempted_s: float = 0.0
    later_sample_s: float = 0.0
    later_delivery_s: float = 0.0
    recovering_since: float | None = None   # preempted after its first token, not yet back to a new one
    # speculative decoding (engine/model/speculate.py), vLLM's counts
    spec_drafts: int = 0            # steps in which it verified guesses
    spec_draft_tokens: int = 0      # guesses verified
    spec_accepted: int = 0          # ... of which accepted

    def stage_summary(self, output_tokens):
        """(ttft, tpot, stages, later) of a request that got its first token, `output_tokens` in
        all: stages that add up to the measured TTFT (the remainder as 'other'), and each later
        token's average share of every later stage (None for a one-token answer, as is tpot)."""
        ttft = self.first_delivered - self.arrival
        stages = {
            "tokenize": self.tokenize_end - self.arrival,
            "load": self.load_s,
            "queue": (self.prefill_start or self.tokenize_end) - self.tokenize_end + self.requeue_s - self.load_s,
            "prefill": self.prefill_s,
            "transfer": self.transfer_s,
            "first_sample": self.first_sample_s,
            "delivery": self.first_delivered - self.first_sampled,
        }
        stages["other"] = ttft - sum(stages.values())
        n_later = output_tokens - 1
        if n_later <= 0:
            return ttft, None, stages, None
        later = {k: getattr(self, f"later_{k}_s") / n_later for k in LATER}
        return ttft, (self.last_delivered - self.first_delivered) / n_later, stages, later
