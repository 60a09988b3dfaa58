"""The OpenAI-compatible API, transport-free: JSON bodies in, a `GenerateRequest` (the one
typed request every client builds, engine/core/request.py) out; engine outputs in, OpenAI-shaped
responses and server-sent-event chunks out. The Flask routes (server/api.py) only move bytes.

Validation: OpenAI's own shapes (model, messages, prompt, stop, stream, n) are checked here;
every value the engine also takes (max_tokens, temperature, top_p, seed, the prompt text)
is validated by the request itself as it is built (and by the engine where only it can judge:
its context, the templated text), and its `SettingError` comes back under the OpenAI
parameter's name.

Defaults follow OpenAI where it has a finite one: temperature 1, top_p 1, and max_tokens 16
for /v1/completions. Chat completions have no finite OpenAI default, so an omitted
max_tokens there means the engine's `max_new_tokens` setting (the page's slider).

vLLM's extensions that load generators use to fix output lengths are accepted: `ignore_eos`
(keep generating past end-of-sequence) and `min_tokens` (neither end-of-sequence nor a stop
string ends the output before this many tokens). `usage.prompt_tokens_details.cached_tokens`
reports the prompt tokens found in the prefix cache, as OpenAI's API does. A request may set
its own speculative decoding with `speculative_config` (vLLM's field names, which vLLM takes
per engine only): `{"method": "off" | "ngram" | "suffix", "num_speculative_tokens": 1-8}`.

Log-probabilities, as vLLM serves them: chat `logprobs: true` with `top_logprobs` 0-20, and
completions' legacy `logprobs: N` (0-20; `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`),
streamed or not. They are the model's own (`raw_logprobs`, vLLM's default `logprobs_mode`): the
log-softmax of the logits, before temperature and top-p, whatever the request samples with; the
token's probability as it was drawn (after them) is the page's (`token.p`). Each token's `token`
is the token decoded alone (as vLLM's are: part of a character decodes to "\ufffd"), `bytes` its
UTF-8. Every generated token has its entry, the one that completes a stop string too; a streamed
token whose text is held back (part of a character, or of a possible stop string) has its entry in
the next chunk that carries text (or the last). `echo` and prompt log-probabilities are refused.

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
import math
import time

from engine.events import MAX_TOP, Rejected, Token
from engine.core.request import GenerateRequest
from engine.settings import SettingError, coerce
from . import delivery
from .errors import ApiError

MAX_BODY_BYTES = 1 << 20
COMPLETIONS_DEFAULT_MAX_TOKENS = 16   # OpenAI's documented default for /v1/completions
REQUEST_TIMEOUT_S = 600.0   # default deadline of one API request (--request-timeout)
PROBE_S = 0.5   # how often a waiting request looks for its deadline and its client; a stream
                # silent this long gets an SSE comment (a write that fails when the client left)
ROLES = ("system", "developer", "user", "assistant")
# Parameters that would change the output in ways this engine does not implement: refused
# unless given their neutral value, rather than silently ignored.
UNSUPPORTED = ("logit_bias", "presence_penalty", "frequency_penalty", "tools", "functions", "response_format",
               "echo", "prompt_logprobs", "best_of", "suffix")
MIN_LOGPROB = -9999.0   # what a probability of 0 is sent as (vLLM's floor), JSON having no -Infinity
NEUTRAL = (None, False, 0, [], {}, {"type": "text"})


@dataclass
class ApiRequest:
    kind: str              # "chat" or "completion"
    request: GenerateRequest   # what the engine is asked (it always streams to us)
    stream: bool           # whether the client asked for server-sent events
    include_usage: bool
    names: dict            # engine field -> the OpenAI parameter it came from
    logprobs: int | None = None   # candidates asked with each token's log-probability; None: no logprobs


def parse_request(kind, body, model_name):
    """Validate an OpenAI chat/completions body; return an ApiRequest or raise ApiError."""
    check_model(body, model_name)
    for name in UNSUPPORTED:
        if body.get(name) not in NEUTRAL:
            raise ApiError(400, f"`{name}` is not supported by this server", name, "unsupported_parameter")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, "only n=1 is supported", "n")
    stream = body.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be true or false", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(400, "`stream_options` is only allowed when `stream` is true", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise ApiError(400, "`stream_options` must be an object with a boolean `include_usage`",
                           "stream_options")
        include_usage = options.get("include_usage", False)

    logprobs = _logprobs(kind, body)
    max_name = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_name = "max_completion_tokens"   # OpenAI's newer name wins when both are given
    max_tokens = body.get(max_name)
    if max_tokens is None and kind == "completion":
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    fields = dict(source="api", stream=True, max_new_tokens=max_tokens, stop=_stop(body.get("stop")),
                  temperature=_or(body.get("temperature"), 1.0), top_p=_or(body.get("top_p"), 1.0),
                  seed=body.get("seed"), ignore_eos=_or(body.get("ignore_eos"), False),
                  min_tokens=_or(body.get("min_tokens"), 0), speculative_config=body.get("speculative_config"),
                  logprobs=logprobs, priority=_or(body.get("priority"), 0))
    if kind == "chat":
        fields["messages"] = messages_of(body.get("messages"))
    else:
        fields["prompt"] = _prompt(body.get("prompt"))
    names = {"max_new_tokens": max_name, "prompt": "messages" if kind == "chat" else "prompt",
             "logprobs": "top_logprobs" if kind == "chat" else "logprobs"}
    with _openai_names(names):
        request = GenerateRequest(**fields)
    return ApiRequest(kind, request, stream, include_usage, names, logprobs)


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


def _or(value, default):
    return default if value is None else value


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


def _prompt(value):
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ApiError(400, "`prompt` must be a string (or a list of one string; token arrays and "
                            "batches are not supported)", "prompt")
    return value


def submit(backend, req):
    """Queue the request; a SettingError from the engine becomes a 400 naming the OpenAI parameter."""
    with _openai_names(req.names):
        return backend.submit(req.request)


class ClientGone(Exception):
    """The client closed its connection: nobody is left to answer."""


def outputs(backend, handle, timeout_s, gone):
    """The request's own events (`Token`s, then `Finished` or `Rejected`, from its RequestHandle),
    with a None whenever PROBE_S passes without one. Raises ApiError (504) once `timeout_s` has
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
            event = handle.next(timeout=min(PROBE_S, left))
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


