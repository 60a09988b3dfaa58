"""One request's state and its measured timestamps (engine clock, seconds)."""
from dataclasses import dataclass, field
import queue


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple = ()          # stop strings (the API's `stop`)


@dataclass
class Sequence:
    id: str
    source: str               # page | load | api
    prompt: str
    prompt_ids: list
    params: SamplingParams
    kv_cache: bool = True     # decided at admission from the engine setting
    # --- scheduling state
    slot: int | None = None   # the UI's batch slot (stable while running)
    row: int | None = None    # physical row in the KV store (compacted, may move)
    blocks: int = 0           # KV blocks reserved
    prefilled: int = 0        # prompt positions already computed
    output_ids: list = field(default_factory=list)
    text: str = ""            # decoded output so far
    generator: object = None  # torch.Generator when seeded sampling
    finish_reason: str | None = None
    # --- measured times (engine clock)
    arrival: float = 0.0
    tokenize_end: float = 0.0
    admitted: float | None = None
    prefill_start: float | None = None
    prefill_s: float = 0.0          # sum of prefill chunk forward durations
    first_sample_s: float = 0.0
    first_sampled: float | None = None
    first_delivered: float | None = None
    last_delivered: float | None = None
    later_decode_s: float = 0.0     # summed over later tokens
    later_sample_s: float = 0.0
    later_delivery_s: float = 0.0
    # tokens handed to an in-process consumer (the API); None when nobody listens
    sink: queue.Queue | None = None

    @property
    def length(self):
        """Positions whose keys/values exist (or would) in the cache."""
        return self.prefilled + max(0, len(self.output_ids) - 1)

    @property
    def total_ids(self):
        return self.prompt_ids + self.output_ids

    @property
    def prefill_done(self):
        return self.prefilled >= len(self.prompt_ids)

    def stage_summary(self):
        """The article's accounting: stages that add up to the measured TTFT, remainder as 'other'."""
        ttft = self.first_delivered - self.arrival
        stages = {
            "tokenize": self.tokenize_end - self.arrival,
            "queue": (self.prefill_start or self.tokenize_end) - self.tokenize_end,
            "prefill": self.prefill_s,
            "first_sample": self.first_sample_s,
            "delivery": self.first_delivered - self.first_sampled,
        }
        stages["other"] = ttft - sum(stages.values())
        n_later = len(self.output_ids) - 1
        later = None
        if n_later > 0:
            later = {"decode": self.later_decode_s / n_later, "sample": self.later_sample_s / n_later,
                     "delivery": self.later_delivery_s / n_later}
        tpot = (self.last_delivered - self.first_delivered) / n_later if n_later > 0 else None
        return ttft, tpot, stages, later
