"""The First Token engine: a small continuous-batching LLM server that measures itself.

Data flows one way:

    submit() -> tokenizer -> Scheduler (waiting queue, slots, KV blocks)
             -> Runner (prefill / batched decode forwards) -> sampler
             -> events.Broadcaster -> every subscriber (websockets, metrics, API streams)

Modules, one job each:
    settings   named, validated controls (one validation layer for every client)
    model      loading the bundled GGUF / a local HF directory, with an on-disk cache
    sequence   one request's state and measured timestamps
    kv_cache   block accounting and the slot-major KV store handed to the model
    scheduler  waiting queue, slot admission by free blocks, chunked prefill
    runner     the forwards (with or without KV cache)
    sampler    greedy / temperature / top-p, seeded
    events     clock, typed events, bounded per-subscriber buffers
    loadgen    open-loop Poisson arrivals with real prompts
    stats      rolling percentiles and throughput
    engine     the engine thread that ties it all together

No Flask imports here.
"""
from .settings import SettingError

__all__ = ["Engine", "RequestHandle", "SettingError"]


def __getattr__(name):
    # Engine pulls in torch and transformers (seconds to import); observe mode and the CLI's
    # flag checks never need them, so they load only when Engine is first asked for.
    if name in ("Engine", "RequestHandle"):
        from . import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
