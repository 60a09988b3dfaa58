"""Server profiles for observe mode: which server is behind an OpenAI-compatible URL, and how
its Prometheus `/metrics` maps onto the page's one vocabulary.

A profile is data, not code: how to recognise the server (a series name only it exports),
where its version is (`/version`, `/server_info`, `/info`, `/props`), which series give each
page gauge and which counters become rates. `scrape.py` scrapes; this module reads.

The page vocabulary (every key is always present; `None` = "not exposed by this server"):

  gauges  running          requests in the server's running batch
          waiting          requests queued (not yet running)
          kv_usage         KV-cache usage, 0..1
          prefix_hit_rate  prefix-cache hit rate as the server itself computes it, 0..1
          spec_accept_rate speculative decoding: accepted / drafted, as the server computes it
          spec_accept_length speculative decoding: mean accepted length per step (SGLang)
          batch_size       requests per forward step (see NOTES: some are lifetime means)
  rates   <counter>_per_s  for prompt_tokens, generated_tokens, prefix_queries, prefix_hits,
                           preemptions, spec_drafted, spec_accepted, steps, step_tokens:
                           the counter's increase over the last scrape interval / its length
  ratios  prefix_hit_ratio hits / queries over the interval (tokens)
          spec_acceptance  accepted / drafted over the interval
          tokens_per_step  step tokens / steps over the interval

Sources for the names (each fixture in tests/data/metrics/ says where it came from):
vLLM vllm/v1/metrics/loggers.py (V1) and vllm/engine/metrics.py (V0); SGLang
python/sglang/srt/metrics/collector.py; TGI docs/source/reference/metrics.md; llama.cpp
tools/server/server-task.cpp (`server_task_result_metrics::to_metrics`) and a capture of a
server built here; First Token server/metrics.py.
"""
from dataclasses import dataclass, field
import math
import re

GAUGES = ("running", "waiting", "kv_usage", "prefix_hit_rate", "spec_accept_rate", "spec_accept_length",
          "batch_size")
COUNTERS = ("prompt_tokens", "generated_tokens", "prefix_queries", "prefix_hits", "preemptions",
            "spec_drafted", "spec_accepted", "steps", "step_tokens")
RATIOS = {"prefix_hit_ratio": ("prefix_hits", "prefix_queries"),
          "spec_acceptance": ("spec_accepted", "spec_drafted"),
          "tokens_per_step": ("step_tokens", "steps")}


@dataclass(frozen=True)
class Series:
    """One figure from one or more series: their samples (with `labels`, when given) summed,
    or averaged (`mean`, for ratios reported per engine/model/loading). Several names are summed
    together (llama.cpp's prefix queries = prompt tokens computed + prompt tokens cached)."""
    names: tuple
    labels: tuple = ()          # ((label, value), ...) a sample must carry
    mean: bool = False

    def read(self, samples):
        values = []
        for name in self.names:
            found = [v for labels, v in samples.get(name, ()) if all(labels.get(k) == w for k, w in self.labels)]
            if not found:
                return None          # a part missing makes the whole unknown, not smaller
            values.append(sum(found) / len(found) if self.mean else sum(found))
        return sum(values)


def S(*names, labels=(), mean=False):
    return Series(tuple(names), tuple(labels), mean)


@dataclass(frozen=True)
class Profile:
    kind: str                    # stable id on the wire: vllm, vllm-v0, sglang, tgi, llamacpp, first-token
    title: str                   # what the page says: "observing <title> <version>"
    marker: tuple                # it is this server when any of these series is present...
    prefix: str = ""             # ...or, failing a marker, any series starts with this
    gauges: dict = field(default_factory=dict)     # page gauge -> Series (first one present wins)
    counters: dict = field(default_factory=dict)   # page counter -> Series
    info: tuple = ()             # (path, json key of the version) tried in order
    slots: str | None = None     # per-slot state (llama.cpp's /slots)
    version_label: tuple = ()    # (series, label, format): a version carried by /metrics itself
    # Requests carry a random `seed` of the observer's choosing when they have none, so that
    # the server's slots (which report each request's sampling parameters, but its prompt only
    # in a debug mode) say which request they hold. Only where sampling is seeded per request
    # anyway (llama.cpp: a request without one gets a random seed); vLLM's seeded requests take
    # a slower sampling path, so it is never done there.
    tag_seed: bool = False
    notes: dict = field(default_factory=dict)      # key -> how the server measures it, when not obvious


