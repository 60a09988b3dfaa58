"""The one JSON loader for everything a client sends: OpenAI API bodies (server/api.py),
classroom /join bodies (server/classroom.py) and websocket control messages
(server/control.py). Whatever arrives, it returns plain data or raises `ApiError` (400):

* nesting deeper than MAX_DEPTH is refused before parsing (`nested_too_deeply`), so
  Python's recursive decoder never meets `[[[[...` (a RecursionError, caught too, is the
  same answer);
* every string in it, keys included, must be Unicode text: no lone surrogate (JSON's
  "\\ud800" decodes to one; the tokenizer raises TypeError on it) (`invalid_text`, `param`
  naming the field as `messages[0].content`). Text bound for the tokenizer is also refused
  with a NUL by the engine (`engine.settings.check_text`: 400 naming the field); a name has
  its control characters removed instead (server/classroom.py).

Each caller turns the ApiError into its own shape: an HTTP error, or the websocket's `error`
event."""
from itertools import accumulate
import json
import re

from engine.settings import surrogate_problem
from .errors import ApiError
from .openai_api import MAX_BODY_BYTES

MAX_DEPTH = 32
_ESCAPE = re.compile(r"\\.", re.S)        # a backslash and the character it escapes
_STRING = re.compile(r'"[^"]*"')          # a string, once escapes are gone
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def too_deep(text, limit=MAX_DEPTH):
    """Whether JSON `text` nests arrays/objects deeper than `limit`, found without parsing and
    in linear time: escapes, then strings (an unterminated one runs to the end) are dropped,
    and the brackets left are counted."""
    if text.count("[") + text.count("{") <= limit:
        return False
    bare = _STRING.sub("", _ESCAPE.sub("", text)).split('"', 1)[0]
    brackets = _NOT_BRACKET.sub("", bare)
    return max(accumulate(map(_DELTA.__getitem__, brackets)), default=0) > limit


def loads(raw):
    """JSON `raw` (str, or bytes in any encoding JSON allows) as data, or ApiError (400)."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise ApiError(400, f"not valid JSON: {e}", code="invalid_json") from None
    if too_deep(text):
        raise ApiError(400, f"JSON nested deeper than {MAX_DEPTH} levels", code="nested_too_deeply")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ApiError(400, f"JSON nested deeper than {MAX_DEPTH} levels", code="nested_too_deeply") from None
    except ValueError as e:
        raise ApiError(400, f"not valid JSON: {e}", code="invalid_json") from None
    check_texts(value)
    return value


def check_texts(value, path=""):
    """ApiError (400 `invalid_text`, `param` the field's path) for the first string in `value`
    that is not Unicode text. `value` nests at most MAX_DEPTH deep (`loads` checked)."""
    if isinstance(value, str):
        problem = surrogate_problem(value)
        if problem:
            raise ApiError(400, f"`{path or 'value'}` {problem}", path or None, "invalid_text")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_texts(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            problem = surrogate_problem(key)
            if problem:
                raise ApiError(400, f"a key in `{path or 'the object'}` {problem}", path or None, "invalid_text")
            check_texts(item, where)


def read_object(stream, limit=MAX_BODY_BYTES):
    """An HTTP request's body (read up to `limit` + 1 bytes from `stream`) as a JSON object, or
    ApiError: 413 too large, 400 as `loads`, 400 when it is not an object."""
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise ApiError(413, f"request body larger than {limit} bytes", code="request_too_large")
    body = loads(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body
