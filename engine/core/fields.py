"""The fields a request may set to shape its sampling, its end and its place in the queue,
declared once (`FIELDS`): each one's name, kind, bounds, value when left out, the name the
OpenAI/vLLM body gives it, and who reads it.

Everything else is made from this list: `GenerateRequest`'s fields and their checks
(engine/core/request.py), `SamplingParams`' typed fields (engine/core/sequence.py), the API's
mapping from body to request (server/openai_api.py `parse_request`), the websocket's `submit`
(server/control.py), a preset's question (engine/teach/presets.py) and what observe mode sends
another server (observe/backend.py). A new field is a line here and the code that acts on it
(the sampler for a sampling field).

A field marked `setting` takes the engine's live setting of the same name when left out (the
page's sliders, engine/settings.py SamplingSettings); the others take their `default`, which
changes nothing. Bounds that depend on the engine (the model's context, its vocabulary) are
checked where the request meets it (`GenerateRequest.sampling`).
"""
from dataclasses import dataclass, field, make_dataclass

from ..model import structured
from ..settings import SettingError, coerce, finite_number, shown

MAX_SAMPLES = 64      # `n`: a request's samples, each queued as its own (with MAX_PROMPTS prompts, the
                      # API keeps n x prompts within the queue's room, server/openai_api.py)
MAX_TOKEN_IDS = 300   # entries of `logit_bias` / `stop_token_ids` (OpenAI's limit on logit_bias)
MAX_BIAS = 100.0      # OpenAI's range of a logit bias: -100 bans a token, 100 all but forces it


@dataclass(frozen=True)
class Field:
    name: str            # GenerateRequest's and SamplingParams' name
    kind: str            # "int", "float", "bool", "token_ids" (a list of ids), "token_bias" ({id: bias}) or
                         # "structured" (vLLM's structured_outputs object, checked by engine/model/structured.py)
    default: object      # its value when left out (a `setting` field: when no engine setting applies)
    lo: float | None = None
    hi: float | None = None
    api: str = ""            # the OpenAI/vLLM body's name ("": `name`)
    role: str = "sampling"   # who reads it: "sampling" (the sampler), "stopping" (Sequence.stop_reason),
                             # "scheduling" (the scheduler, the queue) or "fanout" (GenerateRequest.samples)
    setting: bool = False    # left out: the engine's live setting of the same name
    above: bool = False      # `lo` itself is refused (top_p > 0)
    api_default: object = None   # the API's value when left out, where OpenAI's differs from the engine's
    doc: str = ""

    @property
    def body_name(self):
        return self.api or self.name

    def check(self, value):
        """`value` normalised (5.0 -> 5, a bias's "50256" -> 50256, a list -> a tuple), or
        SettingError naming this field. None is left out only where that is the field's default
        (or a setting's); a client leaves the others out by not sending them."""
        if value is None and (self.setting or self.default is None):
            return None
        if self.kind == "token_ids":
            return self._ids(value)
        if self.kind == "token_bias":
            return self._bias(value)
        if self.kind == "structured":
            return structured.check(value, self.name)
        value = coerce(self.name, self.kind, value, self.lo, self.hi)
        if self.above and value <= self.lo:
            raise SettingError(self.name, f"must be greater than {self.lo:g}")
        return value

    def _ids(self, value):
        if not isinstance(value, (list, tuple)) or len(value) > MAX_TOKEN_IDS:
            raise SettingError(self.name, f"must be a list of up to {MAX_TOKEN_IDS} token ids")
        return tuple(self._id(v) for v in value)

    def _id(self, value):
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 12:
            value = int(value)   # JSON object keys are strings: OpenAI's logit_bias {"50256": -100}
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SettingError(self.name, f"token ids are whole numbers from 0, got {shown(value)}")
        return value

    def _bias(self, value):
        if not isinstance(value, dict) or len(value) > MAX_TOKEN_IDS:
            raise SettingError(self.name, f"must be an object of up to {MAX_TOKEN_IDS} {{token id: bias}}")
        out = {}
        for key, bias in value.items():
            if not finite_number(bias) or abs(bias) > MAX_BIAS:
                raise SettingError(self.name, f"token {shown(key, 20)}: a bias must be a number from "
                                              f"{-MAX_BIAS:g} to {MAX_BIAS:g}, got {shown(bias)}")
            out[self._id(key)] = float(bias)
        return out or None

    def check_ids(self, value, vocab):
        """SettingError unless every token id of `value` (this field's, checked) is below `vocab`."""
        ids = value if self.kind == "token_ids" else (value or {})
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise SettingError(self.name, f"token id {shown(bad[0])} is not in this model's vocabulary (0-{vocab - 1})")