def first(*series):
    return tuple(series)


VLLM_COMMON = {
    "prompt_tokens": S("vllm:prompt_tokens_total"), "generated_tokens": S("vllm:generation_tokens_total"),
    "preemptions": S("vllm:num_preemptions_total"),
    "steps": S("vllm:iteration_tokens_total_count"), "step_tokens": S("vllm:iteration_tokens_total_sum"),
}
VLLM_PREFIX = {"prefix_queries": S("vllm:prefix_cache_queries_total"), "prefix_hits": S("vllm:prefix_cache_hits_total")}
VLLM_SPEC = {"spec_drafted": S("vllm:spec_decode_num_draft_tokens_total"),
             "spec_accepted": S("vllm:spec_decode_num_accepted_tokens_total")}

PROFILES = (
    Profile("first-token", "First Token", marker=("first_token_info",), prefix="first_token:",
            gauges={"running": first(S("vllm:num_requests_running")),
                    "waiting": first(S("vllm:num_requests_waiting")),
                    "kv_usage": first(S("vllm:kv_cache_usage_perc", mean=True))},
            # vLLM V1's counters, less the iteration histogram (our /metrics has none)
            counters={**{k: v for k, v in VLLM_COMMON.items() if not k.startswith("step")}, **VLLM_PREFIX, **VLLM_SPEC},
            version_label=("first_token_info", "protocol", "protocol {}")),
    # vLLM V1 (0.8+): kv_cache_usage_perc (gpu_cache_usage_perc before 0.10), prefix caching as
    # two counters, speculative decoding as counters; no acceptance gauge.
    Profile("vllm", "vLLM", marker=("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total"),
            gauges={"running": first(S("vllm:num_requests_running")),
                    "waiting": first(S("vllm:num_requests_waiting")),
                    "kv_usage": first(S("vllm:kv_cache_usage_perc", mean=True),
                                      S("vllm:gpu_cache_usage_perc", mean=True))},
            counters={**VLLM_COMMON, **VLLM_PREFIX, **VLLM_SPEC},
            info=(("/version", "version"),)),
    # vLLM V0 (before 0.8, and V1's first releases): usage and hit rate as gauges.
    Profile("vllm-v0", "vLLM (V0 metrics)", marker=(), prefix="vllm:",
            gauges={"running": first(S("vllm:num_requests_running")),
                    "waiting": first(S("vllm:num_requests_waiting")),
                    "kv_usage": first(S("vllm:gpu_cache_usage_perc", mean=True)),
                    "prefix_hit_rate": first(S("vllm:gpu_prefix_cache_hit_rate", mean=True)),
                    "spec_accept_rate": first(S("vllm:spec_decode_draft_acceptance_rate", mean=True))},
            counters={**VLLM_COMMON, **VLLM_SPEC},
            info=(("/version", "version"),)),
    Profile("sglang", "SGLang", marker=(), prefix="sglang:",
            gauges={"running": first(S("sglang:num_running_reqs")),
                    "waiting": first(S("sglang:num_queue_reqs")),
                    "kv_usage": first(S("sglang:token_usage", mean=True)),
                    "prefix_hit_rate": first(S("sglang:cache_hit_rate", mean=True)),
                    "spec_accept_rate": first(S("sglang:spec_accept_rate", mean=True)),
                    "spec_accept_length": first(S("sglang:spec_accept_length", mean=True)),
                    "batch_size": first(S("sglang:num_running_reqs"))},
            counters={"prompt_tokens": S("sglang:prompt_tokens_total"),
                      "generated_tokens": S("sglang:generation_tokens_total"),
                      "prefix_queries": S("sglang:prompt_tokens_total"),
                      "prefix_hits": S("sglang:cached_tokens_total"),
                      "preemptions": S("sglang:num_retracted_requests_total")},
            info=(("/server_info", "version"), ("/get_server_info", "version")),
            notes={"preemptions": "SGLang's retracted requests",
                   "batch_size": "the running batch (sglang:num_running_reqs)"}),
    Profile("tgi", "Text Generation Inference", marker=(), prefix="tgi_",
            gauges={"running": first(S("tgi_batch_current_size")),
                    "waiting": first(S("tgi_queue_size")),
                    "batch_size": first(S("tgi_batch_current_size"))},
            counters={"prompt_tokens": S("tgi_request_input_length_sum"),
                      "generated_tokens": S("tgi_request_generated_tokens_sum"),
                      "steps": S("tgi_batch_inference_count", labels=(("method", "decode"),))},
            info=(("/info", "version"),),
            notes={"prompt_tokens": "counted when a request finishes (a per-request histogram's sum)",
                   "generated_tokens": "counted when a request finishes (a per-request histogram's sum)",
                   "steps": "decode forwards only"}),
    Profile("llamacpp", "llama.cpp server", marker=(), prefix="llamacpp:",
            gauges={"running": first(S("llamacpp:requests_processing")),
                    "waiting": first(S("llamacpp:requests_deferred")),
                    "kv_usage": first(S("llamacpp:kv_cache_usage_ratio")),   # builds before mid-2025 only
                    "batch_size": first(S("llamacpp:n_busy_slots_per_decode"))},
            counters={"prompt_tokens": S("llamacpp:prompt_tokens_total"),
                      "generated_tokens": S("llamacpp:tokens_predicted_total"),
                      "prefix_queries": S("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
                      "prefix_hits": S("llamacpp:prompt_tokens_cached_total"),
                      "spec_drafted": S("llamacpp:spec_decode_num_draft_tokens_total"),
                      "spec_accepted": S("llamacpp:spec_decode_num_accepted_tokens_total"),
                      "steps": S("llamacpp:n_decode_total")},
            info=(("/props", "build_info"),), slots="/slots", tag_seed=True,
            # Seen on a server built here (b1-0c1e570): generated and draft tokens are added to
            # the counters when a request ends, prompt tokens when a prompt batch is done, so
            # their rates come in bursts; llama_decode() calls are counted as they happen. So
            # there is no tokens-per-step ratio: it would divide end-of-request counts by steps.
            notes={"batch_size": "busy slots per llama_decode() call, averaged since the server started",
                   "prompt_tokens": "prompt tokens computed (cached ones excluded), added when a prompt batch is done",
                   "generated_tokens": "added to the server's counter when each request ends: the rate comes in bursts",
                   "spec_drafted": "added when each request ends", "spec_accepted": "added when each request ends",
                   "steps": "llama_decode() calls, counted as they happen (drafts excluded)"}),
)
BY_KIND = {p.kind: p for p in PROFILES}

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
MAX_TEXT = 4 << 20      # a /metrics body past this is not read (a server gone wrong, or not a server)


def parse(text):
    """{series name: [(labels, value), ...]} from Prometheus text, line by line: a line that
    does not parse, or a value that is not a finite number, is skipped, so one bad line costs
    that line only (prometheus_client's parser gives up on the whole text)."""
    samples = {}
    for line in text[:MAX_TEXT].splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line.strip())
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        samples.setdefault(m.group(1), []).append((labels, value))
    return samples


