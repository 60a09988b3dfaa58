"""Prometheus metrics under vLLM's names, fed from the engine's own events.

Every figure is one the engine already measured and published on the timeline, so /metrics
and the page can never disagree. The listener runs in the engine thread on every event:
it only updates counters and a couple of dicts. Names, meanings and buckets follow vLLM's
(v1) so existing dashboards work:

    vllm:time_to_first_token_seconds    finished.ttft (arrival -> first token handed out)
    vllm:inter_token_latency_seconds    each gap between consecutive forwards that gave a request
                                        tokens (a speculating forward's several tokens: one gap, as vLLM)
    vllm:time_per_output_token_seconds  the same observations under vLLM's older name
    vllm:e2e_request_latency_seconds    finished.e2e
    vllm:request_queue_time_seconds     admitted.queue_s
    vllm:request_prefill_time_seconds   first scheduled -> first token (ttft - tokenize - queue)
    vllm:request_decode_time_seconds    first token -> last token
    vllm:num_requests_running/_waiting  tracked from request/admitted/finished/rejected events
    vllm:kv_cache_usage_perc            KV blocks in use / all blocks (0..1), from step and stats
    vllm:prefix_cache_queries_total     prompt tokens looked up in the prefix cache (admitted.prompt_tokens)
    vllm:prefix_cache_hits_total        ... of which found there (admitted.cached_tokens)
    vllm:num_preemptions_total          preempted events
    vllm:prompt_tokens_total            prompt tokens of admitted requests (cached ones included, as vLLM counts)
    vllm:generation_tokens_total        tokens generated
    vllm:request_success_total          finished requests by finished_reason: stop (EOS or a stop
                                        string), length, abort (cancelled), error
    vllm:request_prompt_tokens          each finished request's prompt tokens (finished.prompt_tokens)
    vllm:request_generation_tokens      ... and tokens generated (finished.output_tokens)
    vllm:request_params_max_tokens      ... and the max_tokens it asked (request.max_new_tokens); these
                                        three with vLLM's 1-2-5 buckets up to the context
    vllm:iteration_tokens_total         tokens each forward computed (step.tokens: prompt + decode)
    vllm:cache_config_info{block_size, num_gpu_blocks, cache_dtype, enable_prefix_caching}  always 1:
                                        the KV cache's configuration (hello, the prefix_caching setting)
    vllm:spec_decode_num_drafts_total   speculative decoding: requests' steps that verified guesses (step.spec)
    vllm:spec_decode_num_draft_tokens_total     guesses verified
    vllm:spec_decode_num_accepted_tokens_total  ... of which accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position}  accepted guesses at draft
                                        position 0, 1, ... (a run from 0: position i counts steps
                                        that accepted more than i). Acceptance rate = accepted /
                                        draft tokens; mean acceptance length = 1 + accepted / drafts.
    vllm:nixl_xfer_time_seconds         disaggregated (--disaggregate): each kv_transfer's end - start,
                                        vLLM's NixlConnector histogram and buckets (the copy here is a
                                        shared-memory read, not NIXL; the name is kept for dashboards)
    vllm:nixl_bytes_transferred         ... each kv_transfer's bytes: the rows copied, tokens x kv_bytes_per_token
                                        (vLLM's buckets, 2 KiB to 8 GiB; vLLM moves whole blocks)
    first_token_info{protocol}          always 1: says this is First Token (observe mode's profiles
                                        tell it from vLLM by this series; observe/profiles.py)

and First Token's own (vLLM has no such metrics), from the same events:

    first_token:slo_requests_total      completed requests judged against the SLOs (the
                                        slo_ttft_ms / slo_tpot_ms settings), by slo = met | missed
    first_token:goodput_requests_per_s  requests/s that met both, over the last 30 s (stats.goodput)
    first_token:slo_attainment          fraction of the requests judged in that window that met both
    first_token:model_load_seconds      how long the model's last load took (the start's, or a reload's)
    first_token:model_loads_total       reloads since start (model_load events)
    first_token:weight_bytes_per_decode_step{format}  bytes of weights a batch-1 decode step reads
                                        in the `weights` format in force (hello.weights; one series,
                                        labelled with that format: stored or dequantised)
    first_token:weight_bytes_read_total{format}  bytes of weights the forwards read (step.weight_bytes),
                                        by the format each read: its rate is the weight traffic
    first_token:kv_transfer_tokens_total  disaggregated: prompt positions whose keys and values the
                                        decode instance copied (kv_transfer.tokens; vLLM has no such count)

Disaggregated, the vLLM series that a vLLM P/D pair reports per instance are one here: a
request's prompt is counted (and its queue time observed) at its admission on the prefill
instance, not again on the decode instance, and `vllm:kv_cache_usage_perc` is the decode
instance's (hello.cache_blocks is its).
"""
from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import events as ev_types
from engine.settings import MAX_SPEC_TOKENS, Settings

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM's NixlConnector's (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py NixlPromMetrics)
XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
XFER_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)   # vLLM's iteration_tokens


