"""Named, validated controls: the single validation layer for every client, and the typed
value each part of the engine is handed.

A setting has a kind, bounds and a note on when it applies (`Setting`: the registry, from
which the page's controls, `hello.limits` and the schema's settings are made). The websocket
`set` message, presets, URL parameters and the CLI all go through `validate()`, so a bad
value gets the same clear error everywhere and never half-applies.

Inside, the values are one frozen `Settings` of five parts, each with one owner: `load` (the
driver's load generator), `sampling` (the defaults a request leaves out), `scheduling` (the
scheduler and the runner's weights), `delivery` (server/delivery.py's proxy and network) and
`targets` (the recorder's SLOs). A change makes a new `Settings` (`replace`); the engine hands
each owner its part. The wire keeps one flat `{name: value}` dict (`wire`, `from_wire`: the one
place names become fields). The parts' fields and the registry's names are checked against
each other whenever the registry is made (`check_registry`), so they cannot drift apart.
"""
from dataclasses import dataclass, fields, replace
from enum import Enum
import math
import sys
from typing import TypedDict

from .core.queues import QUEUES


class Policy(str, Enum):
    """The scheduler's policies (the `schedule` setting; engine/core/policies.py says what each does)."""
    MIXED = "mixed"
    PREFILL_FIRST = "prefill-first"
    STATIC = "static"


POLICIES = tuple(p.value for p in Policy)
SPECULATION = ("off", "ngram", "suffix")   # engine/model/speculate.py's proposers
MAX_SPEC_TOKENS = 8


class SettingError(ValueError):
    """A client supplied a bad value; `field` names what was wrong."""

    def __init__(self, field, message):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str            # "int", "float", "bool" or "choice"
    default: object
    min: float = 0
    max: float = 0
    step: float = 1
    applies: str = "live"  # "live" or "new requests"
    doc: str = ""
    choices: tuple = ()    # the allowed values of a "choice"

    def describe(self):
        out = {"kind": self.kind, "min": self.min, "max": self.max, "step": self.step,
               "applies": self.applies, "doc": self.doc, "default": self.default}
        if self.kind == "choice":
            out["choices"] = list(self.choices)
        return out


