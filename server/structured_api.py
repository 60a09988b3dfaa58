"""Structured output as the OpenAI and vLLM bodies ask for it, as one `structured_outputs` value (vLLM's
StructuredOutputsParams shape, the request registry's field, engine/core/fields.py; compiled by
engine/model/structured.py), and the body parameter it came from (whose name a 400 carries).

- OpenAI's `response_format`: `{"type": "text"}` (none), `{"type": "json_object"}` (any JSON
  object), `{"type": "json_schema", "json_schema": {"schema": {...}, ...}}`; vLLM's
  `{"type": "structural_tag"}` is refused.
- vLLM's `structured_outputs`: `{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`.
- vLLM's older names, which its current API dropped for `structured_outputs`: `guided_json`,
  `guided_regex`, `guided_choice`, `guided_grammar` (`guided_decoding_backend` is accepted and
  ignored: there is one backend here, llguidance).

At most one of them per request: two are a 400 naming the second.
"""
from .errors import ApiError

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def constraint_of(body):
    """(the structured_outputs value, the parameter it came from), or (None, None) when none is asked."""
    found = []
    fmt = body.get("response_format")
    if fmt is not None:
        value = _response_format(fmt)
        if value is not None:
            found.append((value, "response_format"))
    if body.get("structured_outputs") is not None:
        found.append((body["structured_outputs"], "structured_outputs"))
    for name, kind in GUIDED.items():
        if body.get(name) is not None:
            found.append(({kind: body[name]}, name))
    if len(found) > 1:
        raise ApiError(400, f"`{found[1][1]}` and `{found[0][1]}` both constrain the output: give one",
                       found[1][1])
    return found[0] if found else (None, None)


def _response_format(fmt):
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(400, "`response_format.json_schema` must be an object with a `schema` (a JSON schema object)",
                           "response_format")
        return {"json": spec["schema"]}
    raise ApiError(400, '`response_format` must be {"type": "text" | "json_object" | "json_schema"}', "response_format",
                   "unsupported_parameter" if kind == "structural_tag" else None)
