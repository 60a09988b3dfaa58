"""The request registry's sampling and stopping fields through the OpenAI API (the official
`openai` client against the in-process app on the tiny random model): logit_bias, the
penalties, min_p, stop_token_ids, and every bad value refused with a 400 naming its field,
nothing left behind."""
from simple_websocket import Client

from helpers import frames, idle, reference
from test_openai_api import client, model  # noqa: F401  (fixtures: the openai client on the in-process app, its model)

PROMPT = "We hold these truths to be self-evident, that all men"


def token_ids(live, ask):
    """(the response of `ask()`, the token ids its request was given, from the page's events)."""
    ws = Client.connect(live.ws_url)
    try:
        r = ask()
        rid = r.id.split("-", 1)[1]
        events = frames(ws, 60, until=lambda evs: any(e["type"] == "finished" and e.get("id") == rid for e in evs))
    finally:
        ws.close()
    return r, [e["token_id"] for e in events if e["type"] == "token" and e.get("id") == rid]


def test_logit_bias_minus_100_is_never_chosen(live, client, model, tiny):
    greedy = reference(tiny, PROMPT, 8)
    banned = set(greedy)
    r, ids = token_ids(live, lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, temperature=1.5, seed=3, logprobs=5,
        logit_bias={str(t): -100 for t in banned}, extra_body={"ignore_eos": True}))
    assert len(ids) == r.usage.completion_tokens == 24 and not banned & set(ids)
    # greedy, its first token banned: another is taken, and the log-probabilities are the model's
    # own (vLLM's raw_logprobs): the banned token still heads the first position's candidates
    first = tiny.tokenizer.decode([greedy[0]])
    r, ids = token_ids(live, lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=5, logit_bias={str(greedy[0]): -100}))
    top = r.choices[0].logprobs.top_logprobs[0]
    assert ids[0] != greedy[0] and max(top, key=top.get) == first
    assert idle(live.driver)


def test_stop_token_ids_end_the_request_with_finish_reason_stop(live, client, model, tiny):
    greedy = reference(tiny, PROMPT, 8)
    k = greedy.index(greedy[3])          # the first place that token comes
    r, ids = token_ids(live, lambda: client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [greedy[3]]}))
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and ids == greedy[:k + 1] and r.usage.completion_tokens == k + 1
    assert choice.text == tiny.tokenizer.decode(greedy[:k])   # the stop token's text left out (vLLM's)
    # min_tokens past it: the token no longer ends it there
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"stop_token_ids": [greedy[3]], "min_tokens": k + 2, "ignore_eos": True})
    assert r.usage.completion_tokens > k + 1
    assert idle(live.driver)


def test_penalties_and_min_p_are_taken_through_the_openai_client(client, model, tiny):
    """The client's own parameters reach the sampler: a strong presence penalty at temperature 0
    changes the greedy text of a prompt whose continuation repeats; min_p 1 leaves only the
    most likely token, whatever the temperature."""
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    rewarded = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                         presence_penalty=-2.0, frequency_penalty=-1.0)
    assert rewarded.choices[0].text != plain.choices[0].text
    hot = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=2.0, seed=1,
                                    extra_body={"min_p": 1.0})
    assert hot.choices[0].text == plain.choices[0].text


def test_bad_values_are_refused_naming_the_field_and_leave_nothing_behind(live, model):
    http = live.app.test_client()
    cases = [  # (body changes, the field named)
        ({"logit_bias": {"400": 5}}, "logit_bias"),           # not in the vocabulary (400 tokens)
        ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"five": 1}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"), ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": "high"}, "presence_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_p": -0.1}, "min_p"), ({"stop_token_ids": [5, 400]}, "stop_token_ids"),
        ({"stop_token_ids": 5}, "stop_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ]
    for url, shape in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        for change, field in cases:
            for stream in (False, True):
                r = http.post(url, json={"model": model, **shape, "max_tokens": 4, "stream": stream, **change})
                assert r.status_code == 400, (change, r.text)
                err = r.get_json()["error"]
                assert err["param"] == field and field in err["message"], (change, err)
    assert idle(live.driver)
