"""One request as a client sees it: `GenerateRequest`, the single typed request every client
builds (the OpenAI API, the page's websocket, a classroom phone, the load generator, a
preset's bursts, the bench) and hands to `Backend.submit`, and `RequestHandle`, what
`submit` gives back: the request's id and its own events, the one output path.

It is validated once, when it is built: a bad value raises `SettingError` naming the field,
and nothing has been queued, tokenized or reserved. What depends on the engine (a default
taken from the live settings when a value is left out, bounds given by the model's context)
is resolved in one place, `GenerateRequest.sampling`, when the engine takes the request in
(engine/core/intake.py, which also tokenizes it).
"""
import copy
from dataclasses import dataclass
import queue
from typing import get_args

from ..events import MAX_TOP, Finished, Rejected, Source
from .fields import FIELDS, SETTING_FIELDS, Requested
from .sequence import SamplingParams
from ..settings import MAX_SPEC_TOKENS, SPECULATION, SettingError, check_text, coerce, shown

MAX_PROMPT_CHARS = 200_000
MAX_LABEL_CHARS = 64   # a request's label (a classroom name; the classroom itself allows fewer)
MAX_STOPS = 4          # OpenAI's limit on stop strings
SOURCES = tuple(s for s in get_args(Source) if s != "observe")   # observe mode's own load is no client's


@dataclass(frozen=True)
class GenerateRequest(Requested):
    """Everything a client may ask for one request: the fields of the request registry
    (engine/core/fields.py: sampling, stopping, scheduling; keyword-only), and these. Left out
    (None), the registry's `setting` fields take the engine's live settings (the page's sliders)."""
    prompt: str | None = None          # the text, used as it is unless `chat`
    prompt_ids: tuple | None = None    # or the prompt as token ids, taken as they are (checked against the vocabulary)
    messages: list | None = None       # or a chat: [{"role", "content"}, ...] through the chat template
    chat: bool = False                 # wrap `prompt` as one user message (when the model has a template)
    stop: tuple = ()                   # up to 4 stop strings: the output ends just before the first
    label: str | None = None           # who asked, shown on the timeline (a classroom student's name)
    source: str = "api"                # page | load | api | join
    stream: bool = False               # the client reads its events from the handle `submit` returns
    prompt_tokens: int | None = None   # cut the prompt to this many tokens (the load generator's lengths)
    # Its own speculative decoding, over the `speculation` / `spec_tokens` settings (vLLM's
    # engine-level names, per request here): {"method": "off" | "ngram" | "suffix",
    # "num_speculative_tokens": 1-8}, either or both; None: the settings'.
    speculative_config: dict | None = None
    # The odds of each token for its client (the API's logprobs): how many of the most likely
    # candidates, 0-20 (0: the chosen token's own only); None: not asked (its events still carry
    # the page's candidates, engine/model/sampler.py)
    logprobs: int | None = None
    # Whether the tokenizer adds its own special tokens (a BOS where it wants one) around the text,
    # vLLM's field; None: vLLM's defaults, yes for a plain prompt and no for a chat template's text
    # (the template writes its own, and a second BOS would change what the model reads)
    add_special_tokens: bool | None = None
    # The odds of each prompt token given those before it (vLLM's `prompt_logprobs`, the API's
    # echo with logprobs): how many candidates, 0-20; None: not asked. Computed in the prefill
    # (engine/model/runner.py); such a request does not read the prefix cache (block_manager.py)
    prompt_logprobs: int | None = None

    def __post_init__(self):
        # Each check names its field; values of another numeric form (5.0 for 5) are normalised.
        fix = lambda name, value: object.__setattr__(self, name, value)   # noqa: E731 -- frozen
        if self.label is not None:
            if not isinstance(self.label, str) or not self.label or len(self.label) > MAX_LABEL_CHARS:
                raise SettingError("label", f"must be a non-empty string of up to {MAX_LABEL_CHARS} characters")
            check_text("label", self.label)
        for f in FIELDS:
            fix(f.name, f.check(getattr(self, f.name)))
        for name, kind, lo, hi in (("prompt_tokens", "int", 1, None), ("logprobs", "int", 0, MAX_TOP),
                                   ("prompt_logprobs", "int", 0, MAX_TOP)):
            if getattr(self, name) is not None:
                fix(name, coerce(name, kind, getattr(self, name), lo, hi))
        fix("stop", self._stops(self.stop))
        for name in ("chat", "stream"):
            coerce(name, "bool", getattr(self, name))
        if self.add_special_tokens is not None:
            coerce("add_special_tokens", "bool", self.add_special_tokens)
        if self.source not in SOURCES:
            raise SettingError("source", f"must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.speculative_config is not None:
            fix("speculative_config", self._speculative(self.speculative_config))
        self._check_prompt()

    @staticmethod
    def _stops(stop):
        if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS \
                or not all(isinstance(s, str) and s for s in stop):
            raise SettingError("stop", f"must be up to {MAX_STOPS} non-empty strings")
        for s in stop:
            check_text("stop", s)
        return tuple(stop)

    @staticmethod
    def _speculative(config):
        """`speculative_config` checked, its count normalised (a copy: the request is frozen)."""
        field = "speculative_config"
        if not isinstance(config, dict) or not config or set(config) - {"method", "num_speculative_tokens"}:
            raise SettingError(field, "must be an object with `method` and/or `num_speculative_tokens`")
        method, k = config.get("method"), config.get("num_speculative_tokens")
        if method is not None and method not in SPECULATION:
            raise SettingError(field, f"method must be one of {', '.join(SPECULATION)}, got {str(method)[:40]!r}")
        if k is not None:
            try:
                k = coerce("num_speculative_tokens", "int", k, 1, MAX_SPEC_TOKENS)
            except SettingError as e:
                raise SettingError(field, str(e)) from None
        return {"method": method, "num_speculative_tokens": k}

    def _check_prompt(self):
        """A prompt, token ids or messages, of the right shapes (their text is checked once
        templated, and the ids against the vocabulary, in engine/core/intake.py, where the
        tokenizer takes them)."""
        if self.prompt_ids is not None:
            ids = self.prompt_ids
            if self.prompt is not None or self.messages is not None or self.chat:
                raise SettingError("prompt", "give token ids alone: not with a prompt, messages or chat")
            if not isinstance(ids, (list, tuple)) or not ids or len(ids) > MAX_PROMPT_CHARS or \
                    not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise SettingError("prompt", "token ids must be a non-empty list of whole numbers")
            object.__setattr__(self, "prompt_ids", tuple(ids))
        elif self.messages is not None:
            if self.prompt is not None:
                raise SettingError("prompt", "give a prompt or messages, not both")
            if not isinstance(self.messages, list) or not self.messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in self.messages):
                raise SettingError("messages", 'must be a non-empty list of {"role", "content"} strings')
        elif not isinstance(self.prompt, str) or not self.prompt:
            raise SettingError("prompt", "must be a non-empty string")
        elif len(self.prompt) > MAX_PROMPT_CHARS:
            raise SettingError("prompt", f"longer than {MAX_PROMPT_CHARS} characters")

    def samples(self):
        """The engine requests of its `n` samples (vLLM's parallel sampling): each this request with
        n = 1, queued on its own (a prompt's later samples find its blocks in the prefix cache as
        any request would); seeded, sample i draws with seed + i (vLLM's), so the samples differ and
        each is reproducible. Copies of a request already checked: not validated again."""
        out = []
        for i in range(self.n):
            one = copy.copy(self)
            object.__setattr__(one, "n", 1)
            if self.seed is not None:
                object.__setattr__(one, "seed", (self.seed + i) % 2**63)   # the seed's range, wrapped
            out.append(one)
        return out

    def shown(self):
        """What the person asked, as a timeline row previews it: the last user message of a
        chat (not the chat template around it, the same for every row), else the prompt."""
        if self.messages is not None:
            said = [m["content"] for m in self.messages if m["role"] == "user"]
            return said[-1] if said else self.messages[-1]["content"]
        return self.prompt   # None for token ids: intake shows their text

    def sampling(self, settings, max_context, vocab):
        """The sampling parameters on this engine: what was left out taken from its live
        `settings` (settings.SamplingSettings), bounded by its context and its vocabulary of
        `vocab` tokens (the one place those defaults are resolved)."""
        if self.n != 1:
            raise SettingError("n", f"a request of {self.n} samples is queued as its samples (GenerateRequest.samples)")
        given = {f.name: getattr(self, f.name) for f in FIELDS}
        for name in SETTING_FIELDS:
            if given[name] is None:
                given[name] = getattr(settings, name)
        new = given["max_new_tokens"]
        if new > max_context:
            raise SettingError("max_new_tokens", f"must be at most {max_context}, got {shown(new)}")
        if self.min_tokens > new:
            raise SettingError("min_tokens", f"must be at most max_new_tokens ({new})")
        for f in FIELDS:
            if f.kind in ("token_ids", "token_bias"):
                f.check_ids(given[f.name], vocab)
        spec = self.speculative_config or {}
        # a constrained request does not speculate: its mask is one row's, after the tokens it accepted
        method = "off" if self.structured_outputs else spec.get("method")
        return SamplingParams(**given, stop=self.stop, speculation=method,
                              spec_tokens=spec.get("num_speculative_tokens"), logprobs=self.logprobs,
                              prompt_logprobs=self.prompt_logprobs)


