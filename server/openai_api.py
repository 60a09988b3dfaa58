"""The OpenAI-compatible API, transport-free: JSON bodies in, a `GenerateRequest` (the one
typed request every client builds, engine/core/request.py) out; engine outputs in, OpenAI-shaped
responses and server-sent-event chunks out. The Flask routes (server/api.py) only move bytes.

Validation: OpenAI's own shapes (model, messages, stop, stream) are checked here, and
completions' prompt forms, echo and prompt log-probabilities in server/prompts.py;
every value the engine also takes (max_tokens, temperature, top_p, seed, the prompt text)
is validated by the request itself as it is built (and by the engine where only it can judge:
its context, the templated text), and its `SettingError` comes back under the OpenAI
parameter's name.

Defaults follow OpenAI where it has a finite one: temperature 1, top_p 1, and max_tokens 16
for /v1/completions. Chat completions have no finite OpenAI default, so an omitted
max_tokens there means the engine's `max_new_tokens` setting (the page's slider).

The request's own fields (max_tokens, temperature, top_p, min_p, seed, logit_bias, the
penalties, stop_token_ids, priority...) come from one registry, engine/core/fields.py, each
under its OpenAI/vLLM name (`_fields`).

vLLM's extensions that load generators use to fix output lengths are accepted: `ignore_eos`
(keep generating past end-of-sequence) and `min_tokens` (neither end-of-sequence nor a stop
string ends the output before this many tokens). `usage.prompt_tokens_details.cached_tokens`
reports the prompt tokens found in the prefix cache, as OpenAI's API does. A request may set
its own speculative decoding with `speculative_config` (vLLM's field names, which vLLM takes
per engine only): `{"method": "off" | "ngram" | "suffix", "num_speculative_tokens": 1-8}`.
`add_special_tokens` as vLLM has it: a completion's prompt gets the tokenizer's own special tokens
(its BOS, where it adds one) unless it is false; a chat's templated text gets none unless it is true.
A chat to a model whose tokenizer has no chat template is a 400 naming `chat_template`.

Log-probabilities, as vLLM serves them: chat `logprobs: true` with `top_logprobs` 0-20, and
completions' legacy `logprobs: N` (0-20; `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`),
streamed or not. They are the model's own (`raw_logprobs`, vLLM's default `logprobs_mode`): the
log-softmax of the logits, before temperature and top-p, whatever the request samples with; the
token's probability as it was drawn (after them) is the page's (`token.p`). Each token's `token`
is the token decoded alone (as vLLM's are: part of a character decodes to "\ufffd"), `bytes` its
UTF-8. Every generated token has its entry, the one that completes a stop string too; a streamed
token whose text is held back (part of a character, or of a possible stop string) has its entry in
the next chunk that carries text (or the last). Completions' `echo` (with `logprobs`: the prompt's
tokens first, the first `None`), `max_tokens: 0` with echo and vLLM's `prompt_logprobs`, computed
in the prefill, and prompts as token ids or lists of prompts (a choice each): server/prompts.py.

`n` samples (vLLM's parallel sampling): each its own engine request (GenerateRequest.samples, seeded
ones with seed + i), queued and refused together, choices indexed prompt * n + sample, `usage` with
each prompt's tokens once (vLLM's count), streamed chunks interleaved as they come. `best_of` (which
vLLM's V1 engine dropped) is refused. Structured output (`response_format`, vLLM's
`structured_outputs` and `guided_*`): server/structured_api.py, one registry field.

`stream_options.continuous_usage_stats` (vLLM's, with `include_usage`) puts the usage so far on
every chunk. `tools` are accepted with `tool_choice: "none"` (and ignored); any other choice is a
400 naming `tool_choice`, this server having no tool-call parser.

Stop strings: the engine applies OpenAI's rule (engine/core/detok.py, `StopStrings`: the text ends
just before the first stop string, a possible start of one held back until decided), and each
`token` event carries the text the client gets (`Token.client()`); it is forwarded as it is.

No request outlives its client or its deadline: `outputs` cancels the request in the engine
when the deadline (`--request-timeout`) passes (504, or an error chunk once streaming), when
the client is seen to have closed its connection, or when the response is closed early.
"""
import contextlib
from dataclasses import dataclass
import itertools
import json
import time

