"""/metrics: vLLM-named Prometheus series that move by exactly what the requests did (the app
from `create_app` on the tiny random model, in process), and the listener's gauges."""

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import events as ev
from helpers import collect
from server.metrics import EngineMetrics


def scrape(live):
    r = live.app.test_client().get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    types, values = {}, {}
    for family in text_string_to_metric_families(r.get_data(as_text=True)):
        types[family.name] = family.type
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            values[(s.name, labels)] = s.value
    return types, values


def wait_until_counted(sub, rids, timeout=30):
    """Block until the metrics listener has seen every request's `finished` event. Listeners run
    right after subscribers get an event, in the engine thread: any event published after the
    last of them (the next `stats`, within 0.5 s) means they were counted."""
    def done(events):
        return [i for i, e in enumerate(events) if e["type"] == "finished" and e["id"] in rids]
    events = collect(sub, lambda evs: len(done(evs)) == len(rids) and len(evs) > done(evs)[-1] + 1, timeout)
    return [events[i] for i in done(events)]


def test_metrics_move_by_exactly_what_the_requests_did(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    sub = live.driver.events.subscribe(replay=False)
    _, before = scrape(live)
    usages, reasons, rids = [], [], set()
    for i, max_tokens in enumerate((3, 5)):
        r = client.completions.create(model=model, prompt=f"Four score and seven years ago {i}",
                                      max_tokens=max_tokens, temperature=0)
        usages.append(r.usage)
        reasons.append(r.choices[0].finish_reason)
        rids.add(r.id.removeprefix("cmpl-"))
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    usages.append(chunks[-1].usage)
    reasons.append([c.choices[0].finish_reason for c in chunks if c.choices][-1])
    rids.add(chunks[0].id.removeprefix("chatcmpl-"))
    finished = wait_until_counted(sub, rids)
    live.driver.events.unsubscribe(sub)
    types, after = scrape(live)

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
    assert gaps > 0
    assert moved("vllm:inter_token_latency_seconds_count") == gaps
    assert moved("vllm:time_per_output_token_seconds_count") == gaps
    assert moved("vllm:inter_token_latency_seconds_sum") > 0
    for reason in ("stop", "length"):
        assert moved("vllm:request_success_total", (("finished_reason", reason),)) == reasons.count(reason)
    # every completed request judged against the SLOs, counted as its `finished` event marked it
    met = sum(1 for e in finished if e["slo"]["met"])
    assert moved("first_token:slo_requests_total", (("slo", "met"),)) == met
    assert moved("first_token:slo_requests_total", (("slo", "missed"),)) == n - met
    assert types["first_token:goodput_requests_per_s"] == "gauge"
    assert types["vllm:num_requests_running"] == "gauge"
    assert after[("vllm:num_requests_running", ())] == 0 and after[("vllm:num_requests_waiting", ())] == 0
    assert 0 <= after[("vllm:kv_cache_usage_perc", ())] <= 1
    # per request: its prompt, its output and the max_tokens it asked; per forward: its tokens
    for hist, values in (("vllm:request_prompt_tokens", [u.prompt_tokens for u in usages]),
                         ("vllm:request_generation_tokens", [u.completion_tokens for u in usages]),
                         ("vllm:request_params_max_tokens", [3, 5, 4])):
        assert types[hist] == "histogram"
        assert moved(hist + "_count") == n and moved(hist + "_sum") == sum(values)
    computed = sum(u.prompt_tokens - u.prompt_tokens_details.cached_tokens + u.completion_tokens - 1 for u in usages)
    assert moved("vllm:iteration_tokens_total_sum") == computed   # every prompt token not cached, every token fed back
    assert moved("vllm:iteration_tokens_total_count") >= n
    hello = live.driver.hello()
    info = {dict(labels)["block_size"]: v for (name, labels), v in after.items() if name == "vllm:cache_config_info"}
    assert info == {str(hello.block_size): 1.0}
    (labels,) = [dict(labels) for (name, labels) in after if name == "vllm:cache_config_info"]
    assert labels["num_gpu_blocks"] == str(hello.cache_blocks) and labels["enable_prefix_caching"] == "True"


def test_gauges_follow_request_lifecycle_events():
    m = EngineMetrics("m", cache_blocks=10)

    def value(name, **labels):
        return m.registry.get_sample_value(name, {"model_name": "m", **labels})
    for rid in ("a", "b"):
        m.on_event(ev.Request(t=0.0, id=rid, source="api", prompt_tokens=5, max_new_tokens=4, preview=""))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (2, 0)
    m.on_event(ev.Admitted(t=0.1, id="a", slot=0, queue_s=0.1, blocks=1, prompt_tokens=5, cached_tokens=0,
                           resumed=False))
    m.on_event(ev.Step(t=0.2, kind="decode", start=0.1, end=0.2, ids=["a"], tokens=1, prefill_tokens=0,
                       decode_tokens=1, kv_cache=True, cache_tokens=6, cache_blocks_used=4, per_request={"a": 6}))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (1, 1)
    assert value("vllm:kv_cache_usage_perc") == 0.4
    assert value("vllm:spec_decode_num_drafts_total") == 0
    m.on_event(ev.Step(t=0.25, kind="decode", start=0.2, end=0.25, ids=["a"], tokens=5, prefill_tokens=0,
                       decode_tokens=5, kv_cache=True, cache_tokens=9, cache_blocks_used=4, per_request={"a": 10},
                       spec={"a": {"proposed": 4, "accepted": 2}}))
    m.on_event(ev.Step(t=0.3, kind="decode", start=0.25, end=0.3, ids=["a"], tokens=4, prefill_tokens=0,
                       decode_tokens=4, kv_cache=True, cache_tokens=10, cache_blocks_used=4, per_request={"a": 13},
                       spec={"a": {"proposed": 3, "accepted": 0}}))
    assert value("vllm:spec_decode_num_drafts_total") == 2
    assert value("vllm:spec_decode_num_draft_tokens_total") == 7
    assert value("vllm:spec_decode_num_accepted_tokens_total") == 2
    per_pos = [value("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
    assert per_pos == [1, 1, 0]
    m.on_event(ev.Rejected(t=0.2, id="b", reason="queue full", code="queue_full"))
    m.on_event(ev.Finished(t=0.3, id="a", reason="cancelled", source="api", prompt_tokens=5, output_tokens=0,
                           e2e=0.3))
    assert (value("vllm:num_requests_waiting"), value("vllm:num_requests_running")) == (0, 0)
    assert value("vllm:request_success_total", finished_reason="abort") == 1
    assert value("vllm:e2e_request_latency_seconds_count") == 1
    assert value("vllm:time_to_first_token_seconds_count") == 0   # it never had a first token


def test_inter_token_latency_counts_one_gap_per_forward_under_speculation():
    """A verifying forward's tokens (accepted guesses, then the model's own) go out together:
    one gap before them, as vLLM counts it, not zero gaps between them."""
    m = EngineMetrics("m", cache_blocks=10)
    forwards = [(1.0, [None]), (1.1, ["accepted", "accepted", "corrected"]), (1.3, [None]),
                (1.6, ["accepted", "bonus"])]
    index = 0
    for t, kinds in forwards:
        for i, kind in enumerate(kinds):
            m.on_event(ev.Token(t=t + i * 1e-4, id="a", index=index, token_id=1, text="x", first=index == 0,
                                sampled=t, sample_s=0.0, spec=kind))
            index += 1
    count = m.registry.get_sample_value("vllm:inter_token_latency_seconds_count", {"model_name": "m"})
    total = m.registry.get_sample_value("vllm:inter_token_latency_seconds_sum", {"model_name": "m"})
    assert count == 3
    assert total == pytest.approx((1.1 - 1.0) + (1.3 - 1.1002) + (1.6 - 1.3))


def test_cache_config_info_follows_the_prefix_caching_setting(live):
    """`vllm:cache_config_info` keeps one series, relabelled when prefix caching is switched."""
    from helpers import wait_until

    def series():
        _, values = scrape(live)
        return [dict(labels)["enable_prefix_caching"] for (name, labels) in values if name == "vllm:cache_config_info"]
    assert series() == ["True"]
    live.driver.update_settings({"prefix_caching": False})
    wait_until(lambda: series() == ["False"], 10, "cache_config_info relabelled")
