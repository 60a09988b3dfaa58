"""Every event the engine (and observe mode) publishes: one dataclass per type.

These types are the wire protocol. The engine's `step()` returns them, the broadcaster
serialises each one once (`Event.to_dict`) for pages, traces and history, and in-process
listeners (metrics) read their attributes. `docs/events.schema.json` is generated from these
classes (`python -m engine.schema`) and `docs/protocol.md` documents the same fields; tests
check both. Times are seconds on the engine clock (`t = 0` at engine start).

Observe mode builds the same types from a client's point of view: what a client cannot
know is `None` (null on the wire), never invented.
"""
from dataclasses import dataclass, field, fields
import time
from typing import Any, ClassVar, Literal, TypedDict

from .settings import wire_type

PROTOCOL = 19  # bump on any change of an event's fields or meaning (docs/protocol.md, "Versions")

Source = Literal["page", "load", "api", "observe", "join"]
SettingValues = wire_type()   # {name: value}, made from the settings registry's typed parts
FinishReason = Literal["stop", "stop_string", "length", "cancelled", "error"]
# Prefill/decode disaggregation (engine/disagg/): which instance an event comes from. None: the
# one colocated engine, which does both.
Instance = Literal["prefill", "decode"]


class Clock:
    """Seconds since the engine started, monotonic, plus the wall time of t=0."""

    def __init__(self, origin=None, wall0=None):
        """`origin` (a `time.perf_counter()` reading) and `wall0`: another clock's (`origin()`), so
        that engines in other processes tell the same time (perf_counter is the system's monotonic
        clock on Linux); None: t=0 now."""
        self._t0 = time.perf_counter() if origin is None else origin
        self.wall0 = time.time() if wall0 is None else wall0

    def origin(self):
        """(origin, wall0): what `Clock(*clock.origin())` needs to tell this clock's time."""
        return self._t0, self.wall0

    def now(self):
        return time.perf_counter() - self._t0


class Stages(TypedDict):
    """Where the time to first token went (seconds); the eight add up to `ttft`."""
    tokenize: float | None
    load: float | None      # waiting for the model to load (a reload: engine/model/reload.py)
    queue: float | None
    prefill: float | None
    transfer: float | None  # disaggregated: copying its KV blocks to the decode instance (0 colocated)
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


class InstanceInfo(TypedDict):
    """One engine instance of a disaggregated server (hello.instances)."""
    name: Instance
    pid: int
    threads: int            # its model threads (torch intra-op)
    max_slots: int
    cache_blocks: int
    kv_store_bytes: int


class PresetInfo(TypedDict):
    """A teaching preset (engine/teach/presets.py): what it sets, what it does, what to watch."""
    name: str
    title: str
    explain: str
    watch: str
    settings: SettingValues
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
    predicted_s: float  # estimate: the roofline's (the slower of its bytes and its flops; engine/timing/roofline.py)
    bound: Literal["memory", "compute"]


class PrefillPoint(TypedDict):
    """One whole prompt of `tokens` tokens computed in one forward."""
    tokens: int
    step_s: float       # median of the timed forwards
    predicted_s: float  # estimate: the roofline's
    bound: Literal["memory", "compute"]


class SkippedPoint(TypedDict):
    """A point the sweep planned but could not time: its synthetic requests needed more KV blocks
    than were free (the others held by requests in flight, or beyond the store's capacity)."""
    sweep: Literal["decode", "kv", "prefill"]
    batch: int          # requests in the forward (1 for the kv and prefill sweeps)
    tokens: int         # each one's length: the decode point's context, the kv or prefill length
    blocks_needed: int
    blocks_free: int


class KVPoint(TypedDict):
    """One new token at sequence length `tokens`: with the KV cache, and recomputing everything."""
    tokens: int
    cached_s: float
    recompute_s: float


class SLOMark(TypedDict):
    """A completed request judged against the service-level objectives in force when it finished."""
    ttft_met: bool
    tpot_met: bool          # true for a one-token answer (no time per output token)
    met: bool               # both: it counts towards goodput
    ttft_target_s: float
    tpot_target_s: float


# A candidate token (engine/model/sampler.py Odds): (token id, its text, its probability under the
# distribution the choice was drawn from, under the model's own). A compact array on the wire:
# five of them ride on every token event.
# Observe mode: the id and `p` are null (an observed server sends texts and its own log-probabilities).
Candidate = tuple[int | None, str, float | None, float]
SHOWN = 5      # candidates a token event carries on the wire: the page's bars
MAX_TOP = 20   # the most a client may ask for (OpenAI's top_logprobs bound, vLLM's max_logprobs)


