"""A request's way in: a `GenerateRequest` (engine/core/request.py, validated when built) resolved
against the live settings and its prompt tokenized (in the submitting thread: the request's
tokenize stage), the `request` and `tokenized` events that announce it,
and why it can never run on this engine (a `rejected` reason and code).

`Intake.new_sequence` touches no engine state, so any thread may call it (through
`Engine.new_sequence`); `announce` and `refusal` run on the engine's caller, in `Engine.add`.
"""
import itertools

from ..events import Rejected, Request, Tokenized
from ..model.structured import Grammars
from .request import RequestHandle
from .sequence import Sequence
from ..settings import SettingError, check_text

CHIPS_OWN, CHIPS_LOAD = 512, 48   # prompt tokens shown as chips in `tokenized` events
# A chat asked of a model whose tokenizer has no chat template (a base model's file): vLLM's words
NO_TEMPLATE = ("the model's tokenizer has no chat template: as of transformers v4.44, default chat template is no "
               "longer allowed, so you must provide a chat template if the tokenizer does not define one "
               "(/v1/completions takes a plain prompt)")


class Intake:
    def __init__(self, tokenizer, clock, max_context, scheduler):
        self.tokenizer = tokenizer
        self.clock = clock
        # what a request leaves out (settings.SamplingSettings): the engine's `apply_settings`
        # hands each new one over; the submitting threads read it whole
        self.sampling = None
        self.max_context = max_context
        self.scheduler = scheduler
        self.grammars = Grammars(tokenizer)   # structured output's matchers (the tokenizer converted once)
        self._ids = itertools.count(1)

    def new_sequence(self, request):
        """A `GenerateRequest` (validated when built) tokenized, with its sampling resolved against
        the live sampling settings: a Sequence not yet known to the engine (hand it to `Engine.add`).
        Raises SettingError for what only the engine can judge (its context, the prompt's text
        once templated, a prompt that tokenizes to nothing)."""
        arrival = self.clock.now()
        params = request.sampling(self.sampling, self.max_context, len(self.tokenizer))
        text, ids = self._tokenize(request)
        if request.prompt_tokens is not None:
            ids = ids[:request.prompt_tokens]
        rid = f"r{next(self._ids)}"
        seq = Sequence(id=rid, source=request.source, prompt=text, prompt_ids=ids, params=params,
                       arrival=arrival, tokenize_end=self.clock.now(), label=request.label,
                       preview=request.shown() or text, handle=RequestHandle(rid, request.stream, len(ids)))
        if params.prompt_logprobs is not None:
            seq.prompt_odds = [None] * len(ids)
        if params.structured_outputs:
            seq.grammar = self.grammars.matcher(params.structured_outputs)
        return seq

    def _tokenize(self, request):
        """(the prompt's text, its token ids), tokenized as vLLM does: a chat through the model's own
        template, its text without special tokens added (the template writes them), a plain prompt
        with the tokenizer's special tokens (Gemma's BOS; SmolLM2's tokenizer adds none), unless
        the request's `add_special_tokens` says otherwise."""
        if request.prompt_ids is not None:
            return self._token_prompt(request.prompt_ids)
        template = self.tokenizer.chat_template
        if request.messages is not None and not template:
            raise SettingError("chat_template", NO_TEMPLATE)
        chat = request.messages if request.messages is not None else \
            [{"role": "user", "content": request.prompt}] if request.chat and template else None
        text = request.prompt if chat is None else \
            self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        check_text("prompt", text)   # a lone surrogate is a TypeError in the tokenizer
        special = chat is None if request.add_special_tokens is None else request.add_special_tokens
        ids = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        if not ids:
            raise SettingError("prompt", "tokenizes to nothing")
        return text, ids

    def _token_prompt(self, ids):
        """A prompt given as token ids (the API's token arrays): taken as they are, not retokenized
        (no special token added), once each is checked to be in the vocabulary; its text decoded."""
        vocab = len(self.tokenizer)
        bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise SettingError("prompt", f"token id {ids[bad]} (at {bad}) is not in this model's vocabulary "
                                         f"(0 to {vocab - 1})")
        return self.tokenizer.decode(ids), list(ids)

    def announce(self, seq):
        """The `request` and `tokenized` events of a request reaching the engine."""
        n = len(seq.prompt_ids)
        # Token chips: a person's own prompt in full (up to 512), a generated one abridged, to
        # keep the stream small under heavy load.
        shown = seq.prompt_ids[:CHIPS_LOAD if seq.source == "load" else CHIPS_OWN]
        return [Request(t=seq.arrival, id=seq.id, source=seq.source, prompt_tokens=n,
                        max_new_tokens=seq.params.max_new_tokens, preview=(seq.preview or seq.prompt)[:80], label=seq.label),
                Tokenized(t=seq.tokenize_end, id=seq.id, start=seq.arrival, end=seq.tokenize_end, n=n,
                          ids=shown, pieces=self.tokenizer.batch_decode([[i] for i in shown]),
                          truncated=n > len(shown))]

    def reject(self, seq, reason, code):
        """The request's `rejected` event, built once (the step recorder's `to_client` hands it to
        its client; it is published by the engine, or by the driver when it never reached it)."""
        return Rejected(t=self.clock.now(), id=seq.id, reason=reason, code=code)

    def refusal(self, seq):
        """(reason, code) when the request can never run here, else None. The code is a stable
        name for API clients; the reason is prose."""
        sched = self.scheduler
        n, new = len(seq.prompt_ids), seq.params.max_new_tokens
        need = n + new
        if need > self.max_context:
            return (f"prompt ({n} tokens) + max_new_tokens ({new}) exceeds the context of "
                    f"{self.max_context} tokens", "context_length_exceeded")
        too_big = sched.blocks.never_fits(seq)
        if too_big:
            return too_big, "exceeds_cache"
        if len(sched.waiting) >= sched.max_waiting:
            return f"queue full ({sched.max_waiting} waiting)", "queue_full"
        return None