class RequestHandle:
    """What `Backend.submit` returns: the request's id and, when it was submitted with
    `stream=True`, its own events as they happen: `Token`s, then one `Finished` or `Rejected`
    (engine/events.py), the very objects published to pages, so each is built once.

        event = handle.next(timeout)   # the next one, or None if none came within `timeout` s
        for event in handle: ...       # each to the last one (blocking)

    Without `stream` nothing is kept (the page and the load generator follow events only)."""

    def __init__(self, rid, stream=False, prompt_tokens=None):
        self.id = rid
        self.prompt_tokens = prompt_tokens   # its prompt's length in tokens, once tokenized (intake)
        self._events = queue.SimpleQueue() if stream else None
        self.ended = False   # the last event (Finished or Rejected) has been read

    def put(self, event):
        """The engine's side: one of this request's events, in order."""
        if self._events is not None:
            self._events.put(event)

    def next(self, timeout=None):
        if self._events is None:
            raise ValueError(f"request {self.id} was submitted without stream=True: its events go to pages only")
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            return None
        self.ended = isinstance(event, (Finished, Rejected))
        return event

    def events(self, timeout=None):
        """Each event to the last; TimeoutError if one takes longer than `timeout` seconds."""
        while not self.ended:
            event = self.next(timeout)
            if event is None:
                raise TimeoutError(f"request {self.id}: no event within {timeout} s")
            yield event

    def __iter__(self):
        return self.events()
