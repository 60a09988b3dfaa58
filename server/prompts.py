"""/v1/completions' prompts as vLLM takes them, and the prompt's part of each choice.

A prompt is a string, a list of strings, a list of token ids, or a list of token-id lists
(lm-evaluation-harness sends token ids by default, and lists of them with `--batch_size`): each
prompt is one request to the engine and one choice, `index` in the order given. Token ids are
taken as they are (engine/core/intake.py checks them against the vocabulary).

With `echo` a choice's text begins with its prompt (a string as sent, token ids decoded), and
with `logprobs: N` its prompt tokens come first in the legacy logprobs object, the first with
`None` (nothing comes before it), as OpenAI's and vLLM's. vLLM's `prompt_logprobs: N` adds the
choice's `prompt_logprobs`: `[None, {token_id: {logprob, rank, decoded_token}}, ...]`, the prompt
token's own entry and its N most likely candidates. Both are computed in the prefill
(engine/model/runner.py); such a request does not read the prefix cache. `max_tokens: 0` with
echo asks for the prompt alone: as vLLM does, the engine generates one token, which is not
shown (nor counted in `usage.completion_tokens`).
"""
import math

from .errors import ApiError

MAX_PROMPTS = 64   # prompts in one request (each a request to the engine, queued at once)
MIN_LOGPROB = -9999.0   # what a probability of 0 is sent as (vLLM's floor), JSON having no -Infinity


def prompts_of(value):
    """The prompts of a completions body, each a string or a list of token ids, or ApiError
    naming `prompt`."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(_is_id(t) for t in value):
            return [value]
        if all(isinstance(p, str) for p in value) or \
                all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in value):
            if len(value) > MAX_PROMPTS:
                raise ApiError(400, f"`prompt` holds {len(value)} prompts; at most {MAX_PROMPTS} per request",
                               "prompt")
            return value
    raise ApiError(400, "`prompt` must be a string, a list of strings, a list of token ids or a list of "
                        "non-empty token-id lists", "prompt")


def _is_id(t):
    return isinstance(t, int) and not isinstance(t, bool)


def request_fields(prompt):
    """The GenerateRequest field that carries one prompt."""
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_ids": prompt}


def echo_text(prompt, decode):
    """The text an echoed choice begins with: a string prompt as sent, token ids decoded."""
    return prompt if isinstance(prompt, str) else decode(prompt)


def vllm_prompt_logprobs(entries, k):
    """vLLM's `prompt_logprobs` of one choice from the engine's prompt entries (Token.prompt):
    None for the first token, then the token's own entry and its `k` most likely candidates,
    keyed by token id (a string, JSON's keys being strings)."""
    out = [None]
    for e in entries[1:]:
        odds = {str(tid): _vllm_entry(raw, rank, text) for rank, (tid, text, _, raw) in enumerate(e["top"][:k], 1)}
        odds[str(e["token_id"])] = _vllm_entry(e["p_raw"], e["rank"], e["own_text"])
        out.append(odds)
    return out


def _vllm_entry(p, rank, text):
    return {"logprob": logprob(p), "rank": rank, "decoded_token": text}


def logprob(p):
    """A probability as the API sends its log (a generated token's or a prompt token's)."""
    return math.log(p) if p > 0 else MIN_LOGPROB
