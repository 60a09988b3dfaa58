"""The throughput contenders, each run on the same prompts with the same token budget.

Every contender generates exactly `new_tokens` greedy tokens per prompt with end-of-sequence
ignored, so they all do the same work:
  * our engine: `Engine.eos` emptied (the stop check then only counts tokens);
  * `model.generate_batch`: `eos_token_id=-1`, which its request state reads as "no EOS";
  * sequential `model.generate`: `min_new_tokens` = `max_new_tokens` (EOS masked until the end).
The prompts are plain corpus text (no chat template), where EOS is practically never the
greedy choice, so the three produce the same tokens; `tokens` is returned for that check.
Throughput is output tokens / wall time from the first submission to the last token.
"""
from dataclasses import dataclass, field
import json
import threading
import time

import torch

from engine import Engine, EngineConfig, EngineDriver
from engine.events import Rejected, Token
from engine.teach.loadgen import CORPUS
from engine.core.request import GenerateRequest


@dataclass
class Result:
    name: str
    seconds: float
    output_tokens: int
    tokens: list = field(repr=False, default_factory=list)  # per prompt, in prompt order
    note: str = ""
    setup_s: float = 0.0      # part of `seconds` spent before any request started
    events_cpu_s: float = 0.0  # CPU seconds publishing + encoding events (engine, events on)

    @property
    def tokens_per_s(self):
        return self.output_tokens / self.seconds

    @property
    def tokens_per_s_after_setup(self):
        return self.output_tokens / (self.seconds - self.setup_s)


def prompts(tokenizer, n, length):
    """`n` corpus windows of exactly `length` tokens whose text re-tokenizes to the same ids.

    The engine takes text and tokenizes it; the HF contenders take ids. Windows are kept only
    when the round trip is exact, so all contenders see identical prompt tokens."""
    ids = tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
    out, start = [], 0
    step = max(1, (len(ids) - length) // (n * 4))
    while len(out) < n:
        if start + length > len(ids):
            raise RuntimeError("corpus too short for the requested prompts")
        window = ids[start:start + length]
        text = tokenizer.decode(window)
        if tokenizer(text, add_special_tokens=False)["input_ids"] == window:
            out.append((text, window))
        start += step
    return out


def run_engine(bundle, batch, new_tokens, slots, events=True, max_context=4096):
    """Submit every prompt at once to an engine with `slots` batch slots; wait for all.

    With events on, one subscriber drains and JSON-encodes them on its own thread every 50 ms,
    as the app's websocket handler does for one connected page, so their cost is counted.
    With them off they are still built by the engine (they are its return value) but not
    published, serialised or sent."""
    eng = EngineDriver(Engine(bundle, EngineConfig(slots=slots, max_context=max_context)))
    eng.engine.eos = set()                   # ignore EOS: exactly new_tokens each
    eng.publishing = events
    done = threading.Event()
    cpu = [0.0]                              # CPU seconds spent publishing + draining events
    if events:
        publish = eng.events.publish

        def timed_publish(event):            # runs in the engine thread
            t = time.thread_time()
            publish(event)
            cpu[0] += time.thread_time() - t
        eng.events.publish = timed_publish
        page = threading.Thread(target=_page, args=(eng.events.subscribe(), done, cpu), daemon=True)
        page.start()
    eng.start()
    try:
        _drain(eng.submit(GenerateRequest(prompt=batch[0][0], max_new_tokens=2, stream=True)))   # warm-up, untimed
        t0 = time.perf_counter()
        handles = [eng.submit(GenerateRequest(prompt=text, max_new_tokens=new_tokens, stream=True)) for text, _ in batch]
        tokens = [_drain(h) for h in handles]
        seconds = time.perf_counter() - t0
    finally:
        done.set()
        eng.shutdown()
    if events:
        page.join()
    label = f"engine, batch {slots}" + ("" if events else ", events off")
    note = f"events: {cpu[0]:.2f} CPU s to publish and encode" if events else ""
    return Result(label, seconds, sum(map(len, tokens)), tokens, note=note, events_cpu_s=cpu[0])


def _page(sub, done, cpu):
    """A connected page's websocket thread: every 50 ms, take what is pending and encode it."""
    t = time.thread_time()
    while not done.is_set():
        json.dumps(sub.get(timeout=0.05), separators=(",", ":"))
    cpu[0] += time.thread_time() - t


def _drain(handle):
    ids = []
    for ev in handle.events(timeout=600):
        if isinstance(ev, Token):
            ids.append(ev.token_id)
        elif isinstance(ev, Rejected):
            raise RuntimeError(f"bench request rejected: {ev.reason}")
    return ids


def run_generate_batch(model, batch, new_tokens):
    """transformers' own continuous batching (paged cache, its scheduler) on the same ids.

    The call builds its paged cache and static buffers before the first forward; that setup
    is timed separately (from each result's `lifespan`) so both figures can be shown."""
    from transformers import GenerationConfig
    cfg = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                           pad_token_id=model.generation_config.pad_token_id or 0)
    attn = model.config._attn_implementation
    model.set_attn_implementation("sdpa")          # the engine's own attention is not for generate_batch
    t0 = time.perf_counter()
    try:
        out = model.generate_batch([ids for _, ids in batch], generation_config=cfg)
    finally:
        model.config._attn_implementation = attn   # it may switch to a paged variant
    seconds = time.perf_counter() - t0
    results = list(out.values())
    failed = [r.error for r in results if r.error]
    if failed or len(results) != len(batch):
        raise RuntimeError(f"generate_batch returned {len(results)} of {len(batch)} results; errors: {failed[:2]}")
    tokens = [r.generated_tokens for r in results]
    setup = min(r.lifespan[0] for r in results) - t0
    return Result("model.generate_batch", seconds, sum(map(len, tokens)), tokens,
                  note=f"{setup:.1f} s of it before the first request started (paged-cache setup)", setup_s=setup)


@torch.inference_mode()
def run_sequential(model, batch, new_tokens):
    """`model.generate`, one prompt after another (batch 1, its own DynamicCache)."""
    t0 = time.perf_counter()
    tokens = []
    for _, ids in batch:
        x = torch.tensor([ids], device=model.device)
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=model.generation_config.pad_token_id or 0)
        tokens.append(y[0, len(ids):].tolist())
    return Result("model.generate, sequential", time.perf_counter() - t0, sum(map(len, tokens)), tokens)