def detect(samples):
    """The profile of the server that produced these samples, or None (no known names)."""
    for p in PROFILES:
        if any(name in samples for name in p.marker):
            return p
    for p in PROFILES:
        if p.prefix and any(name.startswith(p.prefix) for name in samples):
            return p
    return None


def read_gauges(profile, samples):
    """Every page gauge: the first of its series present, else None."""
    out = dict.fromkeys(GAUGES)
    for key, choices in (profile.gauges if profile else {}).items():
        for series in choices:
            value = series.read(samples)
            if value is not None:
                out[key] = value
                break
    return out


def read_counters(profile, samples):
    counters = profile.counters if profile else {}
    return {key: (counters[key].read(samples) if key in counters else None) for key in COUNTERS}


class Rates:
    """Counters into rates over the scrape interval. A counter that went down (the server
    restarted) or vanished gives None for that interval and starts again from its new value."""

    def __init__(self):
        self._last = None   # (t, {counter: value})

    def update(self, t, counters):
        last, self._last = self._last, (t, counters)
        rates = {f"{k}_per_s": None for k in COUNTERS}
        deltas = {}
        if last is not None and t > last[0]:
            dt = t - last[0]
            for k in COUNTERS:
                a, b = last[1].get(k), counters.get(k)
                if a is not None and b is not None and b >= a:
                    deltas[k] = b - a
                    rates[f"{k}_per_s"] = (b - a) / dt
        ratios = {name: (deltas[num] / deltas[den] if deltas.get(den) and num in deltas else None)
                  for name, (num, den) in RATIOS.items()}
        return rates, ratios

    def reset(self):
        self._last = None


