"""One request's state: its tokens, its place in the cache, how it ends.

A request is its tokens (prompt, then outputs) and how many of them have keys/values in the
cache (`num_computed`). Each step computes some of the rest: a prompt chunk, or the one new
token of a decoding request; whenever a step reaches the last known token, its logits give
the next token. Prefill, decode and recompute after preemption are all this one rule.
"""
from dataclasses import dataclass, field
from enum import Enum

from .fields import Resolved


@dataclass
class SamplingParams(Resolved):
    """A request's parameters as the engine reads them: every field of the registry
    (engine/core/fields.py, keyword-only), resolved (`GenerateRequest.sampling`), and these."""
    stop: tuple = ()          # stop strings (the API's `stop`)
    speculation: str | None = None   # this request's proposer ("off", "ngram", "suffix"); None: the setting's
    spec_tokens: int | None = None   # its guesses per step (1-8); None: the `spec_tokens` setting
    logprobs: int | None = None      # candidates its client asks for with each token (the API's); None: none
    prompt_logprobs: int | None = None   # candidates its client asks for with each prompt token; None: none


class Status(Enum):
    """Where a request is in the scheduler (engine/core/scheduler.py sets it as it moves it)."""
    WAITING = "waiting"     # in the queue: not yet admitted, or preempted
    RUNNING = "running"     # holds a batch slot (and its blocks)
    FINISHED = "finished"   # done, cancelled, failed or refused: holds nothing


@dataclass
class Sequence:
    id: str
    source: str               # page | load | api | join
    prompt: str
    prompt_ids: list
    params: SamplingParams
    kv_cache: bool = True     # decided at admission from the engine setting
    label: str | None = None  # who asked, shown on the timeline (a classroom student's name)
    preview: str = ""         # what the person asked (a chat's user message), for the timeline row
    # --- scheduling state
    status: Status = Status.WAITING
    slot: int | None = None   # the UI's batch slot (stable while running)
    block_table: list = field(default_factory=list)   # KV blocks holding positions 0, bs, 2bs, ...
    num_computed: int = 0     # positions whose keys/values are in the cache
    block_hashes: list = field(default_factory=list)  # chained hashes of its full prompt blocks
    cached_tokens: int = 0    # prompt tokens found in the prefix cache at its first admission
    admitted_cached: int = 0  # tokens found there at its latest admission (a recompute's too)
    preemptions: int = 0
    output_ids: list = field(default_factory=list)
    detok: object = None      # detok.Detokenizer: its text so far, token by token
    stops: object = None      # detok.StopStrings watching that text
    generator: object = None  # torch.Generator when seeded sampling
    grammar: object = None    # engine/model/structured.py's Matcher when its output is constrained
    finish_reason: str | None = None
    # Its prompt's odds when its client asked (`params.prompt_logprobs`): per prompt position, the
    # sampler's Chance of that token given those before it (position 0 has none: None), filled by
    # the prefill's forwards (engine.py) and handed out with its first token
    prompt_odds: list | None = None
    # --- the request's own times (engine clock), measured by intake; everything timed later is
    # the step recorder's, its RequestTimes (engine/timing/request_times.py), written by it alone
    arrival: float = 0.0
    tokenize_end: float = 0.0
    times: object = None
    # its client's end (engine/core/request.py's RequestHandle): the step recorder writes its own
    # token, finished or rejected events there
    handle: object = None

    # What a request is between processes (nano-vllm's `Sequence.__getstate__`): its tokens, its
    # place in the cache and its times, without this engine's objects around it (its
    # detokenizer, stop watcher, sampling generator and client), which whoever takes it makes anew.
    LOCAL = ("detok", "stops", "generator", "grammar", "handle")

    def __getstate__(self):
        return {k: (None if k in self.LOCAL else v) for k, v in self.__dict__.items()}

    @property
    def num_tokens(self):
        return len(self.prompt_ids) + len(self.output_ids)

    def token_ids(self, start, n):
        """Tokens start..start+n-1 of prompt + output."""
        p = len(self.prompt_ids)
        if start + n <= p:
            return self.prompt_ids[start:start + n]
        return (self.prompt_ids + self.output_ids)[start:start + n]

    @property
    def decoding(self):
        """Whether its next step is a decode: it has output, and its next forward computes the
        one newest token against the cache (KV cache off: recomputes the whole sequence for it).
        False while it (re)computes its prompt, or everything after a preemption, in chunks."""
        if not self.output_ids:
            return False
        return not self.kv_cache or self.num_tokens - self.num_computed == 1

    def append(self, token_id, eos_seen):
        """Append an output token: its own text, the text its client gets under the stop rule
        (detok.StopStrings; with whatever was held back when this token ends the request), and
        why it ends the request, or None."""
        self.output_ids.append(token_id)
        text = self.detok.add(token_id)   # "" while a UTF-8 character is incomplete
        if self.stop_token():    # it ends here, its own text not its client's (vLLM's)
            return text, self.stops.flush(), "stop"
        client_text = self.stops.feed(text)
        stop = self.stop_reason(eos_seen, self.stops.found)
        if self.grammar is not None and self.grammar.accept(token_id) and not stop:
            stop = "stop"    # its grammar is complete: nothing may follow (vLLM's finish reason)
        if stop:
            client_text += self.stops.flush()
        return text, client_text, stop

    def stop_token(self):
        """Whether its newest token is one of its `stop_token_ids`, from `min_tokens` on."""
        p = self.params
        return len(self.output_ids) >= p.min_tokens and self.output_ids[-1] in p.stop_token_ids

    def stop_reason(self, eos_seen, stop_string_seen):
        """Why its newest token ends it ("stop", "stop_string", "length"), or None. End of
        sequence and stop strings count only from `min_tokens` on."""
        p, n = self.params, len(self.output_ids)
        if n >= p.min_tokens:
            if eos_seen and not p.ignore_eos:
                return "stop"
            if stop_string_seen:
                return "stop_string"
        if n >= p.max_new_tokens:
            return "length"
        return None