class Percentiles(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None


_FIELDS = {}
IN_PROCESS = {"wire": False}   # a field's metadata: for in-process readers only, never sent (nor in the schema)


def wire_fields(cls):
    """The fields of an event type that go on the wire, in order."""
    return [f for f in fields(cls) if f.metadata.get("wire", True)]


@dataclass(slots=True, frozen=True)
class Event:
    """Base: every event has a `type` (the class's name on the wire) and a time `t`."""
    type: ClassVar[str] = ""
    t: float

    def to_dict(self):
        """The JSON object sent on the wire (the one place events are serialised)."""
        cls = type(self)
        names = _FIELDS.get(cls)
        if names is None:
            names = _FIELDS[cls] = tuple(f.name for f in wire_fields(cls))
        out = {"type": cls.type}
        for name in names:
            out[name] = getattr(self, name)
        return out


@dataclass(slots=True, frozen=True)
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
    settings: SettingValues
    limits: dict[str, dict[str, Any]]
    bandwidth: dict[str, Any] | None
    bench: dict[str, Any] | None
    roofline: dict[str, Any] | None = None   # engine mode: measured peak matmul rate and the model's shapes (estimates)
    # engine mode: the copies of the weights the `weights` setting picks from (engine/model/linears.py
    # Formats.describe): per format the bytes a decode step reads and its estimated floor; the kernel
    weights: dict[str, Any] | None = None
    presets: list[PresetInfo] | None = None   # engine mode: the teaching presets
    target: str | None = None        # observe mode: the observed API's base URL
    metrics: bool | None = None      # observe mode: its /metrics was readable
    server: dict[str, Any] | None = None   # observe mode: the observed server's profile (observe/profiles.py)
    role: Literal["solo", "presenter", "viewer"] = "solo"   # this connection's (classroom mode)
    classroom: dict[str, Any] | None = None    # classroom mode: the join URL and what this role may see
    instances: list[InstanceInfo] | None = None   # disaggregated: the prefill and the decode instance (None: colocated)
    # engine mode: the architecture (engine/model/archs.py; transformers' model_type for one it does
    # not describe), the query heads, and per layer the keys a query sees (None: every one before it)
    architecture: str | None = None
    heads: int | None = None
    windows: list[int | None] | None = None


@dataclass(slots=True, frozen=True)
class Loading(Event):
    type: ClassVar[str] = "loading"
    status: Literal["loading", "error"]
    message: str
    progress: float


@dataclass(slots=True, frozen=True)
class ModelLoad(Event):
    type: ClassVar[str] = "model_load"
    start: float
    end: float
    seconds: float
    from_cache: bool      # config and tokenizer from the on-disk cache (docs/protocol.md)
    reason: Literal["reload"]


@dataclass(slots=True, frozen=True)
class Settings(Event):
    type: ClassVar[str] = "settings"
    settings: SettingValues
    changed: list[str]
    # this change switched the weights to `dequantised` and the fp32 copy was made from the blocks
    # for it: how long that took, s (None: nothing was made; switching back frees the copy)
    fp32_made_s: float | None = None
    # this change chose int8 activations for the first time: their agreement with fp32 ones,
    # measured (engine/model/agreement.py): {positions, top1, max_logit_diff, seconds}; None otherwise
    int8_agreement: dict[str, float] | None = None


@dataclass(slots=True, frozen=True)
class Request(Event):
    type: ClassVar[str] = "request"
    id: str
    source: Source
    prompt_tokens: int | None
    max_new_tokens: int
    preview: str
    estimated: bool = False          # observe mode: prompt_tokens is an estimate
    label: str | None = None         # classroom: the student's name (source "join")


@dataclass(slots=True, frozen=True)
class Tokenized(Event):
    type: ClassVar[str] = "tokenized"
    id: str
    start: float
    end: float
    n: int
    ids: list[int]
    pieces: list[str]
    truncated: bool


@dataclass(slots=True, frozen=True)
class Admitted(Event):
    type: ClassVar[str] = "admitted"
    id: str
    slot: int
    queue_s: float
    blocks: int
    prompt_tokens: int
    cached_tokens: int
    resumed: bool
    instance: Instance | None = None   # disaggregated: the instance it happened on


@dataclass(slots=True, frozen=True)
class Preempted(Event):
    type: ClassVar[str] = "preempted"
    id: str
    tokens: int
    preemptions: int
    instance: Instance | None = None   # disaggregated: the instance it happened on


@dataclass(slots=True, frozen=True)
class Prefill(Event):
    type: ClassVar[str] = "prefill"
    id: str
    start: float
    end: float
    pos: int
    tokens: int
    done: bool
    instance: Instance | None = None   # disaggregated: the instance it happened on


@dataclass(slots=True, frozen=True)
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
    predicted_s: float | None = None   # the roofline's estimate of this forward (engine/timing/roofline.py)
    bound: Literal["memory", "compute"] | None = None   # the roof that bounds that estimate
    spec: dict[str, Speculated] | None = None   # requests that verified guesses in this forward
    first_shape: bool = False   # the first forward of its shape in this process (engine/model/runner.py SHAPES)
    # The weights this forward read (engine/model/linears.py Path): the format, what multiplied them
    # ("Q4_1/Q8_0 avx512": the blocks' types and the path, "oneDNN fp32", ...), and the bytes of
    # every weight it read (the roofline's).
    weights: str | None = None
    kernel: str | None = None
    weight_bytes: int | None = None
    instance: Instance | None = None   # disaggregated: the instance whose forward this was


@dataclass(slots=True, frozen=True)
class Token(Event):
    type: ClassVar[str] = "token"
    id: str
    index: int
    token_id: int | None
    text: str
    first: bool
    sampled: float | None
    sample_s: float | None
    # What the request's own client got with this token, where stop strings made it differ from
    # `text` (held back as a possible start of one, cut at one, or released at the end); None:
    # `text` itself. `text` stays the token's own, so the page draws one chip per token.
    client_text: str | None = None
    # speculative decoding: "accepted" (a guess the model agreed with), "corrected" (its own token
    # where it rejected one), "bonus" (its token after accepting all); None: a plain decode
    spec: Literal["accepted", "corrected", "bonus"] | None = None
    # What it was chosen from (engine/model/sampler.py Odds): its probability under the distribution it
    # was drawn from (temperature, top-p; greedy 1) and under the model's own (temperature 1, no
    # top-p); the most likely tokens by the model's own, first first; and, where it replaced a
    # rejected guess, that guess. None where not computed (observe mode: what the server sends).
    p: float | None = None
    p_raw: float | None = None
    top: list[Candidate] | None = None
    rejected: Candidate | None = None
    # The token decoded alone, as its candidates' texts are (the API's logprob `token`; `text` is
    # what it added to the output, "" inside a character). Not sent: the page has `text`.
    own_text: str | None = field(default=None, metadata=IN_PROCESS)
    # The first token of a request that asked for its prompt's log-probabilities carries them (the
    # API's echo with logprobs, vLLM's prompt_logprobs): per prompt token {token_id, text, own_text},
    # and after the first {rank, p_raw, top, ...} too (engine/core/engine.py). Not sent.
    prompt: list | None = field(default=None, metadata=IN_PROCESS)

    def client(self):
        """The text the request's client gets with this token (the API forwards it as it is)."""
        return self.text if self.client_text is None else self.client_text

    def to_dict(self):
        """On the wire a token is compact, since a busy engine sends a thousand a second to every
        page: its times to the microsecond, its probabilities to 3 significant digits (a bar's width,
        the page's uncertain marks, and a tiny one's exact value on hover), and `top` the page's
        SHOWN first candidates. The API reads
        the event itself, at full precision and with every candidate its request asked for."""
        out = Event.to_dict(self)
        out["t"], out["sampled"], out["sample_s"] = _round(self.t, 6), _round(self.sampled, 6), _round(self.sample_s, 6)
        out["p"], out["p_raw"] = wire_prob(self.p), wire_prob(self.p_raw)
        if self.top is not None:
            out["top"] = [[i, text, wire_prob(p), wire_prob(raw)] for i, text, p, raw in self.top[:SHOWN]]
        if self.rejected is not None:
            i, text, p, raw = self.rejected
            out["rejected"] = [i, text, wire_prob(p), wire_prob(raw)]
        return out


def _round(x, places=3):
    return None if x is None else round(x, places)


def wire_prob(x):
    """A probability to 3 significant digits: a tiny one stays itself (to 3 decimals, a
    temperature-1.5 token's 0.0004 was sent as 0, and the page said it was chosen with 0.0 %)."""
    return None if x is None else float(f"{x:.3g}")


@dataclass(slots=True, frozen=True)
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
    slo: SLOMark | None = None       # engine mode, completed requests: met or missed the SLOs
    spec_drafts: int | None = None        # steps in which it verified guesses (vLLM's num_drafts)
    spec_draft_tokens: int | None = None  # guesses verified
    spec_accepted_tokens: int | None = None   # ... of which accepted


@dataclass(slots=True, frozen=True)
class KVTransfer(Event):
    """Disaggregated: one request's keys and values copied from the prefill instance's blocks
    into blocks the decode instance allocated (engine/disagg/), measured on the decode
    instance, which pulls them (as vLLM's NixlConnector reads)."""
    type: ClassVar[str] = "kv_transfer"
    id: str
    start: float
    end: float
    tokens: int            # positions whose keys and values moved
    bytes: int             # bytes copied (tokens x hello.kv_bytes_per_token)
    src_blocks: list[int]  # on the prefill instance, in order
    dst_blocks: list[int]  # on the decode instance, in the same order


@dataclass(slots=True, frozen=True)
class Rejected(Event):
    type: ClassVar[str] = "rejected"
    id: str
    reason: str
    code: str


@dataclass(slots=True, frozen=True)
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
    server: dict[str, Any] | None = None    # observe mode: the server's own figures, mapped by its profile
    goodput: float | None = None            # requests/s that met both SLOs, last 30 s (None: none judged yet)
    slo_attainment: float | None = None     # fraction of the requests judged in that window that met both
    slo_met: int | None = None              # completed requests that met both, since the last reset
    slo_judged: int | None = None           # completed requests judged, since the last reset
    prefill_cap: int | None = None          # prompt tokens per step the max_step_ms target allows now (None: off)
    measured_by: dict[str, str] | None = None   # observe mode: each figure -> "server" or "client"
    instance: Instance | None = None        # disaggregated: whose queue, slots and blocks these are
    rss_bytes: int | None = None            # engine mode: the server process's resident memory, measured (None: the OS does not say)


@dataclass(slots=True, frozen=True)
class Preset(Event):
    type: ClassVar[str] = "preset"
    name: str
    title: str
    explain: str
    watch: str
    overrides: SettingValues   # settings changed from the preset's own (one side of a comparison)
    requests: int               # how many requests its bursts will submit


@dataclass(slots=True, frozen=True)
class Measure(Event):
    type: ClassVar[str] = "measure"
    status: Literal["running", "done", "error"]
    batches: list[int]
    contexts: list[int]
    decode: list[DecodePoint] | None = None
    kv: list[KVPoint] | None = None
    prefill: list[PrefillPoint] | None = None
    skipped: list[SkippedPoint] | None = None   # points the free KV blocks could not hold, and why
    seconds: float | None = None
    message: str | None = None         # status "error": what went wrong
    points_done: int | None = None     # status "running": points timed so far (decode and kv) ...
    points_total: int | None = None    # ... of this many
    eta_s: float | None = None         # status "running": seconds left, estimated from the points so far
    weights: str | None = None         # the `weights` format the sweep read ("stored" or "dequantised")


@dataclass(slots=True, frozen=True)
class Sync(Event):
    type: ClassVar[str] = "sync"
    client_t: float
    server_time: float


@dataclass(slots=True, frozen=True)
class Reset(Event):
    type: ClassVar[str] = "reset"
    cached_blocks: int | None = None   # blocks still holding a reusable prefix after it (0; observe mode: None)


@dataclass(slots=True, frozen=True)
class Dropped(Event):
    type: ClassVar[str] = "dropped"
    count: int


@dataclass(slots=True, frozen=True)
class Error(Event):
    type: ClassVar[str] = "error"
    message: str
    field: str | None = None
    fatal: bool = False     # the engine stopped: every request in flight failed, /healthz is 503


EVENT_TYPES = (Hello, Loading, Settings, Request, Tokenized, Admitted, Preempted, Prefill, Step, Token,
               Finished, KVTransfer, Rejected, Stats, Preset, Measure, ModelLoad, Sync, Reset, Dropped, Error)