def label_version(profile, samples):
    """The version a profile carries in /metrics itself (First Token's protocol), or None."""
    if not profile or not profile.version_label:
        return None
    series, label, fmt = profile.version_label
    for labels, _ in samples.get(series, ()):
        if isinstance(labels.get(label), str):
            return fmt.format(labels[label][:40])
    return None


def exposed(profile):
    """What the page can draw for this server: the gauges and rates it maps (the rest are
    "not exposed by this server"), and how some are measured (`notes`)."""
    if profile is None:
        return {"gauges": [], "rates": [], "ratios": [], "notes": {}}
    counters = set(profile.counters)
    return {"gauges": [k for k in GAUGES if k in profile.gauges],
            "rates": [f"{k}_per_s" for k in COUNTERS if k in counters],
            "ratios": [r for r, (a, b) in RATIOS.items() if a in counters and b in counters],
            "notes": dict(profile.notes)}


def slot_view(raw, ours):
    """llama.cpp's /slots JSON as the page's slot rows: id, whether it is busy, which of our
    requests it holds, and its counts. `ours` maps our in-flight request ids to (prompt, seed)
    as sent: a slot is ours when its `params.seed` is that seed (see Profile.tag_seed), or,
    when the server reports prompts (its debug mode), when our prompt is in its prompt text.
    The server's prompt and output texts are never passed on: other clients' requests may be
    in those slots."""
    if not isinstance(raw, list):
        return None
    rows = []
    for slot in raw[:256]:
        if not isinstance(slot, dict) or type(slot.get("id")) is not int:
            continue
        busy = slot.get("is_processing") is True
        nxt = slot.get("next_token")
        nxt = nxt[0] if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict) else (
            nxt if isinstance(nxt, dict) else {})
        text = slot.get("prompt") if isinstance(slot.get("prompt"), str) else ""
        params = slot.get("params") if isinstance(slot.get("params"), dict) else {}
        rows.append({"id": slot["id"], "busy": busy,
                     "request": _match(params.get("seed"), text, ours) if busy else None,
                     "n_ctx": _count(slot.get("n_ctx")),
                     "prompt_tokens": _count(slot.get("n_prompt_tokens")),
                     "cached_tokens": _count(slot.get("n_prompt_tokens_cache")),
                     "decoded": _count(nxt.get("n_decoded")) if busy else None,
                     "remaining": _count(nxt.get("n_remain")) if busy else None})
    return rows


def _count(v):
    return v if type(v) is int and v >= 0 else None


def _match(seed, text, ours):
    """Our request with this seed, else the one whose prompt appears in the slot's prompt
    (longest first: one prompt may contain another); None when the slot holds some other
    client's request. Whitespace is compared collapsed: the chat template and detokenization
    may change it."""
    if type(seed) is int:
        hits = [rid for rid, (_, s) in ours.items() if s == seed]
        if len(hits) == 1:
            return hits[0]
    text = " ".join(text.split())
    if not text:
        return None
    best = None
    for rid, (prompt, _) in ours.items():
        probe = " ".join(prompt.split())[:200]
        if probe and probe in text and (best is None or len(probe) > best[1]):
            best = (rid, len(probe))
    return best[0] if best else None
