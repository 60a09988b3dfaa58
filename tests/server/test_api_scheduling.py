"""The scheduling features as API clients and dashboards see them (tiny model, in process):
vLLM's ignore_eos/min_tokens, cached prompt tokens in usage, prefix-cache and preemption metrics."""
import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from helpers import reference

PREFIX = "We hold these truths to be self-evident, that all men are created equal, that they are endowed " * 2


@pytest.fixture
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def metric(live, name):
    text = requests.get(live.url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_ignore_eos_and_min_tokens(live, client, tiny):
    ref = reference(tiny, "Liberty", 10)
    live.driver.engine.eos = {ref[0]}      # the greedy first token now ends a request
    def ask(**extra):
        r = client.completions.create(model="tiny-random-llama", prompt="Liberty", max_tokens=10, temperature=0,
                                      extra_body=extra)
        return r.usage.completion_tokens, r.choices[0].finish_reason
    assert ask() == (1, "stop")
    assert ask(ignore_eos=True) == (10, "length")
    assert ask(min_tokens=4)[0] >= 4
    with pytest.raises(openai.BadRequestError) as e:
        ask(min_tokens=11)
    assert "min_tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        ask(ignore_eos="yes")


def test_cached_tokens_in_usage_and_prefix_metrics(live, client):
    queries, hits = metric(live, "vllm:prefix_cache_queries_total"), metric(live, "vllm:prefix_cache_hits_total")
    first = client.completions.create(model="tiny-random-llama", prompt=PREFIX + " one", max_tokens=2, temperature=0)
    second = client.completions.create(model="tiny-random-llama", prompt=PREFIX + " two", max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < second.usage.prompt_tokens
    assert metric(live, "vllm:prefix_cache_queries_total") - queries == first.usage.prompt_tokens + second.usage.prompt_tokens
    assert metric(live, "vllm:prefix_cache_hits_total") - hits == cached


def test_preemptions_are_counted(live, client):
    live.driver.update_settings({"cache_tokens": 112, "prefix_caching": False})
    import concurrent.futures as cf
    before = metric(live, "vllm:num_preemptions_total")
    prompts = ["Four score and seven years ago our fathers brought forth",
               "When in the Course of human events, it becomes necessary for one people"]
    with cf.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda p: client.completions.create(model="tiny-random-llama", prompt=p, max_tokens=50,
                                                                 temperature=0, extra_body={"ignore_eos": True}),
                             prompts))
    assert all(r.usage.completion_tokens == 50 for r in done)
    assert metric(live, "vllm:num_preemptions_total") > before
