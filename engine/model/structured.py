"""Structured output: a request's constraint (vLLM's `structured_outputs`: a JSON schema, any JSON
object, a regular expression, a choice of strings, or a Lark grammar) as a token mask per step,
with llguidance (vLLM's "guidance" backend).

A constraint is checked when the request is built (`check`: an invalid schema or regex is a
SettingError then, nothing queued); the request carries it as it was given (observe mode sends it
on as it is). When the engine takes the request in (engine/core/intake.py) it becomes
llguidance's grammar text (`grammar_of`) and a `Matcher` against the model's tokenizer
(`Grammars`: the tokenizer converted once per model, on first use). Each step, the sampler's rows with a matcher get the tokens it rules out at -inf
before anything is drawn from their logits (`allowed`, one batched mask; a batch where no row is
constrained builds none), and each accepted token advances the matcher (`Matcher.accept`); once
the grammar is complete and nothing may follow, the request ends ("stop").
"""
import json

import numpy as np

from ..settings import SettingError

KINDS = ("json", "regex", "choice", "grammar", "json_object")   # vLLM's StructuredOutputsParams' constraints
MAX_CHOICES = 256
MAX_SPEC_CHARS = 100_000   # a schema, regex or grammar, as text


def _ll():
    import llguidance   # imported on first use: a server that constrains nothing never loads it
    import llguidance.hf   # noqa: F401 -- not loaded with it (llguidance.torch is not used: it loads
                           # torch._dynamo, measured 4.9 s here, for a mask this module unpacks itself)
    return llguidance


def check(value, field="structured_outputs"):
    """`value` as the request keeps it (the constraints given), or SettingError naming `field`
    when it is malformed or does not compile (`grammar_of`)."""
    grammar_of(value, field)
    return {k: v for k, v in value.items() if v is not None}


def grammar_of(value, field="structured_outputs"):
    """llguidance's grammar text for a constraint, vLLM's shape `{"json": schema}`, `{"regex": str}`,
    `{"choice": [str, ...]}`, `{"grammar": lark}` or `{"json_object": true}` (exactly one; with JSON,
    `disable_any_whitespace` too), or SettingError naming `field` when it is malformed or does
    not compile. vLLM's other options (`structural_tag`, `whitespace_pattern`, ...) are refused."""
    if not isinstance(value, dict):
        raise SettingError(field, f"must be an object with one of {', '.join(KINDS)}")
    given = {k: v for k, v in value.items() if v is not None and v is not False}
    unknown = sorted(set(given) - set(KINDS) - {"disable_any_whitespace"})
    kinds = [k for k in KINDS if k in given]
    if unknown or len(kinds) != 1:
        what = f"unsupported key {unknown[0]!r}" if unknown else f"{len(kinds)} constraints"
        raise SettingError(field, f"must give exactly one of {', '.join(KINDS)} ({what})")
    kind, spec = kinds[0], given[kinds[0]]
    if not isinstance(given.get("disable_any_whitespace", False), bool):
        raise SettingError(field, "disable_any_whitespace must be true or false")
    try:
        text = _grammar(kind, spec, given, field)
    except SettingError:
        raise
    except ValueError as e:   # llguidance's own refusal of a value it cannot take
        raise SettingError(field, f"{kind}: {e}") from None
    error = _ll().LLMatcher.validate_grammar(text)
    if error:
        raise SettingError(field, f"{kind} does not compile: {error.strip()[:300]}")
    return text


def _grammar(kind, spec, given, field):
    M = _ll().LLMatcher
    if kind == "json_object" and spec is not True:
        raise SettingError(field, "json_object must be true")
    if kind in ("regex", "grammar"):
        if not isinstance(spec, str) or not spec or len(spec) > MAX_SPEC_CHARS:
            raise SettingError(field, f"{kind} must be a non-empty string of up to {MAX_SPEC_CHARS} characters")
        text = M.grammar_from_regex(spec) if kind == "regex" else M.grammar_from_lark(spec)
    elif kind == "choice":
        if not isinstance(spec, list) or not spec or len(spec) > MAX_CHOICES or \
                not all(isinstance(c, str) and c for c in spec):
            raise SettingError(field, f"choice must be a list of 1-{MAX_CHOICES} non-empty strings")
        # each choice a Lark string literal (JSON's escapes are Lark's)
        text = M.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec))
    else:
        schema = {"type": "object"} if kind == "json_object" else _schema(spec, field)
        # JSON's whitespace anywhere it may be, unless the request says not (vLLM's guidance backend)
        text = M.grammar_from_json_schema(schema, defaults={"whitespace_flexible": not given.get("disable_any_whitespace")})
    return text


def _schema(spec, field):
    if isinstance(spec, str):   # vLLM takes a schema as JSON text too
        try:
            spec = json.loads(spec)
        except ValueError as e:
            raise SettingError(field, f"json is not valid JSON: {e}") from None
    if not isinstance(spec, dict) or len(json.dumps(spec)) > MAX_SPEC_CHARS:
        raise SettingError(field, f"json must be a JSON schema (an object) of up to {MAX_SPEC_CHARS} characters")
    return spec


class Grammars:
    """One model's matchers: its tokenizer as llguidance reads it, converted on first use (a pass
    over the vocabulary) and kept."""

    def __init__(self, tokenizer):
        self.tokenizer, self._ll_tokenizer = tokenizer, None

    def matcher(self, constraint, accepted=()):
        """A Matcher for a constraint (`check`ed) that has accepted the tokens `accepted` (a request
        taken over from another engine with its output so far), or SettingError."""
        grammar = grammar_of(constraint)
        if self._ll_tokenizer is None:
            try:
                self._ll_tokenizer = _ll().hf.from_tokenizer(self.tokenizer, len(self.tokenizer))
            except Exception as e:  # noqa: BLE001 -- a tokenizer llguidance cannot read: the request's 400
                raise SettingError("structured_outputs", f"this model's tokenizer cannot be constrained: {e}") from None
        matcher = Matcher(_ll().LLMatcher(self._ll_tokenizer, grammar))
        for token in accepted:
            matcher.accept(token)
        return matcher


class GrammarError(ValueError):
    """A request's matcher refused a token (its request fails alone: engine.py)."""


class Matcher:
    """Where one request is in its grammar."""

    def __init__(self, matcher):
        self.m = matcher
        if matcher.is_error():
            raise SettingError("structured_outputs", f"does not compile: {matcher.get_error()}")

    def accept(self, token_id):
        """Advance over an accepted token; whether the grammar is done (nothing may follow)."""
        if not self.m.consume_token(token_id):
            raise GrammarError(f"token {token_id} is not allowed here by its grammar ({self.m.get_error()})")
        return self.m.is_stopped()


def allowed(matchers, vocab, device):
    """[rows, vocab] booleans: the tokens each matcher allows next, from llguidance's bitmasks (bit
    i % 8 of byte i // 8 is token i), unpacked by numpy for all rows at once (measured on a
    49,152-token vocabulary: 0.06 ms, against 0.37 ms for torch's shifts); ids past the
    tokenizer's (a model's padding) are never allowed."""
    import torch   # here, not at the top: the request fields check constraints with this module,
                   # and observe mode and the web layer load no torch (tests/server/test_observe.py)
    packed = np.frombuffer(b"".join(m.m.compute_bitmask() for m in matchers), dtype=np.uint8)
    mask = torch.from_numpy(np.unpackbits(packed, bitorder="little").reshape(len(matchers), -1)).bool()
    if mask.shape[1] < vocab:
        mask = torch.nn.functional.pad(mask, (0, vocab - mask.shape[1]))
    return mask[:, :vocab].to(device)
