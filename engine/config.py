"""The engine's start-up configuration: what is fixed for the life of an engine (its capacity).

Live controls (load, rate, slot limit, cache budget, ...) are settings (engine/settings.py)
and change while it runs; these bound them.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    slots: int = 16              # most requests decoded together (the slots slider's maximum)
    kv_tokens: int | None = None  # KV-cache capacity in tokens (default: 1024 per slot)
    block_size: int = 16         # KV-cache block size in tokens
    max_context: int = 4096      # longest prompt + output per request (capped by the model's)
    history: int = 2000          # events replayed to a page that connects
    # The server's: nothing there calls `generate`, so once the engine has its own copies of the
    # linear layers (engine/llama.py: prepacked, stacked) the model's are released (424 MB for
    # SmolLM2). Tests and benches that compare against `generate` keep them (the default).
    release_model_weights: bool = False

    @property
    def cache_capacity_tokens(self):
        """Tokens the KV cache can hold: the `cache_tokens` setting's maximum."""
        return self.kv_tokens or self.slots * 1024
