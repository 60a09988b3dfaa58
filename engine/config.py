"""The engine's start-up configuration: what is fixed for the life of an engine (its capacity).

Live controls (load, rate, slot limit, cache budget, ...) are settings (engine/settings.py)
and change while it runs; these bound them.
"""
from dataclasses import dataclass

# KV-cache tokens per slot by default: sized for what the default slots run, not for each at the
# longest context. The load generator's default request holds 192 tokens (128 + 64), the longest
# lesson ~2.7k in all (four streams and two 1024-token prompts), and a request of the full context
# (4096) still fits alone. 16 slots x 512 = 8,192 tokens: 377 MB of fp32 keys and values for
# SmolLM2, where 1024 a slot was 755 MB, most of it never written. --kv-tokens sets more.
KV_TOKENS_PER_SLOT = 512


@dataclass(frozen=True)
class EngineConfig:
    slots: int = 16              # most requests decoded together (the slots slider's maximum)
    kv_tokens: int | None = None  # KV-cache capacity in tokens (default: KV_TOKENS_PER_SLOT per slot)
    block_size: int = 16         # KV-cache block size in tokens
    max_context: int = 4096      # longest prompt + output per request (capped by the model's)
    history: int = 2000          # recent events kept for a new page's catch-up (engine/catchup.py bounds it in bytes)
    # The server's: nothing there calls `generate`, so once the engine has its own copies of the
    # linear layers (engine/model/llama.py: prepacked, stacked) the model's are released (424 MB for
    # SmolLM2). Tests and benches that compare against `generate` keep them (the default).
    release_model_weights: bool = False

    @property
    def cache_capacity_tokens(self):
        """Tokens the KV cache can hold: the `cache_tokens` setting's maximum."""
        return self.kv_tokens or self.slots * KV_TOKENS_PER_SLOT