from engine.events import MAX_TOP, Finished, Rejected, Token
from engine.core.fields import FIELDS
from engine.core.request import GenerateRequest
from engine.core.queues import MAX_WAITING
from engine.settings import SettingError, coerce
from . import delivery
from .errors import ApiError
from .prompts import echo_text, logprob, prompts_of, request_fields, vllm_prompt_logprobs
from .structured_api import constraint_of

MAX_BODY_BYTES = 1 << 20
COMPLETIONS_DEFAULT_MAX_TOKENS = 16   # OpenAI's documented default for /v1/completions
REQUEST_TIMEOUT_S = 600.0   # default deadline of one API request (--request-timeout)
PROBE_S = 0.5   # how often a waiting request looks for its deadline and its client; a stream
                # silent this long gets an SSE comment (a write that fails when the client left)
POLL_S = 0.005  # how long a stream of several choices waits on one before looking at the next
ROLES = ("system", "developer", "user", "assistant")
# Parameters that would change the output in ways this engine does not implement: refused
# unless given their neutral value, rather than silently ignored.
UNSUPPORTED = ("functions", "suffix")
NEUTRAL = (None, False, 0, [], {}, {"type": "text"})
COMPLETIONS_ONLY = ("echo", "prompt_logprobs")


@dataclass
class ApiRequest:
    kind: str              # "chat" or "completion"
    requests: list         # what the engine is asked (it always streams to us): a GenerateRequest per
                           # choice, in `index` order (per prompt of a completions list, its n samples)
    stream: bool           # whether the client asked for server-sent events
    include_usage: bool
    names: dict            # engine field -> the OpenAI parameter it came from
    logprobs: int | None = None   # candidates asked with each token's log-probability; None: no logprobs
    continuous_usage: bool = False   # stream_options.continuous_usage_stats: usage on every chunk (vLLM's)
    echo: list | None = None  # completions' echo: per choice the text it begins with (server/prompts.py)
    silent: bool = False      # max_tokens 0 with echo: the one token the engine generates is not shown
    prompt_logprobs: int | None = None   # vLLM's prompt_logprobs: candidates in each choice's `prompt_logprobs`
    n: int = 1                # samples of each prompt: `requests` holds each prompt's n in a row


