"""Weights as a live lesson (issue 31): the `weights` setting switches the copy a forward reads
while a request decodes, and every `step`, `measure`, /healthz and /metrics say which copy and how
many bytes; the `weights` preset switches mid-run (a comparison's side keeps one format); a
classroom viewer cannot switch it. On the tiny random model with its weights as Q4_1 blocks
(tests/helpers.py tiny_quant_bundle), in process. Nothing here is decided by wall-clock speed:
the bytes and the roofline's estimates are the engine's own figures."""
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from engine import Engine, EngineConfig
from engine.model import kernels
from engine.events import Settings, Step
from engine.settings import defaults, make_settings
from helpers import collect, engine_driver, schema_validator, switched_to_stored
from server import control
from server.classroom import VIEWER_REFUSED
from server.metrics import EngineMetrics

def of(events, kind):
    return [e for e in events if e["type"] == kind]


def formats_of(hello):
    return {name: f["decode_bytes"] for name, f in hello.weights["formats"].items()}


def test_hello_offers_both_formats_and_names_their_bytes(quant):
    hello = Engine(quant, EngineConfig(slots=2, kv_tokens=1024, max_context=256)).hello()
    w = hello.weights
    assert hello.limits["weights"]["choices"] == ["stored", "dequantised"] and hello.settings["weights"] == "stored"
    stored, fp32 = w["formats"]["stored"], w["formats"]["dequantised"]
    assert stored["blocks"] == ["Q4_1"] and fp32["blocks"] == ["F32"]
    assert 0 < stored["decode_bytes"] < fp32["decode_bytes"] / 4        # 20 bytes per 32 weights against 128
    assert stored["floor_s"] < fp32["floor_s"]                          # the same bandwidth, fewer bytes
    assert hello.bandwidth["weight_bytes"] == stored["decode_bytes"]     # the default format's
    assert w["kernel"] in ("avx512", "avx2", "portable") and w["why"] is None and w["fp32_on_demand"] is True


def test_the_setting_switches_live_and_each_step_says_what_it_read(qlive):
    """A request decodes under `dequantised`; the setting changes to `stored` while it runs; its
    later steps read the blocks through the 4-bit kernel, and each step's bytes and roofline
    estimate are the format's own."""
    d = qlive.driver
    want = formats_of(d.hello())
    d.update_settings({"weights": "dequantised", "max_new_tokens": 400})
    sub = d.events.subscribe(replay=False)
    d.burst(1, seed=1)
    events = collect(sub, lambda ev: len([s for s in of(ev, "step") if s["kind"] == "decode"]) >= 5)
    d.update_settings({"weights": "stored"})
    events += collect(sub, lambda ev: any(s["weights"] == "stored" for s in of(ev, "step") if s["kind"] == "decode")
                      and len(of(ev, "finished")) >= 1, timeout=60)
    (change,) = [e for e in of(events, "settings") if "weights" in e["changed"] and e["settings"]["weights"] == "stored"]
    decode = [s for s in of(events, "step") if s["kind"] == "decode"]
    before = [s for s in decode if s["end"] <= change["t"]]
    after = [s for s in decode if s["start"] >= change["t"]]
    assert before and after
    assert {(s["weights"], s["kernel"], s["weight_bytes"]) for s in before} == {("dequantised", "oneDNN fp32", want["dequantised"])}
    assert {(s["weights"], s["weight_bytes"]) for s in after} == {("stored", want["stored"])}
    assert {s["kernel"] for s in after} == {f"Q4_1 {kernels.status()['isa']}"}      # the tiny model's blocks
    # the roofline's estimate counts the bytes read: at the same batch the 4-bit steps' is lower
    assert max(s["predicted_s"] for s in after) < min(s["predicted_s"] for s in before)
    validator = schema_validator()
    for s in decode[:3] + decode[-3:]:
        validator.validate(s)


