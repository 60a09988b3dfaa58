"""vLLM's tokenizer endpoints, transport-free: JSON bodies in, vLLM's response shapes out (the
routes are server/api.py's). Evaluation tools count and cut prompts with them: lm-evaluation-
harness's remote tokenizer reads `/tokenizer_info` (it needs `eos_token`), encodes with
`/tokenize` (`add_special_tokens: false`) and decodes with `/detokenize`.

    POST /tokenize    {"prompt": str, "add_special_tokens": true, "return_token_strs": false}
                      or {"messages": [...], "add_generation_prompt": true, "add_special_tokens": false}
                      -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize  {"tokens": [int]} -> {"prompt": str}
    GET /tokenizer_info -> {"tokenizer_class", "eos_token", "bos_token", "pad_token", "unk_token",
                            "model_max_length", "chat_template"}

`model`, when given, must name the served model (as on /v1). The tokenizer is the engine's own
(the one intake tokenizes requests with), so counts agree with `usage.prompt_tokens`.
"""
from engine.core.request import MAX_PROMPT_CHARS
from engine.settings import text_problem

from .errors import ApiError
from .openai_api import check_model, messages_of


def _bool(body, name, default):
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"`{name}` must be true or false", name)
    return value


def tokenize(tokenizer, body, model_name, max_context):
    """vLLM's TokenizeCompletionRequest (`prompt`) or TokenizeChatRequest (`messages`, through
    the chat template) -> TokenizeResponse."""
    check_model(body, model_name, required=False)
    if "messages" in body:
        messages = messages_of(body.get("messages"))
        if not tokenizer.chat_template:
            raise ApiError(400, "this model has no chat template: send a `prompt`", "messages")
        generation = _bool(body, "add_generation_prompt", True)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        special = _bool(body, "add_special_tokens", False)   # the template writes them
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise ApiError(400, "`prompt` must be a string (or give `messages`)", "prompt")
        special = _bool(body, "add_special_tokens", True)
    if len(text) > MAX_PROMPT_CHARS:
        raise ApiError(400, f"`prompt` is longer than {MAX_PROMPT_CHARS} characters", "prompt")
    _check_text("prompt", text)
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    strs = tokenizer.convert_ids_to_tokens(ids) if _bool(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": max_context, "tokens": ids, "token_strs": strs}


def detokenize(tokenizer, body, model_name):
    """vLLM's DetokenizeRequest (`tokens`) -> DetokenizeResponse (`prompt`)."""
    check_model(body, model_name, required=False)
    ids = token_ids("tokens", body.get("tokens"), len(tokenizer), allow_empty=True)
    return {"prompt": tokenizer.decode(ids)}


def token_ids(name, value, vocab, allow_empty=False):
    """`value` as a list of token ids of this vocabulary, or ApiError (400) naming `name`."""
    if not isinstance(value, list) or (not value and not allow_empty):
        raise ApiError(400, f"`{name}` must be a{'' if allow_empty else ' non-empty'} list of token ids", name)
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise ApiError(400, f"`{name}[{i}]` is not a token id of this model's vocabulary "
                                f"(0 to {vocab - 1}): {str(t)[:40]}", name)
    return value


def tokenizer_info(tokenizer, max_context):
    """What vLLM's /tokenizer_info says of the tokenizer (its class, special tokens, context and
    chat template): enough for a client to count and template prompts as this server does."""
    return {"tokenizer_class": type(tokenizer).__name__, "eos_token": tokenizer.eos_token,
            "bos_token": tokenizer.bos_token, "pad_token": tokenizer.pad_token, "unk_token": tokenizer.unk_token,
            "model_max_length": max_context, "chat_template": tokenizer.chat_template}


def _check_text(name, text):
    problem = text_problem(text)   # what the tokenizer cannot take (a NUL)
    if problem:
        raise ApiError(400, f"`{name}` {problem}", name)
