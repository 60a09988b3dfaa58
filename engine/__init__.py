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

Folders by job, modules one job each:
    config, settings   EngineConfig (capacity fixed at start); the live controls' one registry
               and their typed value (five immutable parts, each handed to its owner)
    events, schema     the clock and the typed events (the wire protocol), and their JSON Schema
               (`python -m engine.schema`)
    broadcast  bounded fan-out of events to pages and listeners
    driver     EngineDriver: the engine thread, the inbox (small typed commands), the load
               thread, failure handling
    backend    the Backend protocol the web layer serves from (the driver, observe mode)
    core/      the serving core: engine (step = schedule, run, postprocess -> events; no threads),
               scheduler (its queue, slots, the token budget, preemption), policies (how a step is
               filled: mixed, prefill-first, static; why the head waits), queues (the waiting
               queue's order per `scheduling_policy`: fcfs, priority), block_manager and kv_cache
               (the paged KV memory, the blocks a sequence holds, prefix hashes), sequence,
               request (GenerateRequest, RequestHandle), intake (defaults, tokenization, refusals),
               step_output (what one step did, as facts), detok (incremental text, stop strings),
               connector (the KV connector: keys and values computed elsewhere)
    model/     loading (the bundled GGUF or a local HF directory, an on-disk cache), weights (the
               file's own blocks), linears, llama (the fused forward), kernels/ (C++ custom ops),
               runner (one forward over packed tokens), sampler, speculate, agreement, reload
    timing/    recorder (each StepOutput into per-request stages, rolling stats and the events
               that carry them; the one writer of a client's output), request_times, roofline,
               measure (the decode-cost sweep), stepcost, bandwidth, stats, memory
    teach/     presets (the lessons), loadgen (open-loop Poisson arrivals), record (traces)
    disagg/    prefill/decode disaggregation: two engine processes, each with its connector, the
               KV copy between them through shared memory, DisaggBackend (the web process's side)

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
