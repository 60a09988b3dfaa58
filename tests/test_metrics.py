"""/metrics: vLLM-named Prometheus series that move by exactly what the requests did."""
import openai
import requests
from prometheus_client.parser import text_string_to_metric_families

from engine import events as ev
from server.metrics import EngineMetrics


def scrape(server):
    r = requests.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    types, values = {}, {}
    for family in text_string_to_metric_families(r.text):
        types[family.name] = family.type
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            values[(s.name, labels)] = s.value
    return types, values


def test_metrics_move_by_exactly_what_the_requests_did(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    _, before = scrape(server)
    usages, reasons = [], []
    for i, max_tokens in enumerate((3, 5)):
        r = client.completions.create(model=model, prompt=f"Four score and seven years ago {i}",
                                      max_tokens=max_tokens, temperature=0)
        usages.append(r.usage)
        reasons.append(r.choices[0].finish_reason)
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    usages.append(chunks[-1].usage)
    reasons.append([c.choices[0].finish_reason for c in chunks if c.choices][-1])
    types, after = scrape(server)

    def moved(name, labels=()):
        return after[(name, labels)] - before.get((name, labels), 0.0)

    n = len(usages)
    assert moved("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert moved("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds"):
        assert types[hist] == "histogram"
        assert moved(hist + "_count") == n
        assert moved(hist + "_bucket", (("le", "+Inf"),)) == n
    gaps = sum(u.completion_tokens - 1 for u in usages)
    assert moved("vllm:inter_token_latency_seconds_count") == gaps
    assert moved("vllm:time_per_output_token_seconds_count") == gaps
    assert moved("vllm:inter_token_latency_seconds_sum") > 0
    for reason in ("stop", "length"):
        assert moved("vllm:request_success_total", (("finished_reason", reason),)) == reasons.count(reason)
    assert types["vllm:num_requests_running"] == "gauge"
    assert after[("vllm:num_requests_running", ())] == 0 and after[("vllm:num_requests_waiting", ())] == 0
    assert 0 <= after[("vllm:kv_cache_usage_perc", ())] <= 1


def test_gauges_follow_request_lifecycle_events():
    m = EngineMetrics("m", cache_blocks=10)

    def value(name, **labels):
        return m.registry.get_sample_value(name, {"model_name": "m", **labels})
    for rid in ("a", "b"):
        m.on_event(ev.Request(t=0.0, id=rid, source="api", prompt_tokens=5, max_new_tokens=4, preview=""))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (2, 0)
    m.on_event(ev.Admitted(t=0.1, id="a", slot=0, queue_s=0.1, blocks=1))
    m.on_event(ev.Step(t=0.2, kind="decode", start=0.1, end=0.2, ids=["a"], tokens=1, kv_cache=True,
                       cache_tokens=6, cache_blocks_used=4))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (1, 1)
    assert value("vllm:kv_cache_usage_perc") == 0.4
    m.on_event(ev.Rejected(t=0.2, id="b", reason="queue full", code="queue_full"))
    m.on_event(ev.Finished(t=0.3, id="a", reason="cancelled", source="api", prompt_tokens=5, output_tokens=0,
                           e2e=0.3))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (0, 0)
    assert value("vllm:request_success_total", finished_reason="abort") == 1
    assert value("vllm:e2e_request_latency_seconds_count") == 1
    assert value("vllm:time_to_first_token_seconds_count") == 0   # it never had a first token