def test_healthz_and_metrics_name_the_format_and_its_bytes(qlive):
    http = qlive.app.test_client()
    want = formats_of(qlive.driver.hello())

    def gauge():
        text = http.get("/metrics").get_data(as_text=True)
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in ("first_token:weight_bytes_per_decode_step", "first_token:weight_bytes_read_total"):
                    out.setdefault(s.name, {})[s.labels["format"]] = s.value
        return out

    h = http.get("/healthz").get_json()["weights"]
    assert h == {"format": "stored", "decode_bytes": want["stored"], "kernel": f"Q4_1 {kernels.status()['isa']}",
                 "formats": ["stored", "dequantised"]}
    assert gauge()["first_token:weight_bytes_per_decode_step"] == {"stored": want["stored"]}
    sub = qlive.driver.events.subscribe(replay=False)
    qlive.driver.update_settings({"weights": "dequantised"})
    collect(sub, lambda ev: of(ev, "settings"))
    h = http.get("/healthz").get_json()["weights"]
    assert (h["format"], h["decode_bytes"], h["kernel"]) == ("dequantised", want["dequantised"], "oneDNN fp32")
    assert gauge()["first_token:weight_bytes_per_decode_step"] == {"dequantised": want["dequantised"]}
    # the bytes the forwards read, by format: a decode-only request adds its steps' bytes
    qlive.driver.update_settings({"max_new_tokens": 6})
    qlive.driver.burst(1, seed=2)
    events = collect(sub, lambda ev: of(ev, "finished") and ev[-1]["type"] == "stats", timeout=30)
    read = sum(s["weight_bytes"] for s in of(events, "step"))
    assert gauge()["first_token:weight_bytes_read_total"] == {"dequantised": read}


def test_healthz_and_stats_report_resident_memory_and_the_fp32_copy(qlive):
    """/healthz's `memory` and every `stats` event carry the process's measured RSS; the fp32 copy
    is there only while `dequantised` is read (made for the switch, with its time), freed after."""
    import os
    http = qlive.app.test_client()
    m = http.get("/healthz").get_json()["memory"]
    statm_pages = int(open("/proc/self/statm").read().split()[1])           # the same process
    assert abs(m["rss_bytes"] - statm_pages * os.sysconf("SC_PAGE_SIZE")) < 200e6
    assert m["fp32_copy"] is False and m["fp32_made_s"] is None
    assert m["blocks_bytes"] == sum(w.nbytes for w in {id(w): w for w in qlive.driver.engine.bundle.quant.values()}.values())
    assert m["kv_store_bytes"] == qlive.driver.engine.store.nbytes
    sub = qlive.driver.events.subscribe(replay=False)
    qlive.driver.update_settings({"weights": "dequantised"})
    (change,) = [e for e in collect(sub, lambda ev: of(ev, "settings")) if e["type"] == "settings"]
    m = http.get("/healthz").get_json()["memory"]
    assert m["fp32_copy"] is True and m["fp32_made_s"] == change["fp32_made_s"] > 0
    qlive.driver.update_settings({"weights": "stored"})
    stats = collect(sub, lambda ev: any(e["type"] == "stats" for e in ev) and of(ev, "settings"), timeout=10)
    assert http.get("/healthz").get_json()["memory"]["fp32_copy"] is False
    assert all(e["rss_bytes"] > 50e6 for e in of(stats, "stats"))


def test_the_metrics_listener_follows_settings_and_steps():
    m = EngineMetrics("m", 8)
    m._formats = {"stored": 100, "dequantised": 500}
    m._weights_in_force("stored")
    every = defaults(make_settings(8, 128, 16, 512, ("stored", "dequantised"))).replace({"weights": "dequantised"})
    m.on_event(Settings(t=1.0, settings=every.wire(), changed=["weights"]))   # an event carries every value
    m.on_event(Step(t=2.0, kind="decode", start=1.5, end=2.0, ids=["r1"], tokens=1, prefill_tokens=0,
                    decode_tokens=1, kv_cache=True, cache_tokens=4, cache_blocks_used=1, per_request={"r1": 4},
                    weights="dequantised", kernel="oneDNN fp32", weight_bytes=500))
    text = m.render().decode()
    assert 'first_token:weight_bytes_per_decode_step{format="dequantised",model_name="m"} 500.0' in text
    assert 'format="stored"' not in text.split("first_token:weight_bytes_read")[0].split("weight_bytes_per_decode_step")[-1]
    assert 'first_token:weight_bytes_read_total{format="dequantised",model_name="m"} 500.0' in text


COPY_S = 1.5   # how long the weights preset's fp32 copy is made to take (more than the 0.6 s the free takes)


