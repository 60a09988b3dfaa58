"""Every event the engine (and observe mode) publishes: one dataclass per type.

These types are the wire protocol. The engine's `step()` returns them, the broadcaster
serialises each one once (`Event.to_dict`) for pages, traces and history, and in-process
listeners (metrics) read their attributes. `docs/events.schema.json` is generated from these
classes (`python -m engine.schema`) and `docs/protocol.md` documents the same fields; tests
check both. Times are seconds on the engine clock (`t = 0` at engine start).

Observe mode builds the same types from a client's point of view: what a client cannot
know is `None` (null on the wire), never invented.
"""
from dataclasses import dataclass, fields
import time
from typing import Any, ClassVar, Literal, TypedDict

PROTOCOL = 6   # bump on any change of an event's fields or meaning (docs/protocol.md, "Versions")

Source = Literal["page", "load", "api", "observe", "join"]
FinishReason = Literal["stop", "stop_string", "length", "cancelled", "error"]


class Clock:
    """Seconds since the engine started, monotonic, plus the wall time of t=0."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self.wall0 = time.time()

    def now(self):
        return time.perf_counter() - self._t0


class Stages(TypedDict):
    """Where the time to first token went (seconds); the six add up to `ttft`."""
    tokenize: float | None
    queue: float | None
    prefill: float | None
    first_sample: float | None
    delivery: float | None
    other: float | None


class Later(TypedDict):
    """Mean seconds per later token, by what the request was doing (forwards are measured
    whole; what is left of `tpot` is engine time between forwards)."""
    decode: float      # forwards it was part of with no other request's prompt tokens
    mixed: float       # forwards it was part of that also computed other requests' prompt chunks
    stalled: float     # forwards it was not part of while running (others' prefill ran; it waited)
    preempted: float   # from being preempted to its next token (waiting again, then recompute)
    sample: float
    delivery: float


class PresetInfo(TypedDict):
    """A teaching preset (engine/presets.py): what it sets, what it does, what to watch."""
    name: str
    title: str
    explain: str
    watch: str
    settings: dict[str, Any]
    actions: list[dict[str, Any]]


class Speculated(TypedDict):
    """One request's speculative decoding in one step: guesses verified, and how many the model
    accepted (a run from the first; its own token follows them)."""
    proposed: int
    accepted: int


class DecodePoint(TypedDict):
    """One measured decode step: `batch` requests each `context` tokens long."""
    batch: int
    context: int
    step_s: float       # median of the timed forwards
    floor_s: float      # estimate: weights plus the batch's KV read once at the measured bandwidth


class KVPoint(TypedDict):
    """One new token at sequence length `tokens`: with the KV cache, and recomputing everything."""
    tokens: int
    cached_s: float
    recompute_s: float


class Percentiles(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None


_FIELDS = {}


@dataclass(slots=True)
class Event:
    """Base: every event has a `type` (the class's name on the wire) and a time `t`."""
    type: ClassVar[str] = ""
    t: float

    def to_dict(self):
        """The JSON object sent on the wire (the one place events are serialised)."""
        cls = type(self)
        names = _FIELDS.get(cls)
        if names is None:
            names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
        out = {"type": cls.type}
        for name in names:
            out[name] = getattr(self, name)
        return out


@dataclass(slots=True)
class Hello(Event):
    type: ClassVar[str] = "hello"
    protocol: int
    mode: Literal["engine", "observe"]
    server_time: float
    model: str | None
    device: str | None
    dtype: str | None
    params: int | None
    weight_bytes: int | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    hidden: int | None
    vocab: int | None
    kv_bytes_per_token: int | None
    block_size: int | None
    cache_blocks: int | None
    kv_store_bytes: int | None
    max_slots: int | None
    max_context: int | None
    settings: dict[str, Any]
    limits: dict[str, dict[str, Any]]
    bandwidth: dict[str, Any] | None
    bench: dict[str, Any] | None
    presets: list[PresetInfo] | None = None   # engine mode: the teaching presets
    target: str | None = None        # observe mode: the observed API's base URL
    metrics: bool | None = None      # observe mode: its /metrics was readable
    role: Literal["solo", "presenter", "viewer"] = "solo"   # this connection's (classroom mode)
    classroom: dict[str, Any] | None = None    # classroom mode: the join URL and what this role may see


@dataclass(slots=True)
class Loading(Event):
    type: ClassVar[str] = "loading"
    status: Literal["loading", "error"]
    message: str
    progress: float


@dataclass(slots=True)
class Settings(Event):
    type: ClassVar[str] = "settings"
    settings: dict[str, Any]
    changed: list[str]


@dataclass(slots=True)
class Request(Event):
    type: ClassVar[str] = "request"
    id: str
    source: Source
    prompt_tokens: int | None
    max_new_tokens: int
    preview: str
    estimated: bool = False          # observe mode: prompt_tokens is an estimate
    label: str | None = None         # classroom: the student's name (source "join")


@dataclass(slots=True)
class Tokenized(Event):
    type: ClassVar[str] = "tokenized"
    id: str
    start: float
    end: float
    n: int
    ids: list[int]
    pieces: list[str]
    truncated: bool


@dataclass(slots=True)
class Admitted(Event):
    type: ClassVar[str] = "admitted"
    id: str
    slot: int
    queue_s: float
    blocks: int
    prompt_tokens: int
    cached_tokens: int
    resumed: bool


@dataclass(slots=True)
class Preempted(Event):
    type: ClassVar[str] = "preempted"
    id: str
    tokens: int
    preemptions: int


@dataclass(slots=True)
class Prefill(Event):
    type: ClassVar[str] = "prefill"
    id: str
    start: float
    end: float
    pos: int
    tokens: int
    done: bool


@dataclass(slots=True)
class Step(Event):
    type: ClassVar[str] = "step"
    kind: Literal["prefill", "decode", "mixed"]
    start: float
    end: float
    ids: list[str]
    tokens: int
    prefill_tokens: int
    decode_tokens: int
    kv_cache: bool
    cache_tokens: int
    cache_blocks_used: int
    per_request: dict[str, int]
    spec: dict[str, Speculated] | None = None   # requests that verified guesses in this forward


@dataclass(slots=True)
class Token(Event):
    type: ClassVar[str] = "token"
    id: str
    index: int
    token_id: int | None
    text: str
    first: bool
    sampled: float | None
    sample_s: float | None
    # speculative decoding: "accepted" (a guess the model agreed with), "corrected" (its own token
    # where it rejected one), "bonus" (its token after accepting all); None: a plain decode
    spec: Literal["accepted", "corrected", "bonus"] | None = None


@dataclass(slots=True)
class Finished(Event):
    type: ClassVar[str] = "finished"
    id: str
    reason: FinishReason
    source: Source
    prompt_tokens: int | None
    output_tokens: int | None
    e2e: float
    ttft: float | None = None
    tpot: float | None = None
    stages: Stages | None = None
    later: Later | None = None
    cached_tokens: int | None = None  # prompt tokens reused from the prefix cache
    preemptions: int | None = None
    client_side: bool = False        # observe mode: measured by a client of another server
    chunks: int | None = None        # observe mode: streamed chunks that carried text
    gaps: list[float] | None = None  # observe mode: every gap between chunks
    error: str | None = None         # what went wrong, when reason is "error"
    spec_drafts: int | None = None        # steps in which it verified guesses (vLLM's num_drafts)
    spec_draft_tokens: int | None = None  # guesses verified
    spec_accepted_tokens: int | None = None   # ... of which accepted


@dataclass(slots=True)
class Rejected(Event):
    type: ClassVar[str] = "rejected"
    id: str
    reason: str
    code: str


@dataclass(slots=True)
class Stats(Event):
    type: ClassVar[str] = "stats"
    queue: int | None
    running: int | None
    waiting_ids: list[str]
    slots: list[str | None]
    cache_blocks_used: int | None
    cache_blocks: int | None
    cache_tokens: int | None
    subscribers: int
    tokens_per_s: float
    ttft: Percentiles
    itl: Percentiles
    finished: int
    blocked_on: Literal["slot", "cache", "drain", "batch", "budget"] | None = None
    cache_blocks_shared: int | None = None  # blocks used by more than one request (a shared prefix)
    cache_blocks_cached: int | None = None  # free blocks still holding a reusable prefix
    block_tables: dict[str, list[int]] | None = None   # running request -> its blocks, in order
    prefix_queries: int | None = None       # prompt tokens looked up in the prefix cache, so far
    prefix_hits: int | None = None          # ... of which found
    preemptions: int | None = None          # so far
    in_flight: int | None = None            # observe mode: the observer's open requests
    cache_usage: float | None = None        # observe mode: the server's KV-cache usage, 0..1
    server: dict[str, float | None] | None = None   # observe mode: the server's raw gauges


@dataclass(slots=True)
class Preset(Event):
    type: ClassVar[str] = "preset"
    name: str
    title: str
    explain: str
    watch: str
    overrides: dict[str, Any]   # settings changed from the preset's own (one side of a comparison)
    requests: int               # how many requests its bursts will submit


@dataclass(slots=True)
class Measure(Event):
    type: ClassVar[str] = "measure"
    status: Literal["running", "done", "error"]
    batches: list[int]
    contexts: list[int]
    decode: list[DecodePoint] | None = None
    kv: list[KVPoint] | None = None
    skipped: list[str] | None = None   # points the free KV blocks could not hold, and why
    seconds: float | None = None
    message: str | None = None         # status "error": what went wrong
    points_done: int | None = None     # status "running": points timed so far (decode and kv) ...
    points_total: int | None = None    # ... of this many
    eta_s: float | None = None         # status "running": seconds left, estimated from the points so far


@dataclass(slots=True)
class Sync(Event):
    type: ClassVar[str] = "sync"
    client_t: float
    server_time: float


@dataclass(slots=True)
class Reset(Event):
    type: ClassVar[str] = "reset"
    cached_blocks: int | None = None   # blocks still holding a reusable prefix after it (0; observe mode: None)


@dataclass(slots=True)
class Dropped(Event):
    type: ClassVar[str] = "dropped"
    count: int


@dataclass(slots=True)
class Error(Event):
    type: ClassVar[str] = "error"
    message: str
    field: str | None = None
    fatal: bool = False     # the engine stopped: every request in flight failed, /healthz is 503


EVENT_TYPES = (Hello, Loading, Settings, Request, Tokenized, Admitted, Preempted, Prefill, Step, Token,
               Finished, Rejected, Stats, Preset, Measure, Sync, Reset, Dropped, Error)