def parse_request(kind, body, model_name, decode=None):
    """Validate an OpenAI chat/completions body; return an ApiRequest or raise ApiError.
    `decode(ids)`: the text of token ids (an echoed token-id prompt's)."""
    check_model(body, model_name)
    for name in UNSUPPORTED:
        if body.get(name) not in NEUTRAL:
            raise ApiError(400, f"`{name}` is not supported by this server", name, "unsupported_parameter")
    for name in COMPLETIONS_ONLY:
        if kind == "chat" and body.get(name) not in NEUTRAL:
            raise ApiError(400, f"`{name}` is a /v1/completions parameter here", name, "unsupported_parameter")
    _tools(body)
    best_of = body.get("best_of")
    if best_of is not None and (isinstance(best_of, bool) or best_of != 1):
        raise ApiError(400, "`best_of` is not supported (vLLM's V1 engine dropped it too): ask for `n` samples "
                            "with `logprobs` and choose among them", "best_of", "unsupported_parameter")
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be true or false", "stream")
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise ApiError(400, "`stream_options` is only allowed when `stream` is true", "stream_options")
        if not isinstance(options, dict) or not all(isinstance(options.get(k, False), bool)
                                                    for k in ("include_usage", "continuous_usage_stats")):
            raise ApiError(400, "`stream_options` must be an object with booleans `include_usage` and "
                                "`continuous_usage_stats`", "stream_options")
        include_usage = options.get("include_usage", False)
        # vLLM's: usage on every chunk, when usage is asked for at all
        continuous = include_usage and options.get("continuous_usage_stats", False)

    logprobs = _logprobs(kind, body)
    max_name = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_name = "max_completion_tokens"   # OpenAI's newer name wins when both are given
    max_tokens = body.get(max_name)
    if max_tokens is None and kind == "completion":
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    echo = _flag(body, "echo")
    silent = echo and max_tokens == 0 and not isinstance(max_tokens, bool)
    if silent:
        max_tokens = 1   # vLLM's echo without generation: one token generated, not shown
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is not None:
        prompt_logprobs = _count("prompt_logprobs", prompt_logprobs)
    # the prompt's odds are computed when echo shows them in `logprobs`, or vLLM's field asks
    engine_prompt = max((k for k in (prompt_logprobs, logprobs if echo else None) if k is not None), default=None)
    constraint, constraint_param = constraint_of(body)
    fields = dict(_fields(body), source="api", stream=True, max_new_tokens=max_tokens, stop=_stop(body.get("stop")),
                  speculative_config=body.get("speculative_config"), logprobs=logprobs,
                  prompt_logprobs=engine_prompt, add_special_tokens=body.get("add_special_tokens"))
    names = {f.name: f.body_name for f in FIELDS} | {"max_new_tokens": max_name, "prompt": "messages" if kind == "chat" else "prompt",
             "logprobs": "top_logprobs" if kind == "chat" else "logprobs",
             "prompt_logprobs": "prompt_logprobs" if prompt_logprobs is not None else "logprobs"}
    if constraint is not None:
        fields["structured_outputs"] = constraint
        names["structured_outputs"] = constraint_param
    if kind == "chat":
        prompts, each = [None], [{"messages": messages_of(body.get("messages"))}]
    else:
        prompts = prompts_of(body.get("prompt"))
        each = [request_fields(p) for p in prompts]
    with _openai_names(names):
        # each prompt's n samples (vLLM's order: choice index = prompt * n + sample)
        requests = [r for one in each for r in GenerateRequest(**fields, **one).samples()]
    n = len(requests) // len(prompts)
    if len(requests) > MAX_WAITING:
        raise ApiError(400, f"n ({n}) x {len(prompts)} prompts is {len(requests)} requests; the queue holds "
                            f"{MAX_WAITING}", "n")
    return ApiRequest(kind, requests, stream, include_usage, names, logprobs, continuous,
                      [echo_text(p, decode) for p in prompts for _ in range(n)] if echo else None, silent,
                      prompt_logprobs, n)


def _flag(body, name):
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"`{name}` must be true or false", name)
    return bool(value)


def _tools(body):
    """`tools` are accepted with `tool_choice: "none"` (the model is not to call one: they are
    ignored); calling one needs a tool-call parser, which this server does not have."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "`tools` must be a list", "tools")
    if choice is None:
        choice = "auto" if tools else "none"   # OpenAI's default
    if choice != "none":
        raise ApiError(400, f"`tool_choice` {json.dumps(choice)[:60]} is not supported: this server has no "
                            "tool-call parser; send `tool_choice: \"none\"` (tools are then ignored)",
                       "tool_choice", "unsupported_parameter")


def check_model(body, model_name, required=True):
    """ApiError unless `body`'s `model` names the served model (left out: fine unless `required`)."""
    model = body.get("model")
    if model is None and not required:
        return
    if not isinstance(model, str) or not model:
        raise ApiError(400, "you must provide a model parameter (a string)", "model")
    if model != model_name:
        raise ApiError(404, f"The model `{model}` does not exist; this server serves `{model_name}`",
                       "model", "model_not_found")


def _fields(body):
    """The registry's fields (engine/core/fields.py) this body sets, by their engine names; one
    left out takes OpenAI's default where it has its own (temperature 1, top_p 1), else the
    request's. (max_tokens, whose default depends on the endpoint, is `parse_request`'s.)"""
    out = {}
    for f in FIELDS:
        value = body.get(f.body_name)
        out[f.name] = f.api_default if value is None else value
    return {name: value for name, value in out.items() if value is not None}


