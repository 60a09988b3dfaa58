"""Server profiles (observe/profiles.py) and the scraper (observe/scrape.py) against recorded
/metrics, /slots and version texts of each server kind (tests/data/metrics/; each file says
where it came from): detection, the mapping of every gauge, counters into rates, and servers
that change or drop metrics mid-run. No model is loaded here."""
import json
from pathlib import Path
import re

import pytest

from engine.core.request import GenerateRequest
from helpers import collect, wait_until
from observe import profiles
from observe.scrape import Scraper

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"


def text(name):
    return (DATA / name).read_text()


def samples(name):
    return profiles.parse(text(name))


# Every fixture, the profile it must be read as, and each page gauge as that server reported it
# (worked out by hand from the file: counts summed over engines, usage averaged).
EXPECTED = {
    "vllm-v1.txt": ("vllm", {"running": 8.0, "waiting": 2.0, "kv_usage": 0.375}),
    "vllm-v0.txt": ("vllm-v0", {"running": 4.0, "waiting": 6.0, "kv_usage": 0.875, "prefix_hit_rate": 0.3,
                                "spec_accept_rate": 0.6}),
    "sglang.txt": ("sglang", {"running": 12.0, "waiting": 3.0, "kv_usage": 0.28, "prefix_hit_rate": 0.0075,
                              "spec_accept_rate": 0.625, "spec_accept_length": 2.5, "batch_size": 12.0}),
    "tgi.txt": ("tgi", {"running": 8.0, "waiting": 5.0, "batch_size": 8.0}),
    "llamacpp-written.txt": ("llamacpp", {"running": 3.0, "waiting": 1.0, "batch_size": 2.4}),
    "first-token.txt": ("first-token", {"running": 4.0, "waiting": 4.0, "kv_usage": 0.0859375}),
}
CAPTURED_LLAMACPP = sorted(DATA.glob("llamacpp-capture-*.txt"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detection_picks_the_profile_and_maps_every_gauge(name):
    kind, gauges = EXPECTED[name]
    s = samples(name)
    profile = profiles.detect(s)
    assert profile is not None and profile.kind == kind
    got = profiles.read_gauges(profile, s)
    assert set(got) == set(profiles.GAUGES)
    assert got == {**dict.fromkeys(profiles.GAUGES), **gauges}
    # What the profile says it exposes is exactly what came back non-null from its own server.
    assert set(profiles.exposed(profile)["gauges"]) >= {k for k, v in got.items() if v is not None}


@pytest.mark.parametrize("path", CAPTURED_LLAMACPP, ids=lambda p: p.name)
def test_captured_llamacpp_text_is_read_as_llamacpp(path):
    s = profiles.parse(path.read_text())
    profile = profiles.detect(s)
    assert profile.kind == "llamacpp"
    g = profiles.read_gauges(profile, s)
    assert g["running"] is not None and g["waiting"] is not None and g["batch_size"] is not None
    c = profiles.read_counters(profile, s)
    assert c["prompt_tokens"] is not None and c["generated_tokens"] is not None and c["steps"] is not None


@pytest.mark.skipif(not (DATA / "llamacpp-capture-b.txt").exists(), reason="no second llama.cpp capture")
def test_rates_between_two_captures_of_a_real_llamacpp_server():
    """capture-b was read from the same server a measured interval after capture-a (its header
    says how long): the rates are the counters' differences over that interval."""
    a, b = text("llamacpp-capture-a.txt"), text("llamacpp-capture-b.txt")
    dt = float(re.search(r"^# read ([0-9.]+) s after capture-a$", b, re.M).group(1))
    routes = {"/metrics": (200, a.encode())}
    sc, clock, get = scraper_over(routes)
    sc.scrape(get, {})
    routes["/metrics"] = (200, b.encode())
    clock.t += dt
    sc.scrape(get, {})
    rates = sc.view(clock.now())["rates"]
    sa, sb = profiles.parse(a), profiles.parse(b)
    for key, name in (("steps", "llamacpp:n_decode_total"), ("prompt_tokens", "llamacpp:prompt_tokens_total"),
                      ("generated_tokens", "llamacpp:tokens_predicted_total")):
        (_, before), = sa[name]
        (_, after), = sb[name]
        assert rates[f"{key}_per_s"] == pytest.approx((after - before) / dt), key
    assert rates["steps_per_s"] > 0      # the pair was captured with the decode counter moving


def test_unknown_and_garbled_text_detects_nothing_and_never_raises():
    assert profiles.detect(profiles.parse("# TYPE other gauge\nother 1\n")) is None
    # A First Token without the info series (a build that lacks it) is still told from vLLM.
    assert profiles.detect(profiles.parse("vllm:num_requests_running 1\nfirst_token:slo_attainment 0.5\n")).kind \
        == "first-token"
    assert profiles.read_gauges(None, {}) == dict.fromkeys(profiles.GAUGES)
    garbled = "vllm:num_requests_running{model_name=\"m\" 3\n\x00\x01 junk\nvllm:num_requests_waiting NaN\n" \
              "vllm:num_requests_waiting{a=\"b\"} +Inf\nvllm:kv_cache_usage_perc 0.5 1700000000000\n"
    s = profiles.parse(garbled)
    assert s == {"vllm:kv_cache_usage_perc": [({}, 0.5)]}      # only the one good line (with a timestamp)
    g = profiles.read_gauges(profiles.detect(s), s)
    assert g["kv_usage"] == 0.5 and g["running"] is None and g["waiting"] is None


def bump(body, increments):
    """The same /metrics text with each named (unlabelled or labelled) series increased."""
    for name, inc in increments.items():
        body = re.sub(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) (\S+)$",
                      lambda m: f"{m.group(1)} {float(m.group(2)) + inc!r}", body, flags=re.M)
    return body


class FakeClock:
    def __init__(self):
        self.t = 10.0

    def now(self):
        return self.t


def scraper_over(routes):
    """A Scraper and a `get` serving `routes` (path -> (status, bytes)); unknown paths 404."""
    clock = FakeClock()
    sc = Scraper(clock)

    def get(path):
        status, body = routes.get(path, (404, b""))
        if isinstance(body, Exception):
            raise body
        return status, body
    return sc, clock, get


def test_counters_become_rates_over_the_scrape_interval():
    base = text("llamacpp-written.txt")
    routes = {"/metrics": (200, base.encode())}
    sc, clock, get = scraper_over(routes)
    sc.scrape(get, {})
    first = sc.view(clock.now())
    assert first["rates"]["prompt_tokens_per_s"] is None and first["period_s"] is None   # one point: no rate yet
    # 0.5 s later: 60 prompt tokens computed, 20 cached, 40 generated in 10 decode calls, 8 of 10 drafts accepted
    routes["/metrics"] = (200, bump(base, {"llamacpp:prompt_tokens_total": 60, "llamacpp:prompt_tokens_cached_total": 20,
                                           "llamacpp:tokens_predicted_total": 40, "llamacpp:n_decode_total": 10,
                                           "llamacpp:spec_decode_num_draft_tokens_total": 10,
                                           "llamacpp:spec_decode_num_accepted_tokens_total": 8}).encode())
    clock.t += 0.5
    sc.scrape(get, {})
    clock.t += 0.2
    v = sc.view(clock.now())
    assert v["period_s"] == pytest.approx(0.5) and v["age_s"] == pytest.approx(0.2) and v["every_s"] == 0.5
    r = v["rates"]
    assert r["prompt_tokens_per_s"] == pytest.approx(120) and r["generated_tokens_per_s"] == pytest.approx(80)
    assert r["prefix_hits_per_s"] == pytest.approx(40) and r["prefix_queries_per_s"] == pytest.approx(160)
    assert r["steps_per_s"] == pytest.approx(20)
    # llama.cpp exports no preemptions, and no tokens per step (its token counters grow when a
    # request ends, its decode calls as they happen: their ratio would mean nothing)
    assert r["preemptions_per_s"] is None and r["step_tokens_per_s"] is None
    assert v["ratios"] == pytest.approx({"prefix_hit_ratio": 0.25, "spec_acceptance": 0.8, "tokens_per_step": None})
    # The server restarted: counters went down. No rate for that interval, then rates again.
    routes["/metrics"] = (200, base.encode())
    clock.t += 0.5
    sc.scrape(get, {})
    assert all(x is None for x in sc.view(clock.now())["rates"].values())
    routes["/metrics"] = (200, bump(base, {"llamacpp:tokens_predicted_total": 5}).encode())
    clock.t += 0.25
    sc.scrape(get, {})
    assert sc.view(clock.now())["rates"]["generated_tokens_per_s"] == pytest.approx(20)


VLLM_BUMP = {"vllm:prompt_tokens_total": 100, "vllm:generation_tokens_total": 50, "vllm:prefix_cache_queries_total": 100,
             "vllm:prefix_cache_hits_total": 30, "vllm:num_preemptions_total": 1}


@pytest.mark.parametrize("name,counters,rates", [
    # two engines, each bumped: the sums grow by twice the bump, over 2 s
    ("vllm-v1.txt", {**VLLM_BUMP, "vllm:iteration_tokens_total_count": 5, "vllm:iteration_tokens_total_sum": 150,
                     "vllm:spec_decode_num_draft_tokens_total": 10, "vllm:spec_decode_num_accepted_tokens_total": 4},
     {"prompt_tokens": 100, "generated_tokens": 50, "prefix_queries": 100, "prefix_hits": 30, "preemptions": 1,
      "steps": 5, "step_tokens": 150, "spec_drafted": 10, "spec_accepted": 4}),
    ("vllm-v0.txt", {"vllm:prompt_tokens_total": 100, "vllm:generation_tokens_total": 50,
                     "vllm:num_preemptions_total": 1, "vllm:iteration_tokens_total_count": 5,
                     "vllm:iteration_tokens_total_sum": 150, "vllm:spec_decode_num_draft_tokens_total": 10,
                     "vllm:spec_decode_num_accepted_tokens_total": 4},
     {"prompt_tokens": 50, "generated_tokens": 25, "preemptions": 0.5, "steps": 2.5, "step_tokens": 75,
      "spec_drafted": 5, "spec_accepted": 2}),
    # cached tokens come from two sources (device, host), each bumped
    ("sglang.txt", {"sglang:prompt_tokens_total": 100, "sglang:generation_tokens_total": 50,
                    "sglang:cached_tokens_total": 30, "sglang:num_retracted_requests_total": 1},
     {"prompt_tokens": 50, "generated_tokens": 25, "prefix_queries": 50, "prefix_hits": 30, "preemptions": 0.5}),
    # TGI's steps are its decode forwards only (the prefill label set is bumped too, and not counted)
    ("tgi.txt", {"tgi_request_input_length_sum": 100, "tgi_request_generated_tokens_sum": 50,
                 "tgi_batch_inference_count": 5},
     {"prompt_tokens": 50, "generated_tokens": 25, "steps": 2.5}),
    ("first-token.txt", {**VLLM_BUMP, "vllm:spec_decode_num_draft_tokens_total": 10,
                         "vllm:spec_decode_num_accepted_tokens_total": 4},
     {"prompt_tokens": 50, "generated_tokens": 25, "prefix_queries": 50, "prefix_hits": 15, "preemptions": 0.5,
      "spec_drafted": 5, "spec_accepted": 2}),
])
def test_every_profile_turns_its_counters_into_rates(name, counters, rates):
    """Each named series is bumped on every label set it has, 2 s apart; the rates are worked
    out by hand, and every counter a profile does not map stays null."""
    base = text(name)
    routes = {"/metrics": (200, base.encode())}
    sc, clock, get = scraper_over(routes)
    sc.scrape(get, {})
    routes["/metrics"] = (200, bump(base, counters).encode())
    clock.t += 2.0
    sc.scrape(get, {})
    got = sc.view(clock.now())["rates"]
    assert got == pytest.approx({f"{k}_per_s": rates.get(k) for k in profiles.COUNTERS})
    assert set(profiles.exposed(profiles.BY_KIND[sc.profile.kind])["rates"]) == {f"{k}_per_s" for k in rates}


def test_a_server_that_drops_changes_or_garbles_metrics_mid_run_degrades_to_null():
    routes = {"/metrics": (200, text("vllm-v1.txt").encode()), "/version": (200, b'{"version": "0.11.0"}')}
    sc, clock, get = scraper_over(routes)
    sc.scrape(get, {})
    assert sc.describe()["kind"] == "vllm" and sc.describe()["version"] == "0.11.0"
    assert sc.view(clock.now())["gauges"]["running"] == 8.0
    # running dropped, waiting renamed to something unknown: those two become null, the rest stays.
    changed = "\n".join(line for line in text("vllm-v1.txt").splitlines()
                        if "num_requests_running" not in line).replace("num_requests_waiting", "num_waiting_v2")
    routes["/metrics"] = (200, changed.encode())
    clock.t += 0.5
    sc.scrape(get, {})
    g = sc.view(clock.now())["gauges"]
    assert g["running"] is None and g["waiting"] is None and g["kv_usage"] == 0.375
    # Garbage, an error status, an exception, invalid UTF-8: never raised, /metrics "not readable".
    for bad in ((200, b"\xff\xfe garbage {{{"), (500, b"oops"), (200, OSError("reset")), (200, b"")):
        routes["/metrics"] = bad
        clock.t += 0.5
        sc.scrape(get, {})
        v = sc.view(clock.now())
        assert v is None or all(x is None for x in v["gauges"].values())
    # Another server behind the same URL (restarted as SGLang): detected again, rates start over.
    routes["/metrics"] = (200, text("sglang.txt").encode())
    routes["/server_info"] = (200, (DATA / "sglang-server_info.json").read_bytes())
    clock.t += 0.5
    sc.scrape(get, {})
    v = sc.view(clock.now())
    assert v["profile"] == "sglang" and v["title"] == "SGLang" and v["gauges"]["waiting"] == 3.0
    assert all(x is None for x in v["rates"].values())
    assert sc.describe()["title"] == "SGLang" and sc.describe()["version"] == "0.5.4"


@pytest.mark.parametrize("name,routes,version", [
    ("tgi.txt", {"/info": "tgi-info.json"}, "3.3.4"),
    ("vllm-v1.txt", {"/version": "vllm-version.json"}, "0.11.0"),
    ("first-token.txt", {}, "protocol 10"),
    ("llamacpp-written.txt", {}, None),     # no /props answered: version unknown, not invented
])
def test_version_comes_from_the_servers_own_endpoint(name, routes, version):
    table = {"/metrics": (200, text(name).encode())}
    table.update({p: (200, (DATA / f).read_bytes()) for p, f in routes.items()})
    sc, clock, get = scraper_over(table)
    sc.scrape(get, {})
    assert sc.describe()["version"] == version


SLOT_FIXTURES = sorted(DATA.glob("llamacpp-slots*.json"))


@pytest.mark.parametrize("path", SLOT_FIXTURES, ids=lambda p: p.name)
def test_llamacpp_slots_say_which_of_our_requests_each_holds(path):
    """Matched by the seed the observer sent (llama.cpp reports each slot's sampling
    parameters; its prompt only in its debug mode), else by prompt text when reported."""
    slots = json.loads(path.read_text())["slots"]
    busy = [s for s in slots if s.get("is_processing")]
    assert busy, "the recorded /slots has no busy slot"
    # Our in-flight requests as sent: those the recorded slots hold (by seed, or by prompt
    # when the slot reports one and its seed is the server's "random" default), and a decoy.
    ours = {}
    for i, s in enumerate(busy):
        prompt = s.get("prompt", "").split("user\n")[-1].split("<|im_end|>")[0] or f"prompt {i}"
        seed = s["params"].get("seed")
        ours[f"o{i}"] = (prompt, seed if seed != 4294967295 else None)
    ours["o99"] = ("a prompt no slot holds", 12345)
    rows = profiles.slot_view(slots, ours)
    assert [r["id"] for r in rows] == [s["id"] for s in slots]
    by_id = {r["id"]: r for r in rows}
    for i, s in enumerate(busy):
        row = by_id[s["id"]]
        assert row["busy"] and row["request"] == f"o{i}"
        assert row["decoded"] == s["next_token"][0]["n_decoded"] and row["n_ctx"] == s["n_ctx"]
    assert "o99" not in {r["request"] for r in rows}
    assert all(r["request"] is None for r in rows if not r["busy"])
    # A busy slot none of ours is in (another client's request) is busy with no request.
    assert all(r["request"] is None for r in profiles.slot_view(busy, {"o99": ours["o99"]}))
    # Nothing of the server's texts is passed on (other clients' prompts may be in its slots).
    assert all(set(r) == {"id", "busy", "request", "n_ctx", "prompt_tokens", "cached_tokens", "decoded",
                          "remaining"} for r in rows)


def test_odd_slots_answers_give_rows_or_none():
    assert profiles.slot_view({"error": "slots disabled"}, {}) is None
    assert profiles.slot_view([1, {"id": "x"}, {"id": 0, "is_processing": True, "next_token": "?"}], {}) == [
        {"id": 0, "busy": True, "request": None, "n_ctx": None, "prompt_tokens": None, "cached_tokens": None,
         "decoded": None, "remaining": None}]
    # Two of ours with one seed (a page that chose it twice): not told apart by seed.
    slot = {"id": 0, "is_processing": True, "params": {"seed": 7}}
    assert profiles.slot_view([slot], {"o1": ("a", 7), "o2": ("b", 7)})[0]["request"] is None


# ------------------------------------------------------------------ through the observer, to `stats`
@pytest.fixture
def fake_server():
    """A loopback HTTP server answering GETs from a mutable {path: (status, bytes)} table,
    with /v1/models, and recording the headers of every request."""
    from helpers import loopback_http
    routes = {"/v1/models": (200, b'{"data": [{"id": "fake-model"}]}')}
    seen = []

    posted = []

    def answer(handler):
        seen.append((handler.path, dict(handler.headers)))
        return routes.get(handler.path, (404, b"not here"))

    def stream(handler):      # one chunk, then done: enough for a request to finish
        posted.append(json.loads(handler.rfile.read(int(handler.headers["Content-Length"]))))
        return 200, (b'data: {"choices": [{"text": "ok", "finish_reason": "stop"}]}\n\n'
                     b'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    httpd = loopback_http(answer, stream)
    httpd.routes, httpd.seen, httpd.posted = routes, seen, posted
    yield httpd
    httpd.shutdown()


def next_stats(obs, pred, seconds=30):
    sub = obs.events.subscribe(replay=False)
    try:
        events = collect(sub, lambda evs: any(e["type"] == "stats" and pred(e) for e in evs), seconds)
    finally:
        obs.events.unsubscribe(sub)
    return next(e for e in events if e["type"] == "stats" and pred(e))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_mapped_gauge_reaches_stats(fake_server, name):
    from helpers import schema_validator
    from observe import Observer
    kind, gauges = EXPECTED[name]
    fake_server.routes["/metrics"] = (200, text(name).encode())
    obs = Observer(fake_server.url + "/v1").start()
    try:
        e = next_stats(obs, lambda e: e["server"] is not None)
        schema_validator().validate(e)
        assert e["server"]["profile"] == kind
        assert e["server"]["gauges"] == {**dict.fromkeys(profiles.GAUGES), **gauges}
        assert e["running"] == (int(gauges["running"]) if "running" in gauges else None)
        assert e["queue"] == (int(gauges["waiting"]) if "waiting" in gauges else None)
        assert e["cache_usage"] == gauges.get("kv_usage")
        assert e["measured_by"]["server"] == "server" and e["measured_by"]["tokens_per_s"] == "client"
        hello = obs.hello().to_dict()
        schema_validator().validate(hello)
        assert hello["server"]["kind"] == kind and hello["metrics"] is True
        # A metric dropped mid-run: null from the next scrape on, the others stay, nothing raises.
        fake_server.routes["/metrics"] = (200, "\n".join(
            line for line in text(name).splitlines() if "running" not in line and "batch_current_size" not in line
            and "requests_processing" not in line).encode())
        e = next_stats(obs, lambda e: e["server"] is not None and e["server"]["gauges"]["running"] is None)
        assert e["running"] is None and e["server"]["gauges"]["waiting"] == gauges.get("waiting")
        fake_server.routes["/metrics"] = (503, b"down")
        e = next_stats(obs, lambda e: e["server"] is None)
        assert e["queue"] is None and e["cache_usage"] is None and obs.health()[0]["metrics"] is False
    finally:
        obs.shutdown()


def test_metrics_elsewhere_and_the_api_key_on_every_request(fake_server):
    """--observe-metrics: /metrics read from where it is said to be; the API key goes with
    every GET to the server (models, metrics, slots, version) and is published nowhere."""
    from observe import Observer
    fake_server.routes["/custom/metrics"] = (200, text("llamacpp-written.txt").encode())
    fake_server.routes["/slots"] = (200, json.dumps(json.loads((DATA / "llamacpp-slots.json").read_text())["slots"]).encode())
    fake_server.routes["/props"] = (200, b'{"build_info": "b9999-abcdef0", "total_slots": 4}')
    obs = Observer(fake_server.url + "/v1", api_key="sekrit-key", metrics_url=fake_server.url + "/custom/metrics").start()
    try:
        e = next_stats(obs, lambda e: e["server"] is not None and e["server"]["slots"] is not None)
        assert e["server"]["profile"] == "llamacpp" and e["server"]["gauges"]["running"] == 3.0
        assert [s["busy"] for s in e["server"]["slots"]] == [True, False, True, False]
        hello = obs.hello().to_dict()
        assert hello["server"]["version"] == "b9999-abcdef0" and hello["server"]["slots"] is True
        assert e["server"]["title"] == "llama.cpp server" and e["server"]["version"] == "b9999-abcdef0"
        assert "llama_decode" in hello["server"]["exposed"]["notes"]["batch_size"]
        paths = {p for p, _ in fake_server.seen}
        assert {"/v1/models", "/custom/metrics", "/slots", "/props"} <= paths and "/metrics" not in paths
        assert all(h.get("Authorization") == "Bearer sekrit-key" for _, h in fake_server.seen)
        assert "sekrit-key" not in json.dumps([hello, e, obs.health()[0]])
    finally:
        obs.shutdown()


@pytest.mark.parametrize("name,tagged", [("llamacpp-written.txt", True), ("vllm-v1.txt", False)])
def test_requests_carry_a_seed_of_ours_only_where_slots_need_it(fake_server, name, tagged):
    """On llama.cpp each request without a seed gets a random one (how its /slots tell which
    request a slot holds); a seed the page chose is kept; on vLLM nothing is added."""
    from observe import Observer
    fake_server.routes["/metrics"] = (200, text(name).encode())
    obs = Observer(fake_server.url + "/v1").start()
    try:
        next_stats(obs, lambda e: e["server"] is not None)
        obs.submit(GenerateRequest(prompt="first", source="page", chat=True))
        obs.submit(GenerateRequest(prompt="second", source="page"))
        obs.submit(GenerateRequest(prompt="chosen", source="page", chat=True, seed=7))
        wait_until(lambda: len(fake_server.posted) >= 3, 30, "the three requests posted")
    finally:
        obs.shutdown()
    bodies = {json.dumps(b.get("messages") or b.get("prompt")): b for b in fake_server.posted}
    seeds = [b.get("seed") for b in fake_server.posted if b.get("seed") != 7]
    assert len(bodies) == 3 and any(b.get("seed") == 7 for b in fake_server.posted)
    if tagged:
        assert len(seeds) == 2 and all(type(x) is int for x in seeds) and seeds[0] != seeds[1]
    else:
        assert seeds == [None, None]