def surrogate_problem(text):
    """Why `text` is not Unicode text at all (a lone surrogate, such as the "\\ud800" JSON
    allows: it cannot be encoded, and the tokenizer raises TypeError on it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"contains a lone surrogate ({text[e.start]!r} at character {e.start}), which is not text"
    return None


def text_problem(text):
    """Why the tokenizer should not take this string (a NUL, or a lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    return surrogate_problem(text)


def check_text(field, text):
    """`text`, or SettingError naming `field` when the tokenizer cannot take it (`text_problem`)."""
    problem = text_problem(text)
    if problem:
        raise SettingError(field, problem)
    return text


def finite_number(value):
    """Whether `value` is a number (not a bool) a float can hold: finite, and for an integer, within
    float's range. JSON has integers of any length, and `float()` of a 400-digit one raises
    OverflowError (as does `math.isfinite`), so the range is checked before any conversion (Python
    compares an int with a float exactly)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return -sys.float_info.max <= value <= sys.float_info.max
    return math.isfinite(value)


def _digits(n):
    """How many decimal digits the positive integer `n` has, without str(n) (which refuses more than
    4,300 digits): from its bit length, corrected by exact comparisons."""
    d = max(1, int(n.bit_length() * 0.30102999566398120))
    while 10 ** d <= n:
        d += 1
    while d > 1 and 10 ** (d - 1) > n:
        d -= 1
    return d


def shown(value, limit=40):
    """`value` as an error message quotes it: its repr, cut to `limit` characters (a client's value
    may be a 4,000-digit integer or a long string; the message names the problem, not all of it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {_digits(abs(value))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def coerce(field, kind, value, lo=None, hi=None):
    """Return `value` as `kind` if it is one and within [lo, hi]; raise SettingError otherwise."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise SettingError(field, f"must be true or false, got {shown(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(field, f"must be a number, got {shown(value)}")
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise SettingError(field, f"must be a whole number, got {shown(value)}")
        value = int(value)
    elif not finite_number(value):
        raise SettingError(field, f"must be finite (a number a float holds), got {shown(value)}")
    else:
        value = float(value)
    if lo is not None and value < lo:
        raise SettingError(field, f"must be at least {lo}, got {shown(value)}")
    if hi is not None and value > hi:
        raise SettingError(field, f"must be at most {hi}, got {shown(value)}")
    return value


ACTIVATIONS = ("fp32", "int8")


def make_settings(max_slots, cache_tokens_max, block_size, max_context, weight_formats=("dequantised",),
                  activations=ACTIVATIONS[:1]):
    """The engine's controls; bounds depend on the engine's start-up capacity, the `weights`
    choices on the copies of the weights this model has (engine/model/linears.py Formats), and the
    `activations` choices on whether it has blocks the int8 arithmetic reads."""
    prompt_max = max(16, min(2048, max_context - 16))
    specs = [
        Setting("load", "bool", False, doc="load generator on/off"),
        Setting("rate", "float", 1.0, 0.05, 16.0, 0.05, doc="load arrival rate, requests/s (Poisson)"),
        Setting("prompt_tokens", "int", 128, 16, prompt_max, 16, "new requests",
                doc="prompt length of load-generator requests, tokens"),
        Setting("max_new_tokens", "int", 64, 1, 512, 1, "new requests", doc="tokens to generate per request"),
        Setting("temperature", "float", 0.0, 0.0, 2.0, 0.05, "new requests", doc="0 = greedy"),
        Setting("top_p", "float", 1.0, 0.05, 1.0, 0.05, "new requests", doc="nucleus sampling mass"),
        Setting("slots", "int", max_slots, 1, max_slots, 1,
                doc="batch slots: most requests decoded together (running ones above a lowered limit finish)"),
        Setting("cache_tokens", "int", cache_tokens_max, block_size, cache_tokens_max, block_size,
                doc="KV-cache budget in tokens: most blocks in use at once (above it the newest request is preempted)"),
        Setting("kv_cache", "bool", True, applies="new requests",
                doc="off: every decode step recomputes the whole sequence (running requests finish first)"),
        Setting("schedule", "choice", "mixed", applies="next step", choices=POLICIES,
                doc="mixed: decodes and prompt chunks share each step (vLLM V1); prefill-first: whole "
                    "prompts first, decodes wait (vLLM v0); static: a batch runs to completion before the next"),
        Setting("scheduling_policy", "choice", "fcfs", applies="next step", choices=tuple(QUEUES),
                doc="the waiting queue's order and whom to preempt (vLLM's --scheduling-policy): "
                    + "; ".join(q.summary for q in QUEUES.values())),
        Setting("max_batched_tokens", "int", 256, 16, 4096, 16,
                doc="token budget of one step: decode tokens plus prompt chunks (vLLM's max_num_batched_tokens)"),
        Setting("max_step_ms", "int", 0, 0, 5000, 5,
                doc="step-time target for mixed steps, ms (0 = off): prompt chunks cut so a step's measured "
                    "cost stays under it; streams steady, prompts take more steps"),
        Setting("prefix_caching", "bool", True,
                doc="reuse the KV blocks of a prompt prefix seen before (full blocks, chained hashes)"),
        Setting("speculation", "choice", "off", choices=SPECULATION,
                doc="speculative decoding: guess each decoding request's next tokens and verify them in "
                    "its step (ngram: prompt lookup; suffix: this and earlier requests' text)"),
        Setting("spec_tokens", "int", 4, 1, MAX_SPEC_TOKENS, 1,
                doc="guesses per request per step (vLLM's num_speculative_tokens); each costs a token of the budget"),
        Setting("buffer_ms", "int", 0, 0, 5000, 50,
                doc="a buffering proxy between the server and every client: flushes every N ms (0 = off)"),
        Setting("buffer_bytes", "int", 0, 0, 65536, 64,
                doc="... or once it holds N bytes (0 = off); the engine's own times do not change"),
        Setting("net_latency_ms", "int", 0, 0, 5000, 10,
                doc="injected network delay on every delivery to pages and API/phone streams, ms"),
        Setting("net_jitter_ms", "int", 0, 0, 2000, 10,
                doc="injected jitter: up to N ms more per piece, order kept"),
        Setting("weights", "choice", weight_formats[0], applies="next step", choices=tuple(weight_formats),
                doc="which copy of the weights the linear layers read: stored (the file's 4-bit blocks, "
                    "through the fused kernel) or dequantised (fp32, 5.6x the bytes; made from the blocks "
                    "when chosen, freed when left)"),
        Setting("activations", "choice", activations[0], applies="next step", choices=tuple(activations),
                doc="the arithmetic of the 4-bit layers (weights stored): fp32 (the result equals fp32 "
                    "matmul on the dequantised weights) or int8 (each row rounded to int8 per 32 values "
                    "as llama.cpp rounds them, integer dot products: faster, not equal; the Q8_0 head "
                    "keeps fp32)"),
        Setting("slo_ttft_ms", "int", 2000, 50, 60000, 50, "finished requests",
                doc="service-level objective for time to first token, ms (goodput counts requests meeting both)"),
        Setting("slo_tpot_ms", "int", 100, 5, 5000, 5, "finished requests",
                doc="service-level objective for time per output token after the first, ms"),
    ]
    specs = {s.name: s for s in specs}
    check_registry(specs)
    return specs


def validate(specs, changes):
    """Validate a {name: value} dict against `specs`; return the coerced dict or raise."""
    if not isinstance(changes, dict) or not changes:
        raise SettingError("settings", "must be a non-empty object of {name: value}")
    out = {}
    for name, value in changes.items():
        spec = specs.get(name)
        if spec is None:
            raise SettingError(name, f"unknown setting {name[:40]!r} (known: {', '.join(sorted(specs))})")
        if spec.kind == "choice":
            if value not in spec.choices:
                raise SettingError(name, f"must be one of {', '.join(spec.choices)}, got {shown(value)}")
            out[name] = value
            continue
        bounded = spec.kind != "bool"
        out[name] = coerce(name, spec.kind, value, spec.min if bounded else None, spec.max if bounded else None)
    return out


@dataclass(frozen=True)
class LoadSettings:
    """The load generator's (the driver's load thread, engine/teach/loadgen.py)."""
    load: bool
    rate: float
    prompt_tokens: int


@dataclass(frozen=True)
class SamplingSettings:
    """What a request that leaves them out samples with (`GenerateRequest.sampling`)."""
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class SchedulingSettings:
    """The scheduler's (`Scheduler.apply`), the engine's `kv_cache` and the runner's `weights` and
    `activations`."""
    slots: int
    cache_tokens: int
    kv_cache: bool
    schedule: str
    scheduling_policy: str
    max_batched_tokens: int
    max_step_ms: int
    prefix_caching: bool
    speculation: str
    spec_tokens: int
    weights: str
    activations: str


@dataclass(frozen=True)
class DeliverySettings:
    """What lies between the server and its clients (server/delivery.py); all 0: nothing."""
    buffer_ms: int
    buffer_bytes: int
    net_latency_ms: int
    net_jitter_ms: int

    def configured(self):
        """Whether anything stands between the server and its clients."""
        return any((self.buffer_ms, self.buffer_bytes, self.net_latency_ms, self.net_jitter_ms))


@dataclass(frozen=True)
class Targets:
    """The SLOs finished requests are judged by (the recorder)."""
    slo_ttft_ms: int
    slo_tpot_ms: int


@dataclass(frozen=True)
class Settings:
    """Every setting's value now, by owner. Never changed: `replace` makes the next one."""
    load: LoadSettings
    sampling: SamplingSettings
    scheduling: SchedulingSettings
    delivery: DeliverySettings
    targets: Targets

    @classmethod
    def from_wire(cls, flat):
        """The typed value of a complete, validated flat dict (`defaults`, `hello.settings`)."""
        return cls(**{part.name: part.type(**{f.name: flat[f.name] for f in fields(part.type)})
                      for part in fields(cls)})

    def wire(self):
        """The flat `{name: value}` dict the protocol carries (`hello.settings`, `settings` events)."""
        return {f.name: getattr(getattr(self, part.name), f.name)
                for part in fields(self) for f in fields(part.type)}

    def replace(self, changes):
        """A new value with validated `changes` (`validate`'s {name: value}) applied; this one
        is left as it was."""
        parts = {}
        for part in fields(self):
            mine = {f.name: changes[f.name] for f in fields(part.type) if f.name in changes}
            if mine:
                parts[part.name] = replace(getattr(self, part.name), **mine)
        return replace(self, **parts)


KINDS = {"int": int, "float": float, "bool": bool, "choice": str}   # a Setting's kind -> its field's type


def field_types():
    """{name: type} of every field of `Settings`'s parts, in their order."""
    return {f.name: f.type for part in fields(Settings) for f in fields(part.type)}


def check_registry(specs):
    """Raise unless the registry (`make_settings`) names exactly the fields of `Settings`'s
    parts, each of the type its kind gives: the two are written apart, and must not drift."""
    typed = field_types()
    if set(typed) != set(specs):
        raise TypeError(f"the settings registry and Settings differ: only in the registry "
                        f"{sorted(set(specs) - set(typed))}, only in Settings {sorted(set(typed) - set(specs))}")
    wrong = [name for name, spec in specs.items() if KINDS[spec.kind] is not typed[name]]
    if wrong:
        raise TypeError(f"these settings' kinds and Settings fields' types differ: {wrong}")


def wire_type():
    """The flat wire dict's type (a TypedDict): every setting by name, of its field's type, none
    required (observe mode has only some; a `set` or a preset names a few). The schema's
    settings objects are made from it (engine/events.py `SettingValues`)."""
    values = TypedDict("SettingValues", field_types(), total=False)
    values.__doc__ = "Settings by name (engine/settings.py's registry); any subset of them."
    return values


def defaults(specs):
    """Every setting at its default."""
    return Settings.from_wire({name: spec.default for name, spec in specs.items()})


class Live:
    """One backend's settings for readers on any thread: `now`, an immutable `Settings`, is
    replaced whole on each change (an attribute swap: a reader sees the old value or the new,
    never half of each). Read `now` once where several values must agree."""

    def __init__(self, now):
        self.now = now