def usage(event):
    p, c = event.prompt_tokens, event.output_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": event.cached_tokens or 0}}


def _logprob(p):
    return math.log(p) if p > 0 else MIN_LOGPROB


class Logprobs:
    """One request's log-probabilities, token by token (`add`), handed out in OpenAI's shapes
    (`take`: those added since the last take): chat's `{"content": [...]}` entries, or the legacy
    completions object, whose `text_offset` runs on over the whole output."""

    def __init__(self, kind, k):
        self.kind, self.k = kind, k
        self.pending, self.offset = [], 0

    def add(self, event):
        self.pending.append(event)

    def take(self):
        events, self.pending = self.pending, []
        if self.kind == "chat":
            return {"content": [self._entry(ev.own_text, ev.p_raw) | {"top_logprobs": [
                self._entry(text, raw) for _, text, _, raw in ev.top[:self.k]]} for ev in events]}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for ev in events:
            top = {text: _logprob(raw) for _, text, _, raw in ev.top[:self.k]}
            # OpenAI: the sampled token's is always there (keyed by text, its own wins a clash)
            top[ev.own_text] = _logprob(ev.p_raw)
            out["tokens"].append(ev.own_text)
            out["token_logprobs"].append(_logprob(ev.p_raw))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(ev.client())
        return out

    @staticmethod
    def _entry(text, p):
        return {"token": text, "logprob": _logprob(p), "bytes": list(text.encode("utf-8"))}