def test_the_weights_preset_switches_mid_run_and_a_comparison_side_keeps_one_format(qlive):
    """`weights`: one stream reads fp32, then at 4 s the blocks (a `settings` event the preset's
    action sends); with `weights` overridden (one side of the comparison) no switch comes."""
    d = qlive.driver
    formats = d.engine.runner.formats
    use = formats.use

    def slow_copy(fmt):   # the time under test: the fp32 copy takes seconds on a busy machine
        made = use(fmt)
        if made is not None:
            time.sleep(COPY_S)
        return made

    sub = d.events.subscribe(replay=False)
    formats.use = slow_copy
    try:
        d.apply_preset("weights")
        events = collect(sub, switched_to_stored, timeout=30)
    finally:
        del formats.use
    (preset,) = of(events, "preset")
    assert preset["requests"] == 1 and len(of(events, "request")) == 1
    switch = [e for e in of(events, "settings") if e["t"] > preset["t"] and "weights" in e["changed"]][0]
    # Not before its 4 s (engine time) from the lesson's start, which is after the copy was made
    # (counted from before it, the switch came COPY_S early), and on the engine's first turn once
    # due: no step began between (how late that turn came is this machine's business).
    assert switch["t"] - preset["t"] >= 3.9
    assert not [s for s in of(events, "step") if preset["t"] + 4 <= s["start"] < switch["t"]]
    first = [s for s in of(events, "step") if s["start"] < switch["t"]]
    assert first and {s["weights"] for s in first} == {"dequantised"}
    d.apply_preset("weights", {"weights": "dequantised"})
    # Two `stats` past the 4 s mark (engine time): the second's turn began after it, and a
    # switch would have come at that turn's start.
    later = collect(sub, lambda ev: of(ev, "preset") and len(
        [e for e in of(ev, "stats") if e["t"] > of(ev, "preset")[0]["t"] + 4]) >= 2, timeout=30)
    assert of(later, "preset")[0]["overrides"] == {"weights": "dequantised"}
    assert not [e for e in of(later, "settings") if e["t"] > of(later, "preset")[0]["t"]]
    assert d.settings.now.scheduling.weights == "dequantised"


def test_on_a_model_without_blocks_the_lessons_switch_is_refused_and_said(tiny):
    d = engine_driver(tiny, slots=2, kv_tokens=1024, max_context=256)
    try:
        assert d.hello().limits["weights"]["choices"] == ["dequantised"]
        assert list(d.hello().weights["formats"]) == ["dequantised"]
        sub = d.events.subscribe(replay=False)
        d.apply_preset("weights", {"max_new_tokens": 4})
        events = collect(sub, lambda ev: of(ev, "error"), timeout=15)
        (err,) = of(events, "error")
        assert err["field"] == "weights" and not err["fatal"] and "not applied" in err["message"]
        assert d.settings.now.scheduling.weights == "dequantised" and d.failure is None
    finally:
        d.shutdown()


def test_measure_reports_the_format_it_read_and_its_floor(qlive):
    d = qlive.driver
    sub = d.events.subscribe(replay=False)
    done = {}
    for fmt in ("dequantised", "stored"):
        d.update_settings({"weights": fmt})
        d.measure()
        events = collect(sub, lambda ev: [m for m in of(ev, "measure") if m["status"] == "done"], timeout=120)
        (done[fmt],) = [m for m in of(events, "measure") if m["status"] == "done"]
        assert done[fmt]["weights"] == fmt
    pts = {fmt: {(p["batch"], p["context"]): p for p in m["decode"]} for fmt, m in done.items()}
    for key, p in pts["stored"].items():
        q = pts["dequantised"][key]
        if p["batch"] <= 32:   # rows the 4-bit kernel takes
            assert p["floor_s"] < q["floor_s"] and p["predicted_s"] <= q["predicted_s"]


def test_a_viewer_cannot_switch_the_weights(qlive):
    d = qlive.driver
    assert control.handle(d, json.dumps({"type": "set", "settings": {"weights": "dequantised"}}), role="viewer")[0].message \
        == VIEWER_REFUSED
    assert d.settings.now.scheduling.weights == "stored"
    (err,) = control.handle(d, json.dumps({"type": "set", "settings": {"weights": "fp16"}}), role="presenter")
    assert err.field == "weights" and d.settings.now.scheduling.weights == "stored"