FIELDS = (
    Field("max_new_tokens", "int", 64, 1, api="max_tokens", role="scheduling", setting=True,
          doc="tokens to generate at most"),
    Field("temperature", "float", 0.0, 0.0, 2.0, setting=True, api_default=1.0, doc="0: greedy"),
    Field("top_p", "float", 1.0, 0.0, 1.0, setting=True, above=True, api_default=1.0,
          doc="nucleus: the smallest set of most likely tokens holding this mass"),
    Field("min_p", "float", 0.0, 0.0, 1.0,
          doc="tokens under this times the most likely one's probability are dropped (vLLM's)"),
    Field("seed", "int", None, 0, 2**63 - 1, doc="repeatable sampling: its draws its own"),
    Field("logit_bias", "token_bias", None,
          doc="{token id: -100..100} added to the logits before anything else (-100: never chosen)"),
    Field("presence_penalty", "float", 0.0, -2.0, 2.0,
          doc="subtracted from a token's logit once it is in the output (OpenAI's)"),
    Field("frequency_penalty", "float", 0.0, -2.0, 2.0,
          doc="subtracted from a token's logit for each time it is in the output (OpenAI's)"),
    Field("repetition_penalty", "float", 1.0, 0.0, 10.0, above=True,
          doc="a token of the prompt or the output: a positive logit divided by it, a negative one "
              "multiplied (vLLM's, Hugging Face's)"),
    Field("ignore_eos", "bool", False, role="stopping", doc="end-of-sequence ends nothing (load tools)"),
    Field("min_tokens", "int", 0, 0, role="stopping",
          doc="neither end-of-sequence, a stop token nor a stop string ends the output before this many tokens"),
    Field("stop_token_ids", "token_ids", (), role="stopping",
          doc="tokens that end the output (finish reason stop; the token's text left out, as vLLM's)"),
    Field("n", "int", 1, 1, MAX_SAMPLES, role="fanout",
          doc="independent samples of the prompt, each its own request (vLLM's parallel sampling; seeded: seed + i)"),
    Field("structured_outputs", "structured", None,
          doc="the output follows a JSON schema, a regex, a choice or a Lark grammar (vLLM's; a token mask per step)"),
    Field("priority", "int", 0, -2**31, 2**31 - 1, role="scheduling",
          doc="its place under the `priority` queue policy: lower first, ties by arrival (vLLM's)"),
)
BY_NAME = {f.name: f for f in FIELDS}
SETTING_FIELDS = tuple(f.name for f in FIELDS if f.setting)
TYPES = {"int": int, "float": float, "bool": bool, "token_ids": tuple, "token_bias": dict, "structured": dict}


def dataclass_of(name, frozen, settings_left_out):
    """A dataclass of every field (a base class), each typed by its kind, its default its
    `default`, or None for a `setting` field when `settings_left_out` (a request: the engine
    fills it in). Its fields are keyword-only, so a subclass's own come first positionally."""
    specs = [(f.name, TYPES[f.kind] | None,
              field(default=None if settings_left_out and f.setting else f.default)) for f in FIELDS]
    cls = make_dataclass(name, specs, frozen=frozen, kw_only=True)
    cls.__module__ = __name__
    return cls


Requested = dataclass_of("Requested", frozen=True, settings_left_out=True)   # GenerateRequest's
Resolved = dataclass_of("Resolved", frozen=False, settings_left_out=False)   # SamplingParams'
