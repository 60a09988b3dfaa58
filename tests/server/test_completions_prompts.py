"""/v1/completions as vLLM serves it to evaluation and load tools (server/prompts.py), driven by
the official `openai` client against the tiny model's app: echo and the prompt's log-probabilities
(equal to transformers' teacher-forced ones), max_tokens 0 with echo, vLLM's prompt_logprobs,
prompts as token ids and as lists (one choice each, in order, usage summed), streamed or not."""
import openai
import pytest
import torch

from test_openai_api import clean, error_of, greedy
from test_openai_api import client, model  # noqa: F401  (fixtures: the openai client on the in-process app, its model)

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom"


def teacher_forced(bundle, ids):
    """transformers' log-probability of each token of `ids` given those before it (from the second)."""
    with torch.no_grad():
        logits = bundle.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_echo_with_logprobs_gives_the_prompts_teacher_forced_logprobs(live, client, model, tiny):
    """lm-evaluation-harness's log-likelihood request (echo, logprobs 1, max_tokens 1, greedy):
    the text begins with the prompt, the prompt's tokens come first in `logprobs` (the first
    None), each within 1e-4 of transformers' teacher-forced log-probability; then the one
    generated token, the model's greedy one."""
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    n_prompt, out_ids, _ = greedy(tiny, TEXT, 1)
    r = client.completions.create(model=model, prompt=TEXT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice = r.choices[0]
    assert choice.text.startswith(TEXT) and choice.logprobs.tokens[-1] == tiny.tokenizer.decode(out_ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.tokens[:len(ids)] == [tiny.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(teacher_forced(tiny, ids), abs=1e-4)
    assert all(lp.tokens[i] in lp.top_logprobs[i] for i in range(1, len(ids) + 1))
    assert lp.text_offset[:3] == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]
    assert lp.text_offset[len(ids)] == len(TEXT)   # the generated token starts where the prompt ends
    assert r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 1
    # the same as token ids, as lm-eval sends by default
    t = client.completions.create(model=model, prompt=ids, echo=True, logprobs=1, max_tokens=1, temperature=0)
    assert t.choices[0].logprobs.token_logprobs == lp.token_logprobs and t.choices[0].text == choice.text
    assert clean(live)


def test_echo_without_generation_and_vllms_prompt_logprobs(live, client, model, tiny):
    """max_tokens 0 with echo: the prompt alone, no completion token; vLLM's `prompt_logprobs: 2`:
    per prompt token (the first None) its own entry with its rank and its two likeliest."""
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ref = teacher_forced(tiny, ids)
    r = client.completions.create(model=model, prompt=TEXT, echo=True, logprobs=0, max_tokens=0,
                                  extra_body={"prompt_logprobs": 2})
    choice = r.choices[0]
    assert choice.text == TEXT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(ref, abs=1e-4) and len(choice.logprobs.tokens) == len(ids)
    assert choice.logprobs.top_logprobs[1] == {choice.logprobs.tokens[1]: choice.logprobs.token_logprobs[1]}   # logprobs 0
    plp = choice.model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for j in range(1, len(ids)):
        own = plp[j][str(ids[j])]
        assert own["logprob"] == pytest.approx(ref[j - 1], abs=1e-4) and own["rank"] >= 1
        assert own["decoded_token"] == tiny.tokenizer.decode([ids[j]])
        ranks = sorted(e["rank"] for k, e in plp[j].items() if k != str(ids[j]))
        assert ranks == [1, 2] or (own["rank"] <= 2 and len(plp[j]) == 2)
    plain = client.completions.create(model=model, prompt=TEXT, max_tokens=1, extra_body={"prompt_logprobs": 0})
    assert plain.choices[0].text != TEXT and len(plain.choices[0].model_extra["prompt_logprobs"]) == len(ids)
    assert clean(live)


def test_echo_of_several_prompts_begins_each_choice_with_its_own(live, client, model, tiny):
    prompts = ["We hold these truths", "Four score and seven years ago"]
    ids = tiny.tokenizer(prompts[1], add_special_tokens=False)["input_ids"]
    r = client.completions.create(model=model, prompt=prompts, echo=True, max_tokens=0)
    assert [c.text for c in r.choices] == prompts and r.usage.completion_tokens == 0
    t = client.completions.create(model=model, prompt=[ids, ids[:3]], echo=True, max_tokens=0)
    assert [c.text for c in t.choices] == [tiny.tokenizer.decode(ids), tiny.tokenizer.decode(ids[:3])]
    assert clean(live)


def test_token_and_batched_prompts_give_one_choice_each_in_order(live, client, model, tiny):
    """A list of strings, a list of token-id lists: one choice each, `index` in order, each the
    greedy text its prompt gets alone; usage summed (the prompts' tokens and generate's outputs);
    streamed, the same texts per index."""
    prompts = ["We hold these truths", "Four score and seven years ago", "It was the best of times"]
    want = [greedy(tiny, p, 6) for p in prompts]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0).choices[0].text
             for p in prompts]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == alone
    assert r.usage.prompt_tokens == sum(w[0] for w in want)
    assert r.usage.completion_tokens == sum(len(w[1]) for w in want)
    ids = [tiny.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    t = client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0)
    assert [c.text for c in t.choices] == alone
    chunks = list(client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = ["", "", ""]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
    assert texts == alone
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert clean(live)


def test_echo_streams_the_prompt_first(live, client, model, tiny):
    n_prompt = len(tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"])
    out_text = client.completions.create(model=model, prompt=TEXT, max_tokens=4, temperature=0).choices[0].text
    chunks = list(client.completions.create(model=model, prompt=TEXT, echo=True, logprobs=1, max_tokens=4,
                                            temperature=0, stream=True, extra_body={"prompt_logprobs": 1}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts[0].startswith(TEXT) and "".join(texts) == TEXT + out_text
    carried = [c.choices[0].model_extra.get("prompt_logprobs") for c in chunks if c.choices]
    assert len(carried[0]) == n_prompt and carried[0][0] is None and all(p is None for p in carried[1:])
    lps = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert lps[0] is None and len(lps) == n_prompt + 4
    assert clean(live)


def test_continuous_usage_stats_put_usage_on_every_chunk(live, client, model):
    chunks = list(client.completions.create(model=model, prompt=TEXT, max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    with_choices = [c for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    generated = [c.usage.completion_tokens for c in with_choices]
    assert generated == sorted(generated) and generated[-1] == 5
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)
    plain = list(client.completions.create(model=model, prompt=TEXT, max_tokens=2, stream=True,
                                           stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1])


def test_tools_are_ignored_only_with_tool_choice_none(live, client, model):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=model, messages=chat, max_tokens=2, tools=tools, tool_choice="none")
    assert r.choices[0].message.content is not None
    for choice in ("auto", "required", {"type": "function", "function": {"name": "weather"}}, None):
        kw = {} if choice is None else {"tool_choice": choice}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=chat, max_tokens=2, tools=tools, **kw)
        assert e.value.body["param"] == "tool_choice"
    assert clean(live)


def test_bad_prompt_forms_and_echo_values_are_refused_naming_the_field(live, model, tiny):
    http = live.app.test_client()
    comp, chat = "/v1/completions", "/v1/chat/completions"
    vocab = len(tiny.tokenizer)
    cases = [(comp, {"prompt": [[1, 2], "a"]}, "prompt"), (comp, {"prompt": [vocab]}, "prompt"),
             (comp, {"prompt": [[1, 2], [3, vocab + 5]]}, "prompt"), (comp, {"prompt": [[]]}, "prompt"),
             (comp, {"prompt": ["a"] * 65}, "prompt"), (comp, {"prompt": [1.5]}, "prompt"),
             (comp, {"prompt": "hi", "echo": "yes"}, "echo"), (comp, {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
             (comp, {"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
             (comp, {"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options"),
             (chat, {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
             (chat, {"messages": [{"role": "user", "content": "hi"}], "tools": "x", "tool_choice": "none"}, "tools")]
    for url, body, param in cases:
        r = http.post(url, json={"model": model, **body})
        assert r.status_code == 400, (body, r.text)
        assert error_of(r)["param"] == param, body
    # one good prompt beside a bad one: nothing of the good one is left queued or running
    r = http.post(comp, json={"model": model, "prompt": [[1, 2, 3], [vocab]], "max_tokens": 200})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt"
    assert clean(live)
