"""A request's way in: its parameters validated and its prompt tokenized (in the submitting
thread: the request's tokenize stage), the `request` and `tokenized` events that announce it,
and why it can never run on this engine (a `rejected` reason and code).

`Intake.new_sequence` touches no engine state, so any thread may call it (through
`Engine.new_sequence`); `announce` and `refusal` run on the engine's caller, in `Engine.add`.
"""
import itertools
import queue

from . import speculate
from .events import Request, Tokenized
from .sequence import SamplingParams, Sequence
from .settings import SettingError, check_text, coerce

MAX_PROMPT_CHARS = 200_000
MAX_LABEL_CHARS = 64   # a request's label (a classroom name; the classroom itself allows fewer)
CHIPS_OWN, CHIPS_LOAD = 512, 48   # prompt tokens shown as chips in `tokenized` events


class Intake:
    def __init__(self, tokenizer, clock, settings, max_context, scheduler):
        """`settings`: the engine's live settings (defaults for what a request leaves out)."""
        self.tokenizer = tokenizer
        self.clock = clock
        self.settings = settings
        self.max_context = max_context
        self.scheduler = scheduler
        self._ids = itertools.count(1)

    def new_sequence(self, prompt=None, messages=None, source="api", max_new_tokens=None, temperature=None,
                     top_p=None, seed=None, stop=(), chat=None, stream=False, prompt_tokens=None,
                     ignore_eos=False, min_tokens=0, label=None, speculative_config=None):
        """A validated, tokenized request, not yet known to the engine (hand it to `Engine.add`).

        `prompt_tokens` cuts the prompt to that many tokens (the load generator's exact length);
        `label` names who asked (the `request` event carries it); `speculative_config` is its own
        speculation (`speculate.request_override`). Raises SettingError for invalid parameters."""
        arrival = self.clock.now()
        if label is not None and (not isinstance(label, str) or not label or len(label) > MAX_LABEL_CHARS):
            raise SettingError("label", f"must be a non-empty string of up to {MAX_LABEL_CHARS} characters")
        if label is not None:
            check_text("label", label)
        params = self._params(max_new_tokens, temperature, top_p, seed, stop, ignore_eos, min_tokens)
        params.speculation, params.spec_tokens = speculate.request_override(speculative_config)
        text, ids = self._tokenize(prompt, messages, chat)
        if prompt_tokens is not None:
            ids = ids[:prompt_tokens]
        return Sequence(id=f"r{next(self._ids)}", source=source, prompt=text, prompt_ids=ids, params=params,
                        arrival=arrival, tokenize_end=self.clock.now(), label=label,
                        sink=queue.Queue() if stream else None)

    def _params(self, max_new_tokens, temperature, top_p, seed, stop, ignore_eos, min_tokens):
        s = self.settings
        p = SamplingParams(
            max_new_tokens=coerce("max_new_tokens", "int", s["max_new_tokens"] if max_new_tokens is None
                                  else max_new_tokens, 1, self.max_context),
            temperature=coerce("temperature", "float", s["temperature"] if temperature is None
                               else temperature, 0.0, 2.0),
            top_p=coerce("top_p", "float", s["top_p"] if top_p is None else top_p, 0.0, 1.0),
            seed=None if seed is None else coerce("seed", "int", seed, 0, 2**63 - 1),
            stop=tuple(stop or ()), ignore_eos=coerce("ignore_eos", "bool", ignore_eos),
            min_tokens=coerce("min_tokens", "int", min_tokens, 0, self.max_context))
        if p.min_tokens > p.max_new_tokens:
            raise SettingError("min_tokens", f"must be at most max_new_tokens ({p.max_new_tokens})")
        if p.top_p <= 0:
            raise SettingError("top_p", "must be greater than 0")
        if not all(isinstance(x, str) and x for x in p.stop) or len(p.stop) > 4:
            raise SettingError("stop", "must be up to 4 non-empty strings")
        for x in p.stop:
            check_text("stop", x)
        return p

    def _tokenize(self, prompt, messages, chat):
        if messages is not None:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        elif isinstance(prompt, str) and prompt:
            if len(prompt) > MAX_PROMPT_CHARS:
                raise SettingError("prompt", f"longer than {MAX_PROMPT_CHARS} characters")
            text = prompt
            if chat and self.tokenizer.chat_template:
                text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                          tokenize=False, add_generation_prompt=True)
        else:
            raise SettingError("prompt", "must be a non-empty string")
        check_text("prompt", text)   # a lone surrogate is a TypeError in the tokenizer
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise SettingError("prompt", "tokenizes to nothing")
        return text, ids

    def announce(self, seq):
        """The `request` and `tokenized` events of a request reaching the engine."""
        n = len(seq.prompt_ids)
        # Token chips: a person's own prompt in full (up to 512), a generated one abridged, to
        # keep the stream small under heavy load.
        shown = seq.prompt_ids[:CHIPS_LOAD if seq.source == "load" else CHIPS_OWN]
        return [Request(t=seq.arrival, id=seq.id, source=seq.source, prompt_tokens=n,
                        max_new_tokens=seq.params.max_new_tokens, preview=seq.prompt[:80], label=seq.label),
                Tokenized(t=seq.tokenize_end, id=seq.id, start=seq.arrival, end=seq.tokenize_end, n=n,
                          ids=shown, pieces=self.tokenizer.batch_decode([[i] for i in shown]),
                          truncated=n > len(shown))]

    def refusal(self, seq):
        """(reason, code) when the request can never run here, else None. The code is a stable
        name for API clients; the reason is prose."""
        sched = self.scheduler
        n, new = len(seq.prompt_ids), seq.params.max_new_tokens
        need = n + new
        if need > self.max_context:
            return (f"prompt ({n} tokens) + max_new_tokens ({new}) exceeds the context of "
                    f"{self.max_context} tokens", "context_length_exceeded")
        too_big = sched.never_fits(seq)
        if too_big:
            return too_big, "exceeds_cache"
        if len(sched.waiting) >= sched.max_waiting:
            return f"queue full ({sched.max_waiting} waiting)", "queue_full"
        return None