def _logprobs(kind, body):
    """How many candidates the client asks for with each token's log-probability, or None when
    it asks for none: chat's `logprobs` (a boolean) and `top_logprobs` (0-20, which needs
    `logprobs: true`), completions' `logprobs` (0-20). A bad value is a 400 naming its field."""
    if kind == "chat":
        on, top = body.get("logprobs"), body.get("top_logprobs")
        if on is not None and not isinstance(on, bool):
            raise ApiError(400, f"`logprobs` must be true or false, got {json.dumps(on)[:40]}", "logprobs")
        if top is not None:
            top = _count("top_logprobs", top)
            if not on:
                raise ApiError(400, "`top_logprobs` needs `logprobs: true`", "top_logprobs")
        return (top or 0) if on else None
    if body.get("top_logprobs") is not None:
        raise ApiError(400, "`top_logprobs` is a chat completions parameter: /v1/completions takes `logprobs` "
                            f"(0-{MAX_TOP})", "top_logprobs")
    n = body.get("logprobs")
    return None if n is None else _count("logprobs", n)


def _count(name, value):
    try:
        return coerce(name, "int", value, 0, MAX_TOP)
    except SettingError as e:
        raise ApiError(400, f"`{name}` must be a whole number from 0 to {MAX_TOP}: {e.message}", name) from None


@contextlib.contextmanager
def _openai_names(names):
    """A SettingError raised inside becomes a 400 naming the OpenAI parameter it came from."""
    try:
        yield
    except SettingError as e:
        param = names.get(e.field, e.field)
        raise ApiError(400, f"{param}: {e.message}", param) from None


def _stop(value):
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(value)   # GenerateRequest checks they are up to 4 non-empty strings
    raise ApiError(400, "`stop` must be a string or a list of strings", "stop")


def messages_of(value):
    """OpenAI chat `messages` as the engine takes them, or ApiError naming the bad part."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, "`messages` must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"`{where}` must be an object", where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"`{where}.role` must be one of {', '.join(ROLES)}", f"{where}.role")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(m.get("content"), where)})
    return out


def _content(content, where):
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"`{where}.content` must be a string or a list of text parts", f"{where}.content")


def submit(backend, requests, names, handles):
    """Queue `requests`, their handles appended to `handles` (whose requests are cancelled on any
    error). A SettingError from the engine becomes a 400 naming the OpenAI parameter."""
    with _all_or_none(backend, handles), _openai_names(names):
        for request in requests:
            handles.append(backend.submit(request))


@contextlib.contextmanager
def _all_or_none(backend, handles):
    """Whatever raises inside cancels every request of `handles` in the engine (one refused, the
    client gone, a deadline passed), so none runs on for nobody; one whose end was read (refused,
    done) is left as it is."""
    try:
        yield
    except BaseException:
        for handle in handles:
            if not handle.ended:
                backend.cancel(handle.id)
        raise


class ClientGone(Exception):
    """The client closed its connection: nobody is left to answer."""


def outputs(backend, handle, timeout_s, gone, probe=PROBE_S):
    """The request's own events (`Token`s, then `Finished` or `Rejected`, from its RequestHandle),
    with a None whenever `probe` seconds pass without one. Raises ApiError (504) once `timeout_s` has
    passed and ClientGone once `gone()` says the client left; then, or when closed before the
    request ended, cancels it in the engine (slot and blocks freed)."""
    deadline = time.monotonic() + timeout_s
    ended = False
    handle = delivery.wrap(handle, backend.settings)   # a buffering proxy / injected delay, when set
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApiError(504, f"the request did not finish within its deadline of {timeout_s:g} s "
                                    "(the server's --request-timeout); it was cancelled", code="timeout")
            if gone():
                raise ClientGone()
            event = handle.next(timeout=min(probe, left))
            ended = handle.ended
            yield event
            if ended:
                return
    finally:
        if not ended:
            backend.cancel(handle.id)


def first_output(items, prompt_param):
    """Wait for the request's first event (so a rejection can still be an HTTP error status)."""
    for item in items:
        if item is None:
            continue
        if isinstance(item, Rejected):
            reason, code = item.reason, item.code
            if code == "queue_full":
                raise ApiError(429, f"the engine is overloaded: {reason}; retry later", code=code, retry_after=1)
            if code == "engine_error":
                raise ApiError(503, reason, code=code)
            # exceeds_cache: no cache this server can offer holds the request: its context limit
            raise ApiError(400, f"This request is too long for this server: {reason}",
                           prompt_param, "context_length_exceeded")
        return item


