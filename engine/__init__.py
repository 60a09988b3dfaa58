"""The First Token engine: a small continuous-batching LLM server that measures itself.

Data flows one way:

    GenerateRequest (every client builds one; validated as it is built)
      -> EngineDriver.submit() -> Engine.new_sequence (Intake: defaults from the live
      settings, tokenizer, in the caller's thread) -> inbox
      -> engine thread: Engine.add / step(): Scheduler (queue, slots, KV blocks)
         -> Runner (one forward over every scheduled token) -> sampler -> typed events
         -> StepOutput (what the step did, its clock reads) -> StepRecorder (each request's
         stages, the step's events in order)
      -> Broadcaster -> every subscriber (websockets, metrics, traces); a streaming request's
         own events also go to its RequestHandle (the API's and /join's answers)

Modules, one job each:
    config     EngineConfig: capacity fixed at start (slots, KV tokens, block size, context)
    settings   named, validated live controls (one validation layer for every client), and their
               typed value: one immutable Settings of five parts, each handed to its owner
    model      loading the bundled GGUF / a local HF directory, with an on-disk cache
    request    GenerateRequest: the one typed request every client submits, validated once;
               RequestHandle: what submit returns, the request's own token/finished/rejected
               events (the objects pages get), its one output path
    sequence   one request's state; when it decodes, why it stops
    intake     a request's way in: its defaults resolved, tokenization, its first events,
               refusals
    kv_cache   the paged KV memory, the block pool (free list, reference counts, prefix index)
               and prefix hashes
    block_manager  which blocks a sequence holds: allocation with prefix hits, growth, freeing,
               the prefix cache's counters
    scheduler  waiting queue, slots, the per-step token budget, preemption
    policies   the scheduling policies as objects (mixed, prefill-first, static), and why the
               queue's head waits (`Blocked`)
    runner     one forward over packed tokens; attention per request over its blocks
    sampler    greedy / temperature / top-p, seeded
    detok      incremental detokenisation; stop strings, OpenAI's rule applied once (when the
               request stops, what text its client gets); cost independent of length
    events     the clock and the typed events (the wire protocol; `python -m engine.schema`)
    schema     the JSON Schema of every event and of a trace, generated from the events
    broadcast  bounded fan-out of events to pages and listeners
    stats      rolling percentiles and throughput
    loadgen    open-loop Poisson arrivals with real prompts
    bandwidth  measured memory bandwidth and the decode-step floor it implies
    measure    the page's decode-cost sweep (batch x context; KV cache on vs off), run on
               an engine by the driver
    presets    the teaching presets: settings plus timed bursts, one name each (`Preset.apply`)
    step_output  what one step did, as facts: its scheduling, its forward's and sampling's
               times, each token handed out, each request ended
    request_times  one request's measured times and speculation counts; its TTFT stages
    timing     the step recorder: reads each StepOutput into per-request stage accounting,
               rolling stats and the events that carry them
    stepcost   what a forward costs lately (the step-time target's model; the engine feeds it)
    engine     Engine: step() = schedule, run (one forward), postprocess (sample, hand out,
               finish) -> events (no threads)
    driver     EngineDriver: the engine thread, the inbox (small typed commands), the load
               thread, failure handling
    backend    the Backend protocol the web layer serves from (the driver, observe mode)
    disagg     prefill/decode disaggregation: two engine processes with their roles, the KV copy
               between them through shared memory, DisaggBackend (the web process's side)
    record     recording a trace: `hello`, then every event a backend publishes for a while

No Flask, no HTTP, no bench files here: the web layer is the `server` package.
"""
from .config import EngineConfig
from .driver import EngineDriver
from .core.request import GenerateRequest
from .settings import SettingError

__all__ = ["Engine", "EngineConfig", "EngineDriver", "GenerateRequest", "SettingError"]


def __getattr__(name):
    # Engine pulls in torch and transformers (seconds to import); observe mode and the CLI's
    # flag checks never need them, so it loads only when first asked for.
    if name == "Engine":
        from .core.engine import Engine
        return Engine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
