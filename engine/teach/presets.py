"""Teaching presets: each of the article's situations as one named setup of the engine.

A preset is every setting (defaults, then its own values, clamped to this engine's capacity)
plus a few timed actions: bursts of load-generator requests, optionally of another prompt
length or sharing a prompt prefix. Applying one (`Preset.apply`, through the engine's public
`reset` and `apply_settings`) resets the engine, so what the class sees afterwards is that
situation alone. The page (`/?preset=NAME`, the presets panel, the tour),
`python app.py record --preset NAME` and the tests all apply presets through
`EngineDriver.apply_preset`, so they set up exactly the same thing.

`explain` says what to watch in two or three sentences; `watch` names the number that
proves it. Timings in the texts are for the bundled model on a CPU and are described
relatively, since the page shows the measured ones.
"""
from dataclasses import dataclass, field, replace

from .. import events
from ..core.request import GenerateRequest
from ..settings import SettingError


@dataclass(frozen=True)
class Action:
    """At `at` seconds after the preset is applied: `burst` load-generator requests, of
    `prompt_tokens` and `max_new_tokens` (default: the preset's settings), the first `shared_prefix` tokens of
    each prompt identical across the burst (a shared system prompt), drawn with `seed` so
    that every run of the preset (and both sides of a comparison) gets the same prompts."""
    at: float
    burst: int
    prompt_tokens: int | None = None
    shared_prefix: int = 0
    seed: int = 0         # the burst's prompts: the same every time the preset runs
    max_new_tokens: int | None = None   # default: the preset's setting
    reload: bool = False  # instead of a burst: load the model again (a cold start, engine/model/reload.py)
    task: str | None = None   # a chat request asking this of each prompt (loadgen.TASKS), e.g. "copy"
    # instead of a burst: change these settings at that time (a lesson that switches mid-run: the
    # `weights` preset reads fp32, then the file's 4-bit blocks); a comparison's overrides win
    settings: dict | None = None
    # a fixed question instead of a corpus window, asked as a chat (the `sampling` lesson's), its
    # row's name, and its requests' own fields of the request registry (engine/core/fields.py:
    # temperature, top_p, priority...; checked as each request is built; its seed is `seed`)
    prompt: str | None = None
    label: str | None = None
    asks: dict | None = None

    def question(self, max_new_tokens):
        """The request a fixed question's burst sends each time (None: a corpus burst)."""
        if self.prompt is None:
            return None
        return GenerateRequest(chat=True, source="load", max_new_tokens=max_new_tokens, seed=self.seed,
                               prompt=self.prompt, label=self.label, **(self.asks or {}))

    def describe(self):
        out = {"at": self.at, "burst": self.burst, **(self.asks or {})}
        for name in ("prompt", "label"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.reload:
            out["reload"] = True
        if self.settings:
            out["settings"] = dict(self.settings)
        if self.task is not None:
            out["task"] = self.task
        if self.prompt_tokens is not None:
            out["prompt_tokens"] = self.prompt_tokens
        if self.shared_prefix:
            out["shared_prefix"] = self.shared_prefix
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        return out


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    explain: str
    watch: str
    settings: dict = field(default_factory=dict)
    actions: tuple = ()

    def describe(self):
        return {"name": self.name, "title": self.title, "explain": self.explain, "watch": self.watch,
                "settings": dict(self.settings), "actions": [a.describe() for a in self.actions]}

    def full_settings(self, specs, overrides=None):
        """Every setting: its default, overridden by this preset (clamped to the engine's
        bounds), then by `overrides` (already validated: one side of a comparison)."""
        out = {name: spec.default for name, spec in specs.items()}
        for name, value in self.settings.items():
            spec = specs[name]
            if spec.kind in ("int", "float"):
                value = min(max(value, spec.min), spec.max)
            out[name] = value
        out.update(overrides or {})
        return out

    @property
    def requests(self):
        """How many requests its bursts submit."""
        return sum(a.burst for a in self.actions)

    def timed(self, overrides=None):
        """Its actions for a run with `overrides` (one side of a comparison): a timed settings
        change leaves a setting the overrides fix alone, so that side reads one format throughout."""
        out = []
        for a in self.actions:
            if a.settings and overrides:
                keep = {k: v for k, v in a.settings.items() if k not in overrides}
                if not keep:
                    continue
                a = replace(a, settings=keep)
            out.append(a)
        return out

    def apply(self, engine, overrides=None):
        """Reset `engine`, then every setting as this preset has it, with validated `overrides`
        over them; the bursts are the driver's to time. Returns the reset, settings and
        `preset` events."""
        out = engine.reset()
        out += engine.apply_settings(self.full_settings(engine.specs, overrides))
        out.append(events.Preset(t=engine.clock.now(), name=self.name, title=self.title, explain=self.explain,
                                 watch=self.watch, overrides=dict(overrides or {}), requests=self.requests))
        return out


# `queueing` computes each prompt whole and alone (prefill-first, a budget of one prompt): two
# slots freed in the same step would otherwise share one prefill forward, and each request's
# prefill figure is the whole shared forward. So every prefill does the same work and only the
# queueing grows. Static and continuous batching get the same arrivals of short and long
# requests, so that the slots a static batch leaves idle show.
BATCHING_WAVES = tuple(Action(at, 2, max_new_tokens=n, seed=i)
                       for i, (at, n) in enumerate([(0, 16), (0, 96), (2.0, 16), (2.0, 64), (4.0, 16), (4.0, 32)]))

# The speculative-decoding pair: the same seeded copy tasks for one user and for eight.
SPECULATIVE = {"speculation": "ngram", "spec_tokens": 4, "prompt_tokens": 96, "max_new_tokens": 96}

# The sampling lesson: one question, answered at once five ways, side by side (the article's "choose
# a token from the probabilities (greedily or by sampling)"). Seeded, so it repeats token for token.
SAMPLING_PROMPT = "Write one sentence about the sea."
# The priority lesson: six batch jobs (each its own seed, so their texts and blocks differ), then one
# urgent question
BATCH_JOB = "Summarise the history of the printing press in a long paragraph."
URGENT = "Is the exam tomorrow at nine?"
BATCH_JOBS = tuple(Action(0, 1, prompt=BATCH_JOB, seed=i, label="batch job", asks={"temperature": 0.8, "priority": 10})
                   for i in range(6))
SAMPLING = tuple(Action(0, 1, prompt=SAMPLING_PROMPT, label=name, seed=7, asks={"temperature": t, "top_p": p})
                 for name, t, p in (("greedy", 0.0, 1.0), ("T 0.7", 0.7, 1.0), ("T 1", 1.0, 1.0),
                                    ("T 1.5", 1.5, 1.0), ("top-p 0.5", 1.0, 0.5)))

PRESETS = {p.name: p for p in (
    Preset("idle", "One short prompt, idle server",
           "One short prompt arrives at an idle server. It never queues: almost all of its time to "
           "first token is prefill (reading the prompt), then one token per decode step.",
           "TTFT ≈ prefill",
           {"prompt_tokens": 64, "max_new_tokens": 32}, (Action(0, 1),)),
    Preset("queueing", "The same prompt behind many others",
           "Twelve requests of the same length arrive at a server with two batch slots. Each one's "
           "prefill takes as long as before, but later arrivals wait for a slot: the queue grows and "
           "so does their time to first token. The model did not get slower; the server got busy.",
           "TTFT grows while prefill stays flat",
           {"slots": 2, "prompt_tokens": 128, "max_new_tokens": 48, "prefix_caching": False,
            "schedule": "prefill-first", "max_batched_tokens": 128},
           (Action(0, 1), Action(1.0, 11, seed=1))),
    Preset("long-document", "A long document as the prompt",
           "One prompt of 1024 tokens. Prefill reads every prompt token (in chunks of the step's "
           "token budget), so it takes far longer than a short prompt's: time to first token grows "
           "with prompt length, while each later token costs about the same.",
           "prefill time vs prompt tokens",
           {"prompt_tokens": 1024, "max_new_tokens": 32}, (Action(0, 1),)),
    Preset("many-users", "Many users at once",
           "Requests arrive at three per second and share the batch. Each decode step reads the "
           "weights once for every running request, so total tokens/s rises above a single stream's. "
           "How much each stream slows is measured: little while a step is bound by reading the "
           "weights, more past the ridge, where each request's arithmetic takes over.",
           "total tokens/s vs one stream's",
           {"load": True, "rate": 3.0, "prompt_tokens": 64, "max_new_tokens": 64}),
    Preset("small-cache", "A small KV cache",
           "Eight requests share a KV cache of 512 tokens. Each needs cache for its prompt and every "
           "token it generates, so some wait for blocks (the queue says 'waiting on: cache') and "
           "running ones are preempted when the cache fills, then recomputed.",
           "blocks in use at the budget; preemptions",
           {"cache_tokens": 512, "prompt_tokens": 96, "max_new_tokens": 128}, (Action(0, 8),)),
    Preset("kv-cache-off", "No KV cache",
           "Without a KV cache every decode step recomputes the whole sequence so far, so each step "
           "takes longer than the last: step time grows with sequence length. With the cache, a step "
           "computes one new token per request.",
           "decode step time vs sequence length",
           {"kv_cache": False, "prompt_tokens": 32, "max_new_tokens": 128}, (Action(0, 1),)),
    Preset("shared-prefix", "A shared system prompt",
           "Six requests, a second apart, start with the same 448-token prefix (a long system "
           "prompt). The first computes it; the others find its KV blocks in the prefix cache and "
           "prefill only their own last 64 tokens, so their prefill is a fraction of the first's.",
           "prefix-cache hits; later prefills vs the first",
           {"prompt_tokens": 512, "max_new_tokens": 32},
           (Action(0, 1, shared_prefix=448),) + tuple(Action(2.5 + i, 1, shared_prefix=448, seed=i + 1)
                                                      for i in range(5))),
    Preset("static-batching", "Static batching",
           "Short and long requests arrive in waves at four slots, but a batch runs until all of its "
           "requests finish before the next one starts. Arrivals wait ('waiting on: batch') while "
           "the slots of finished short requests sit empty.",
           "TTFT and tokens/s against continuous batching",
           {"schedule": "static", "slots": 4, "prompt_tokens": 64}, BATCHING_WAVES),
    Preset("continuous-batching", "Continuous batching",
           "The same waves of short and long requests, but a request joins the running batch at the "
           "next step and leaves when it is done. Slots never sit empty while others wait, so time "
           "to first token drops.",
           "TTFT and tokens/s against static batching",
           {"schedule": "mixed", "slots": 4, "prompt_tokens": 64}, BATCHING_WAVES),
    Preset("chunked-prefill", "Chunked prefill",
           "Four short requests are streaming when a 1024-token prompt arrives. Each step carries "
           "the decodes plus at most a 64-token chunk of the long prompt, so the others keep "
           "streaming at nearly their pace while it prefills (vLLM V1, SGLang).",
           "others' inter-token gaps while the long prompt prefills",
           {"schedule": "mixed", "max_batched_tokens": 64, "prompt_tokens": 32, "max_new_tokens": 96},
           (Action(0, 4), Action(3.0, 1, prompt_tokens=1024, seed=1))),
    Preset("prefill-first", "Prefill first (no chunking)",
           "The same four streams and long prompt, but prompts are computed whole before any decode "
           "step (vLLM v0's default). While the long prompt prefills, the others' streams stop.",
           "others' inter-token gaps while the long prompt prefills",
           {"schedule": "prefill-first", "max_batched_tokens": 1024, "prompt_tokens": 32,
            "max_new_tokens": 96},
           (Action(0, 4), Action(3.0, 1, prompt_tokens=1024, seed=1))),
    Preset("buffered-proxy", "A buffering proxy",
           "A proxy between this server and you holds what passes through it and lets it go every "
           "half second, as a buffered response does. The engine's tokens come at a steady pace (its "
           "step times do not change), but this page receives them in clumps: each row shows when "
           "a token was made and, apart from it, when it arrived here.",
           "the gap between engine time and arrival here, and the clumped arrivals",
           {"buffer_ms": 500, "prompt_tokens": 32, "max_new_tokens": 64}, (Action(0, 2),)),
    Preset("slow-network", "A slow network",
           "An injected 300 ms (plus up to 100 ms of jitter) on every delivery to this page and to "
           "API clients. The engine's stages and its time to first token do not change; what this "
           "page sees arrives 0.3-0.4 s later, so the first token, as a user sees it, comes later.",
           "time to first token here against the engine's own",
           {"net_latency_ms": 300, "net_jitter_ms": 100, "prompt_tokens": 32, "max_new_tokens": 32},
           (Action(0, 2),)),
    Preset("cold-start", "A cold start",
           "The model is loaded again from its on-disk cache, as a restarted server does, just as two "
           "requests arrive: they wait for it, and their time to first token carries a 'load' stage "
           "of the load's measured time. A request a few seconds later pays nothing for it.",
           "the first requests' 'load' stage against the later request's TTFT",
           {"prompt_tokens": 64, "max_new_tokens": 24},
           (Action(0, 2), Action(0, 0, reload=True), Action(4.0, 1, seed=1))),
    # Judged by goodput: short chats stream while two long documents arrive, under objectives
    # the preset sets. The compare sheet runs it under prefill-first and under chunked prefill;
    # which objective each request missed is the lesson, whichever schedule comes out ahead.
    # The objectives are sized for the bundled model on a 2-core CPU, where a step of six chats
    # takes ~60 ms (the usual 2 s / 100 ms would fail every request either way). Measured here,
    # quiet, two rounds each: prefill-first's first six chats 325-349 ms per later token (miss),
    # the rest 161-263 ms, TTFT <= 2.3 s; chunked: the first six 176-215 ms (met), the documents
    # and the later chats TTFT 4.2-7.1 s (miss): 5 of 12 met against 6 of 12.
    Preset("goodput", "Judged by goodput",
           "Six short chats are streaming when two 1024-token documents arrive, then four more chats. "
           "Every request is judged against two objectives: first token within 3 s, later tokens "
           "within 250 ms each on average; goodput counts the requests per second that met both. "
           "Computing a document whole stops every stream (their time per token misses); chunking it "
           "keeps them streaming, and the document's own first token comes later (its TTFT may miss). "
           "Compare the two schedules by goodput and by which objective each request missed.",
           "goodput and SLO met, with the objective each request missed",
           {"schedule": "mixed", "max_batched_tokens": 64, "prompt_tokens": 32, "max_new_tokens": 24,
            "slo_ttft_ms": 3000, "slo_tpot_ms": 250},
           (Action(0, 6), Action(1.0, 1, prompt_tokens=1024, seed=1), Action(2.0, 1, prompt_tokens=1024, seed=2),
            Action(2.5, 4, seed=3))),
    Preset("speculative", "Speculative decoding: one user",
           "One request asks the model to copy a paragraph, so most of what it writes is already in its "
           "prompt. With speculation on (ngram), each step guesses the next few tokens by finding the "
           "last few in the prompt, and one forward checks them all: a decode step reads the weights "
           "once whatever it checks, so every accepted guess is a nearly free token.",
           "tokens per step and tokens/s, speculation on vs off", SPECULATIVE, (Action(0, 1, task="copy", seed=3),)),
    Preset("speculative-busy", "Speculative decoding: many users",
           "Eight of the same kind of request at once. The batch already fills each step, so the guesses "
           "are extra positions that every forward must compute, and the rejected ones are wasted work: "
           "speculation gains little or loses here, while it won with one user.",
           "total tokens/s, speculation on vs off, against one user's gain", SPECULATIVE,
           (Action(0, 8, task="copy", seed=3),)),
    # Prefill/decode disaggregation (--disaggregate, engine/disagg/): the chunked-prefill lesson's
    # situation, two long prompts arriving while four chats stream. Colocated, their chunks share
    # the streams' forwards (`mixed`); disaggregated, they run on the prefill instance and reach
    # the decode instance as one `kv_transfer` each and a one-position recompute.
    Preset("disaggregation", "Prefill and decode apart",
           "Four chats are streaming when two 1024-token prompts arrive. On one engine their prompt "
           "chunks share every forward with the streams, whose tokens slow while they prefill. Served "
           "disaggregated (app.py --disaggregate), a prefill instance computes the prompts and the "
           "decode instance copies each one's keys and values in (the transfer) and recomputes only "
           "its last position: the streams' forwards carry no prompt chunks.",
           "the streams' inter-token gaps while the long prompts prefill; the transfer's time and bytes",
           {"schedule": "mixed", "max_batched_tokens": 64, "prompt_tokens": 32, "max_new_tokens": 96},
           (Action(0, 4), Action(3.0, 2, prompt_tokens=1024, seed=1))),
    # One stream reads the dequantised fp32 copy (538 MB a step for SmolLM2), then, 4 s in, the
    # file's own 4-bit blocks (97 MB): the same numbers, a fifth of the bytes. The page's figure
    # is the median decode step measured under each (step.weights). Where this engine has one
    # format only (no blocks, no kernel) the switch is refused with an `error` saying why.
    Preset("weights", "Fewer bytes to read, faster decode",
           "One request decodes alone, first reading the weights dequantised to fp32, then, a few "
           "seconds in, as the model file stores them: 4-bit blocks, the same numbers in about a fifth "
           "of the bytes. A batch-1 decode step is bound by reading the weights, so it gets faster "
           "when there are fewer bytes to read: watch its ticks close up at the switch.",
           "decode step time, fp32 vs 4-bit, against each format's bandwidth floor",
           {"weights": "dequantised", "prompt_tokens": 32, "max_new_tokens": 192},
           (Action(0, 1), Action(4.0, 0, settings={"weights": "stored"}))),
    # Every token's odds are on its event (engine/model/sampler.py): the page draws each token's
    # candidates as bars, the model's own distribution and the one the draw used.
    Preset("sampling", "Choosing a token",
           "The same question five times at once: greedy, temperature 0.7, 1 and 1.5, and top-p 0.5. "
           "Each step gives every row the model's probabilities for its next token; greedy always "
           "takes the tallest bar, temperature 0.7 sharpens the bars, 1.5 flattens them so unlikely "
           "tokens get picked, and top-p 0.5 keeps only the few tokens that make up half the mass. "
           "Hover a token to see its bars; the first sampling is a measured stage of each TTFT.",
           "how often each row took the top bar, and how tall the bar it drew from was",
           {"max_new_tokens": 32}, SAMPLING),
    # Eight streams read the 4-bit blocks with fp32 activations, then, 4 s in, int8 ones (the
    # `activations` setting): llama.cpp's arithmetic, integer dot products. The switch first
    # measures how far it moves the output (engine/model/agreement.py: teacher-forced top-1 agreement
    # and the largest logit difference), then the steps run on it: the page's figure is each
    # arithmetic's median decode step (step.kernel says which) and that agreement.
    # vLLM's `--scheduling-policy priority` (engine/core/queues.py PriorityQueue): the queue is
    # ordered by each request's priority, and the request preempted when the cache runs out is the
    # lowest-priority one; a batch job preempted comes back later and computes its tokens again.
    Preset("priority", "An urgent question overtakes batch jobs",
           "Six batch jobs (priority 10) take the four slots and fill the KV cache; two wait. Then a "
           "student's urgent question (priority 0) arrives. Under the priority policy it goes to the "
           "head of the queue, past the waiting jobs, and when the cache runs out the scheduler "
           "preempts the lowest-priority running job to make room, never the question: that job's "
           "blocks are freed and, back in the queue, it computes its prompt and tokens again (a "
           "second prefill on its row). Compare with fcfs: the question waits behind every job.",
           "the question's time to first token against the jobs'; which request was preempted and its recompute",
           {"scheduling_policy": "priority", "slots": 4, "cache_tokens": 448, "max_new_tokens": 160},
           BATCH_JOBS + (Action(2.0, 1, prompt=URGENT, label="urgent question", max_new_tokens=32),)),
    Preset("int8", "Another arithmetic: int8 activations",
           "Eight requests decode together reading the 4-bit blocks, first with fp32 activations, "
           "whose results equal fp32 arithmetic on the dequantised weights. A few seconds in, the "
           "activations are rounded to int8 as llama.cpp rounds them, and the multiply-adds become "
           "integer ones: fewer instructions for each weight, so each step is shorter. It is another "
           "arithmetic, so the engine first measures how close it stays: the share of 2,048 positions "
           "of text where both pick the same next token, and the largest logit difference (serving "
           "pauses for those seconds, once).",
           "decode step time, fp32 vs int8 activations; int8's top-1 agreement with fp32 and largest logit difference",
           {"prompt_tokens": 32, "max_new_tokens": 160, "slots": 8},
           (Action(0, 8), Action(4.0, 0, settings={"activations": "int8"}))),
)}


def get(name):
    """The preset called `name`; SettingError naming the known ones otherwise."""
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if preset is None:
        raise SettingError("name", f"unknown preset {str(name)[:40]!r} (known: {', '.join(PRESETS)})")
    return preset