def finish_reason(event):
    """OpenAI's finish_reason for the engine's `finished` event (ApiError if it did not complete)."""
    reason = event.reason
    if reason in ("stop", "stop_string"):
        return "stop"
    if reason == "length":
        return "length"
    if reason == "cancelled":
        raise ApiError(503, "the request was cancelled in the engine (reset)", code="cancelled")
    raise ApiError(500, f"the engine failed on this request ({reason})", code=reason)


def usage(event, silent=False):
    """One choice's usage from its `finished` event (`silent`: the one generated token not shown)."""
    p, c = event.prompt_tokens, 0 if silent else event.output_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": event.cached_tokens or 0}}


def total(counts, n=1):
    """The usage of several choices (in `index` order, each prompt's `n` samples in a row), as vLLM
    counts it: the completion tokens of every choice, a prompt's tokens once (its first sample's,
    with the tokens that sample found in the prefix cache)."""
    firsts = counts[::n]
    prompt, completion = sum(c["prompt_tokens"] for c in firsts), sum(c["completion_tokens"] for c in counts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(c["prompt_tokens_details"]["cached_tokens"]
                                                           for c in firsts)}}


class Logprobs:
    """One choice's log-probabilities, token by token (`add`; an echoed prompt's first,
    `add_prompt`), handed out in OpenAI's shapes (`take`: those added since the last take): chat's
    `{"content": [...]}` entries, or the legacy completions object, whose `text_offset` runs on
    over the whole text."""

    def __init__(self, kind, k):
        self.kind, self.k = kind, k
        self.pending, self.offset = [], 0   # (own text, p_raw, top, text added)

    def add(self, event):
        self.pending.append((event.own_text, event.p_raw, event.top, event.client()))

    def add_prompt(self, entries):
        """The prompt's tokens (engine/core/engine.py's entries): the first has no log-probability."""
        self.pending += [(e["own_text"], e.get("p_raw"), e.get("top"), e["text"]) for e in entries]

    def take(self):
        items, self.pending = self.pending, []
        if self.kind == "chat":
            return {"content": [self._entry(own, p) | {"top_logprobs": [
                self._entry(text, raw) for _, text, _, raw in top[:self.k]]} for own, p, top, _ in items]}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for own, p, top, text in items:
            odds = None
            if p is not None:   # None: an echoed prompt's first token (OpenAI's null)
                odds = {t: logprob(raw) for _, t, _, raw in top[:self.k]}
                odds[own] = logprob(p)   # OpenAI: the token's own is always there (keyed by text, its own wins a clash)
            out["tokens"].append(own)
            out["token_logprobs"].append(None if p is None else logprob(p))
            out["top_logprobs"].append(odds)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    @staticmethod
    def _entry(text, p):
        return {"token": text, "logprob": logprob(p), "bytes": list(text.encode("utf-8"))}


