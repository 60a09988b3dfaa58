"""`n` samples of a prompt through the OpenAI API (the official `openai` client on the in-process
app, tiny random model): each sample its own engine request, choices indexed prompt * n + sample,
usage as vLLM counts it, streamed chunks interleaved by index, seeded samples distinct and
reproducible, greedy ones identical; bad values refused whole, nothing left behind."""
import requests
from simple_websocket import Client

from helpers import frames, idle, wait_idle
from test_openai_api import client, model  # noqa: F401  (fixtures: the openai client on the in-process app, its model)

PROMPT = "We hold these truths to be self-evident, that all men"


def test_n_seeded_samples_differ_and_repeat(live, client, model):
    ask = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7, n=3,
               extra_body={"ignore_eos": True})
    r = client.completions.create(**ask)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    assert len(set(texts)) == 3                                 # seed + i: three different draws
    assert [c.text for c in client.completions.create(**ask).choices] == texts   # and the same again
    # sample 1 of seed 7 is sample 0 of seed 8 (vLLM's seed + index)
    one = client.completions.create(**{**ask, "n": 1, "seed": 8})
    assert one.choices[0].text == texts[1]
    # usage: the prompt once, every sample's tokens
    assert r.usage.completion_tokens == 36 and r.usage.prompt_tokens == one.usage.prompt_tokens
    assert idle(live.driver)


def test_n_greedy_gives_n_identical_texts_and_prompt_major_indices(live, client, model):
    r = client.completions.create(model=model, prompt=[PROMPT, "Four score and seven"], max_tokens=6,
                                  temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    t = [c.text for c in r.choices]
    assert t[0] == t[1] and t[2] == t[3] and t[0] != t[2]
    single = client.completions.create(model=model, prompt=[PROMPT, "Four score and seven"], max_tokens=6,
                                       temperature=0)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens     # each prompt counted once
    assert r.usage.completion_tokens == 2 * single.usage.completion_tokens
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          temperature=0, n=3)
    assert [c.index for c in chat.choices] == [0, 1, 2] and len({c.message.content for c in chat.choices}) == 1
    assert idle(live.driver)


def test_n_streams_interleaved_with_each_chunks_index(live, client, model):
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                                            temperature=1.0, seed=1, n=4, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    order = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    assert set(order) == {0, 1, 2, 3}
    # interleaved: some choice's text comes after another's began and before that one ended
    first_end = min(max(j for j, i in enumerate(order) if i == k) for k in range(4))
    assert len(set(order[:first_end + 1])) > 1
    finishes = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(f.index for f in finishes) == [0, 1, 2, 3]
    assert chunks[-1].usage.completion_tokens == 64
    assert idle(live.driver)


def test_bad_n_and_best_of_are_refused_whole(live):
    web = live.app.test_client()
    model = live.driver.api_model
    for body, param in (({"n": 0}, "n"), ({"n": -2}, "n"), ({"n": 65}, "n"), ({"n": "3"}, "n"), ({"n": True}, "n"),
                        ({"n": 64, "prompt": ["a"] * 9}, "n"), ({"best_of": 3}, "best_of")):
        r = web.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2, **body})
        assert r.status_code == 400 and r.get_json()["error"]["param"] == param, (body, r.get_json())
    assert live.app.test_client().post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2,
                                                                 "best_of": 1}).status_code == 200
    assert idle(live.driver)


def test_a_client_gone_mid_stream_cancels_every_sample(live, model):
    ws = Client.connect(live.ws_url)
    try:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 450, "temperature": 1.0, "n": 3, "stream": True,
                "ignore_eos": True}
        with requests.post(live.url + "/v1/completions", json=body, stream=True, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line.startswith(b"data:"))
            next(lines)
            next(lines)
        def ended(evs):
            return sum(e["type"] == "finished" for e in evs) >= 3
        events = frames(ws, 60, until=ended)
    finally:
        ws.close()
    asked = {e["id"] for e in events if e["type"] == "request" and e["source"] == "api"}
    finished = [e for e in events if e["type"] == "finished" and e["id"] in asked]
    assert len(asked) == 3 and [e["reason"] for e in finished] == ["cancelled"] * 3
    assert all(e["output_tokens"] < 450 for e in finished)
    wait_idle(live.driver)


def test_n_samples_share_one_prefill_through_the_prefix_cache(live, client, model):
    """Each prompt's first sample is queued first, its others once it has its first token: they find
    its prompt's full blocks in the prefix cache (the page's `finished.cached_tokens`)."""
    block = live.driver.engine.blocks.block_size
    ws = Client.connect(live.ws_url)
    try:
        r = client.completions.create(model=model, prompt=PROMPT * 6, max_tokens=4, temperature=1.0, n=3,
                                      extra_body={"ignore_eos": True})
        events = frames(ws, 60, until=lambda evs: sum(e["type"] == "finished" for e in evs) >= 3)
    finally:
        ws.close()
    prompt = r.usage.prompt_tokens
    assert prompt > 2 * block
    # the others arrive after the first sample's first token (engine clock), whatever the race of their
    # admissions would have been
    lead = r.id.removeprefix("cmpl-")
    first_token = min(e["t"] for e in events if e["type"] == "token" and e["id"] == lead)
    arrivals = [e["t"] for e in events if e["type"] == "request" and e["id"] != lead]
    assert len(arrivals) == 2 and min(arrivals) > first_token
    cached = sorted(e["cached_tokens"] for e in events if e["type"] == "finished")
    assert cached[0] == 0 and all(c >= prompt - block for c in cached[1:]), cached   # all but a partial block
    assert idle(live.driver)