def buckets_1_2_5(limit):
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10
FINISHED_REASON = {"stop": "stop", "stop_string": "stop", "length": "length", "cancelled": "abort",
                   "error": "error"}


class EngineMetrics:
    def __init__(self, model_name, cache_blocks, disaggregated=False, max_context=None):
        self.registry = CollectorRegistry()
        self.cache_blocks = cache_blocks
        label = {"model_name": model_name}

        def histogram(name, doc, buckets):
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry).labels(**label)

        def gauge(name, doc):
            return Gauge(name, doc, ["model_name"], registry=self.registry).labels(**label)

        def counter(name, doc):
            return Counter(name, doc, ["model_name"], registry=self.registry).labels(**label)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens", ITL_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Time between consecutive tokens (vLLM's older name)", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish", REQUEST_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Time waiting for a batch slot",
                               REQUEST_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "Start of prefill to first token",
                                 REQUEST_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", "First token to last token",
                                REQUEST_BUCKETS)
        self.running = gauge("vllm:num_requests_running", "Requests in batch slots")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting for a slot")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks reserved (1 = full)")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.preemptions = counter("vllm:num_preemptions", "Requests preempted (blocks freed, recomputed later)")
        success = Counter("vllm:request_success", "Finished requests", ["model_name", "finished_reason"],
                          registry=self.registry)
        self.success = {r: success.labels(finished_reason=r, **label) for r in sorted(set(FINISHED_REASON.values()))}
        sizes = buckets_1_2_5(max_context or 2 ** 20)
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed", sizes)
        self.request_generation = histogram("vllm:request_generation_tokens", "Number of generation tokens "
                                            "processed", sizes)
        self.request_max_tokens = histogram("vllm:request_params_max_tokens", "The max_tokens request parameter",
                                            sizes)
        self.iteration = histogram("vllm:iteration_tokens_total", "Number of tokens per engine step",
                                   ITERATION_BUCKETS)
        self._cache_info = Gauge("vllm:cache_config_info", "Information of the KV cache configuration",
                                 ["model_name", "block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"],
                                 registry=self.registry)
        self._cache_labels = self._hello = None   # the labels of its one series now; the hello they came from
        self._max_tokens = {}         # request id -> its max_new_tokens (the request event's), until it ends
        self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts")
        self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens")
        self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens")
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position",
                          ["model_name", "position"], registry=self.registry)
        self.spec_per_pos = [per_pos.labels(position=str(i), **label) for i in range(MAX_SPEC_TOKENS)]
        self._first_token_metrics(label, gauge, counter)
        self.xfer_time = self.xfer_bytes = self.xfer_tokens = None
        if disaggregated:
            self.xfer_time = histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for KV "
                                       "cache transfers (here: copies between the instances' shared memory)",
                                       XFER_TIME_BUCKETS)
            self.xfer_bytes = histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per KV "
                                        "cache transfer", XFER_BYTES_BUCKETS)
            self.xfer_tokens = counter("first_token:kv_transfer_tokens", "Prompt positions whose keys and values "
                                                                         "the decode instance copied")
        self._waiting, self._running = set(), set()
        self._last_token = {}   # request id -> (time, token.spec) of its latest token

    def _first_token_metrics(self, label, gauge, counter):
        """First Token's own series (vLLM has no such metrics), and its `first_token_info`."""
        slo = Counter("first_token:slo_requests", "Completed requests judged against the SLOs",
                      ["model_name", "slo"], registry=self.registry)
        self.slo = {True: slo.labels(slo="met", **label), False: slo.labels(slo="missed", **label)}
        self.load_s = gauge("first_token:model_load_seconds", "How long the model's last load took")
        self.loads = counter("first_token:model_loads", "Model reloads since start (cold starts on demand)")
        self.goodput = gauge("first_token:goodput_requests_per_s", "Requests/s meeting both SLOs, last 30 s")
        self.attainment = gauge("first_token:slo_attainment", "Fraction of requests judged in the last 30 s "
                                                              "that met both SLOs")
        self._decode_bytes = Gauge("first_token:weight_bytes_per_decode_step",
                                   "Bytes of weights a batch-1 decode step reads in the weights format in force",
                                   ["model_name", "format"], registry=self.registry)
        self._read = Counter("first_token:weight_bytes_read", "Bytes of weights read by forwards, by weights format",
                             ["model_name", "format"], registry=self.registry)
        self._label = label
        self._format = None          # the format whose series the gauge holds now
        self._formats = {}           # format -> bytes a decode step reads in it (hello.weights)
        Gauge("first_token_info", "This server is First Token; the label is its wire protocol version",
              ["model_name", "protocol"], registry=self.registry).labels(
                  protocol=str(ev_types.PROTOCOL), **label).set(1)

    @classmethod
    def attach(cls, backend):
        """Metrics for `backend`'s model, listening to its events from now on."""
        hello = backend.hello()
        m = cls(backend.api_model, hello.cache_blocks, disaggregated=hello.instances is not None,
                max_context=hello.max_context)
        m._cache_config(hello, Settings.from_wire(hello.settings).scheduling.prefix_caching)
        m.load_s.set(backend.health()[0].get("load_s") or 0.0)
        if hello.weights:
            m._formats = {name: f["decode_bytes"] for name, f in hello.weights["formats"].items()}
            m._weights_in_force(Settings.from_wire(hello.settings).scheduling.weights)
        backend.events.add_listener(m.on_event)
        return m

    def _cache_config(self, hello, prefix_caching):
        """`vllm:cache_config_info`'s one series, labelled with the cache as configured now."""
        labels = {"block_size": str(hello.block_size), "num_gpu_blocks": str(hello.cache_blocks),
                  "cache_dtype": str(hello.dtype), "enable_prefix_caching": str(prefix_caching)}
        if labels == self._cache_labels:
            return
        if self._cache_labels is not None:
            self._cache_info.remove(self._label["model_name"], *self._cache_labels.values())
        self._cache_info.labels(**labels, **self._label).set(1)
        self._cache_labels, self._hello = labels, hello

    def _weights_in_force(self, fmt):
        """The decode-bytes gauge's one series names the format in force."""
        if fmt == self._format or fmt not in self._formats:
            return
        if self._format is not None:
            self._decode_bytes.remove(self._label["model_name"], self._format)
        self._decode_bytes.labels(format=fmt, **self._label).set(self._formats[fmt])
        self._format = fmt

    def on_event(self, ev):
        if isinstance(ev, ev_types.Settings):
            scheduling = Settings.from_wire(ev.settings).scheduling
            if self._formats:   # an engine's (observe mode's settings are only those of requests)
                self._weights_in_force(scheduling.weights)
            if self._hello is not None:
                self._cache_config(self._hello, scheduling.prefix_caching)
            return
        if isinstance(ev, ev_types.Step):
            self.iteration.observe(ev.tokens)
            if ev.weights and ev.weight_bytes:
                self._read.labels(format=ev.weights, **self._label).inc(ev.weight_bytes)
        if isinstance(ev, ev_types.KVTransfer):
            self.xfer_time.observe(ev.end - ev.start)
            self.xfer_bytes.observe(ev.bytes)
            self.xfer_tokens.inc(ev.tokens)
            return
        if isinstance(ev, ev_types.Token):
            self.generation_tokens.inc()
            last, last_spec = self._last_token.get(ev.id, (None, None))
            if last is not None and last_spec != "accepted":   # an accepted guess's successor came in its forward
                self.itl.observe(ev.t - last)
                self.tpot.observe(ev.t - last)
            self._last_token[ev.id] = (ev.t, ev.spec)
        elif isinstance(ev, (ev_types.Step, ev_types.Stats)) and ev.instance != "prefill":
            self.kv_usage.set(ev.cache_blocks_used / self.cache_blocks)
            if isinstance(ev, ev_types.Stats):
                self.goodput.set(ev.goodput or 0.0)
                self.attainment.set(float("nan") if ev.slo_attainment is None else ev.slo_attainment)
            elif ev.spec:
                self._speculated(ev.spec.values())
        elif isinstance(ev, ev_types.ModelLoad):
            self.load_s.set(ev.seconds)
            self.loads.inc()
            return
        elif isinstance(ev, ev_types.Request):
            self._waiting.add(ev.id)
            self._max_tokens[ev.id] = ev.max_new_tokens
        elif isinstance(ev, ev_types.Admitted):
            self._waiting.discard(ev.id)
            self._running.add(ev.id)
            if not ev.resumed and ev.instance != "decode":   # a request's prompt counts once, as in stats.prefix_queries
                self.prompt_tokens.inc(ev.prompt_tokens)
                self.prefix_queries.inc(ev.prompt_tokens)
                self.prefix_hits.inc(ev.cached_tokens)
                self.queue.observe(ev.queue_s)
        elif isinstance(ev, ev_types.Preempted):
            self._running.discard(ev.id)
            self._waiting.add(ev.id)
            self.preemptions.inc()
        elif isinstance(ev, (ev_types.Finished, ev_types.Rejected)):
            self._waiting.discard(ev.id)
            self._running.discard(ev.id)
            self._last_token.pop(ev.id, None)
            max_tokens = self._max_tokens.pop(ev.id, None)
            if isinstance(ev, ev_types.Finished):
                self._finished(ev, max_tokens)
        else:
            return
        self.waiting.set(len(self._waiting))
        self.running.set(len(self._running))

    def _speculated(self, counts):
        for c in counts:
            self.spec_drafts.inc()
            self.spec_draft_tokens.inc(c["proposed"])
            self.spec_accepted.inc(c["accepted"])
            for pos in range(c["accepted"]):
                self.spec_per_pos[pos].inc()

    def _finished(self, ev, max_tokens):
        self.success[FINISHED_REASON.get(ev.reason, "error")].inc()
        if ev.prompt_tokens is not None:
            self.request_prompt.observe(ev.prompt_tokens)
            self.request_generation.observe(ev.output_tokens or 0)
        if max_tokens is not None:
            self.request_max_tokens.observe(max_tokens)
        if ev.slo is not None:
            self.slo[ev.slo["met"]].inc()
        self.e2e.observe(ev.e2e)
        if ev.ttft is None:
            return          # left before its first token: no TTFT, prefill or decode to report
        self.ttft.observe(ev.ttft)
        self.prefill.observe(ev.ttft - ev.stages["tokenize"] - ev.stages["queue"])
        later = ev.output_tokens - 1
        self.decode.observe(ev.tpot * later if later > 0 else 0.0)

    def render(self):
        return generate_latest(self.registry)


bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def prometheus():
    state = current_app.extensions["first_token"]   # server/state.py (which imports this module)
    if state.metrics is None:
        if state.backend is None:
            return Response("loading\n", status=503, mimetype="text/plain")
        return Response("observe mode: scrape the observed server's own /metrics\n", status=404,
                        mimetype="text/plain")
    return Response(state.metrics.render(), content_type=CONTENT_TYPE_LATEST)