class Reply:
    """Shapes one request's text into OpenAI responses or stream chunks: `choice` is one choice
    (`index`) of it; with `logprobs` (the candidates asked for), each token's log-probabilities
    too (`token`, before its text). Completions' `echo` (the prompt's text), `silent` and
    `prompt_logprobs` are server/prompts.py's. `usage_mode`: stream chunks carry no `usage`
    (None), `usage: null` ("null"), or the counts so far ("continuous")."""

    def __init__(self, req, rid, model, index=0, prompt_tokens=None):
        self.kind = req.kind
        self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + rid
        self.created = int(time.time())
        self.model, self.index = model, index
        self.logprobs = None if req.logprobs is None else Logprobs(self.kind, req.logprobs)
        self.echo = None if req.echo is None else req.echo[index]
        self.silent, self.k_prompt = req.silent, req.prompt_logprobs
        self.prompt_odds = None     # vLLM's prompt_logprobs, once the first token brought them
        self.usage_mode = "continuous" if req.continuous_usage else "null" if req.include_usage else None
        self.prompt_tokens, self.generated = prompt_tokens, 0

    def token(self, event):
        """A token's text for the client (its log-probabilities kept for the next chunk); the first
        one's comes after the echoed prompt (and its log-probabilities)."""
        text = ""
        if event.index == 0:
            if self.echo is not None:
                text = self.echo
                if self.logprobs is not None:
                    self.logprobs.add_prompt(event.prompt)
            if self.k_prompt is not None:
                self.prompt_odds = vllm_prompt_logprobs(event.prompt, self.k_prompt)
        if self.silent:
            return text
        self.generated += 1
        if self.logprobs is not None:
            self.logprobs.add(event)
        return text + event.client()

    def finish(self, event):
        """OpenAI's finish_reason (an echo without generation ends at its length: none was asked)."""
        reason = finish_reason(event)
        return "length" if self.silent else reason

    def _odds(self):
        return None if self.logprobs is None else self.logprobs.take()

    def _envelope(self, obj, choices):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def chunk(self, text=None, finish=None, role=False):
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            out = self._envelope("chat.completion.chunk", [{"index": self.index, "delta": delta,
                                                            "logprobs": None if role else self._odds(),
                                                            "finish_reason": finish}])
        else:
            choice = {"index": self.index, "text": text or "", "logprobs": self._odds(), "finish_reason": finish}
            if self.prompt_odds is not None:    # with the first chunk only
                choice["prompt_logprobs"], self.prompt_odds = self.prompt_odds, None
            out = self._envelope("text_completion", [choice])
        if self.usage_mode == "null":
            out["usage"] = None   # OpenAI sends `usage: null` on every chunk but the last when asked
        elif self.usage_mode == "continuous":
            p, c = self.prompt_tokens, self.generated
            out["usage"] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        return out

    def usage_chunk(self, counts):
        out = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", [])
        out["usage"] = counts
        return out

    def choice(self, text, finish):
        if self.kind == "chat":
            return {"index": self.index, "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": self._odds(), "finish_reason": finish}
        out = {"index": self.index, "text": text, "logprobs": self._odds(), "finish_reason": finish}
        if self.k_prompt is not None:
            out["prompt_logprobs"] = self.prompt_odds
        return out

    def full(self, choices, counts):
        out = self._envelope("chat.completion" if self.kind == "chat" else "text_completion", choices)
        out["usage"] = counts
        return out


def sse(obj):
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def _begin(backend, req, timeout_s, gone, probe=PROBE_S):
    """Submit every choice's request and wait for each one's first output (errors are still HTTP
    statuses up to here; any of them cancels them all): (their outputs, first outputs, Replies).
    With n samples, each prompt's first sample goes first and the others once it has its first
    token: its prompt's full blocks are in the prefix cache by then, so they read them instead of
    computing the prompt again (one prefill shared; submitted together, those admitted in its
    step would compute their own)."""
    n, handles, items, firsts = req.n, [], [], []
    leads = req.requests[::n]
    rest = [r for i, r in enumerate(req.requests) if i % n]
    with _all_or_none(backend, handles):
        for group in (leads, rest):
            start = len(handles)
            submit(backend, group, req.names, handles)
            items += [outputs(backend, h, timeout_s, gone, probe) for h in handles[start:]]
            firsts += [first_output(it, req.names["prompt"]) for it in items[start:]]
    order = list(range(0, len(req.requests), n)) + [i for i in range(len(req.requests)) if i % n]
    place = sorted(range(len(order)), key=order.__getitem__)   # choice index -> where it was submitted
    handles, items, firsts = ([xs[j] for j in place] for xs in (handles, items, firsts))
    replies = [Reply(req, handles[0].id, backend.api_model, i, h.prompt_tokens) for i, h in enumerate(handles)]
    return items, firsts, replies