class Reply:
    """Shapes one request's text into OpenAI responses or stream chunks; with `logprobs` (the
    candidates asked for), each token's log-probabilities too (`token`, before its text)."""

    def __init__(self, kind, rid, model, logprobs=None):
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + rid
        self.created = int(time.time())
        self.model = model
        self.logprobs = None if logprobs is None else Logprobs(kind, logprobs)

    def token(self, event):
        """A token's text for the client (its log-probabilities kept for the next chunk)."""
        if self.logprobs is not None:
            self.logprobs.add(event)
        return event.client()

    def _odds(self):
        return None if self.logprobs is None else self.logprobs.take()

    def _envelope(self, obj, choices):
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def chunk(self, text=None, finish=None, role=False, usage_field=False):
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            out = self._envelope("chat.completion.chunk", [{"index": 0, "delta": delta,
                                                             "logprobs": None if role else self._odds(),
                                                             "finish_reason": finish}])
        else:
            out = self._envelope("text_completion", [{"index": 0, "text": text or "", "logprobs": self._odds(),
                                                       "finish_reason": finish}])
        if usage_field:
            out["usage"] = None   # OpenAI sends `usage: null` on every chunk but the last when asked
        return out

    def usage_chunk(self, counts):
        out = self._envelope("chat.completion.chunk" if self.kind == "chat" else "text_completion", [])
        out["usage"] = counts
        return out

    def full(self, text, finish, counts):
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": self._odds(), "finish_reason": finish}
            out = self._envelope("chat.completion", [choice])
        else:
            out = self._envelope("text_completion", [{"index": 0, "text": text, "logprobs": self._odds(),
                                                      "finish_reason": finish}])
        out["usage"] = counts
        return out


def sse(obj):
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def respond(backend, req, timeout_s=REQUEST_TIMEOUT_S, gone=lambda: False):
    """Run one non-streaming request to the end; return the response body (or raise ApiError,
    or ClientGone). `gone()` tells whether the client has closed its connection."""
    handle = submit(backend, req)
    items = outputs(backend, handle, timeout_s, gone)
    with contextlib.closing(items):
        first = first_output(items, req.names["prompt"])
        reply = Reply(req.kind, handle.id, backend.api_model, req.logprobs)
        text = []
        for event in itertools.chain([first], items):
            if event is None:
                continue
            if isinstance(event, Token):
                text.append(reply.token(event))
            else:
                return reply.full("".join(text), finish_reason(event), usage(event))


def start_stream(backend, req, timeout_s=REQUEST_TIMEOUT_S, gone=lambda: False):
    """Submit and wait for the first output (errors are still HTTP statuses up to here); return
    the generator of SSE text. Closing it early (the client left) cancels the request."""
    handle = submit(backend, req)
    items = outputs(backend, handle, timeout_s, gone)
    try:
        first = first_output(items, req.names["prompt"])
    except BaseException:
        items.close()
        raise
    return _stream(items, first, Reply(req.kind, handle.id, backend.api_model, req.logprobs),
                   req.include_usage)


def _stream(items, first, reply, include_usage):
    with contextlib.closing(items):   # closing it cancels the request unless it ended
        if reply.kind == "chat":
            yield sse(reply.chunk(role=True, usage_field=include_usage))
        try:
            yield from _stream_body(itertools.chain([first], items), reply, include_usage)
        except ApiError as e:   # the deadline passed mid-stream: the status is sent, so say it here
            yield sse(e.body())
        except ClientGone:
            return
        yield SSE_DONE


def _stream_body(items, reply, include_usage):
    for event in items:
        if event is None:
            yield ": waiting\n\n"
            continue
        if isinstance(event, Token):
            text = reply.token(event)
            if text:
                yield sse(reply.chunk(text, usage_field=include_usage))
            continue
        try:
            finish = finish_reason(event)
        except ApiError as e:
            yield sse(e.body())
            return
        yield sse(reply.chunk(finish=finish, usage_field=include_usage))
        if include_usage:
            yield sse(reply.usage_chunk(usage(event)))
        return


def models_list(model, created, max_context):
    return {"object": "list", "data": [{"id": model, "object": "model", "created": int(created),
                                        "owned_by": "first-token", "max_model_len": max_context}]}