def respond(backend, req, timeout_s=REQUEST_TIMEOUT_S, gone=lambda: False):
    """Run a non-streaming request to the end (each choice's); return the response body (or raise
    ApiError, or ClientGone). `gone()` tells whether the client has closed its connection."""
    items, firsts, replies = _begin(backend, req, timeout_s, gone)
    with contextlib.ExitStack() as stack:
        for it in items:
            stack.enter_context(contextlib.closing(it))   # closing one that has not ended cancels it
        choices, counts = [], []
        for reply, first, it in zip(replies, firsts, items):
            text = []
            for event in itertools.chain([first], it):
                if event is None:
                    continue
                if isinstance(event, Token):
                    text.append(reply.token(event))
                else:
                    choices.append(reply.choice("".join(text), reply.finish(event)))
                    counts.append(usage(event, req.silent))
                    break
        return replies[0].full(choices, total(counts, req.n))


def start_stream(backend, req, timeout_s=REQUEST_TIMEOUT_S, gone=lambda: False):
    """Submit and wait for the first outputs (errors are still HTTP statuses up to here); return
    the generator of SSE text. Closing it early (the client left) cancels the requests. Several
    choices' chunks are interleaved as their tokens come, each with its `index` (vLLM's)."""
    probe = PROBE_S if len(req.requests) == 1 else POLL_S
    items, firsts, replies = _begin(backend, req, timeout_s, gone, probe)
    return _stream(items, firsts, replies, req)


def _stream(items, firsts, replies, req):
    with contextlib.ExitStack() as stack:
        for it in items:
            stack.enter_context(contextlib.closing(it))   # closing one cancels it unless it ended
        counts = {}
        try:
            if replies[0].kind == "chat":
                for reply in replies:
                    yield sse(reply.chunk(role=True))
            for i, event in _interleaved(items, firsts):
                if event is None:
                    yield ": waiting\n\n"
                    continue
                reply = replies[i]
                if isinstance(event, Token):
                    text = reply.token(event)
                    if text:
                        yield sse(reply.chunk(text))
                    continue
                try:
                    finish = reply.finish(event)
                except ApiError as e:   # it failed: its error chunk, and the others are cancelled
                    yield sse(e.body())
                    break
                yield sse(reply.chunk(finish=finish))
                counts[i] = usage(event, req.silent)
            else:
                if req.include_usage:
                    yield sse(replies[0].usage_chunk(total([counts[i] for i in sorted(counts)], req.n)))
        except ApiError as e:   # the deadline passed mid-stream: the status is sent, so say it here
            yield sse(e.body())
        except ClientGone:
            return
        yield SSE_DONE


def _interleaved(items, firsts):
    """(choice, event) of every choice's outputs as they come: each one's first, then each in turn
    (one choice's `outputs` gives None after its probe, POLL_S when there are several), until each
    has ended; (None, None) whenever PROBE_S passes with nothing from any (a keep-alive)."""
    live = []
    for i, first in enumerate(firsts):
        yield i, first
        if not isinstance(first, (Finished, Rejected)):
            live.append(i)
    quiet = time.monotonic()
    while live:
        for i in list(live):
            event = next(items[i], None)
            if event is None:
                if time.monotonic() - quiet >= PROBE_S:
                    quiet = time.monotonic()
                    yield None, None
                continue
            quiet = time.monotonic()
            yield i, event
            if isinstance(event, (Finished, Rejected)):
                live.remove(i)


def models_list(model, created, max_context):
    return {"object": "list", "data": [{"id": model, "object": "model", "created": int(created),
                                        "owned_by": "first-token", "max_model_len": max_context}]}
