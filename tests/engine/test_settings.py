"""Typed settings (engine/settings.py): the registry and the parts' fields are one list, a change
makes a new value, and the engine hands each owner its own part."""
from dataclasses import FrozenInstanceError, fields
import json
from pathlib import Path
import re

import pytest

from engine.config import EngineConfig
from engine.core.engine import Engine
from engine.settings import (DeliverySettings, LoadSettings, SchedulingSettings, Setting, Settings, Targets,
                             check_registry, defaults, make_settings, validate)

ROOT = Path(__file__).resolve().parents[2]
SPECS = make_settings(max_slots=8, cache_tokens_max=1024, block_size=16, max_context=512)


def test_every_setting_in_the_registry_is_a_field_of_one_part_of_its_kinds_type():
    owners = {f.name: part.name for part in fields(Settings) for f in fields(part.type)}
    assert sorted(owners) == sorted(SPECS)
    assert owners["rate"] == "load" and owners["top_p"] == "sampling" and owners["weights"] == "scheduling"
    assert owners["net_jitter_ms"] == "delivery" and owners["slo_tpot_ms"] == "targets"
    schema = json.loads((ROOT / "docs" / "events.schema.json").read_text())["$defs"]["SettingValues"]
    assert list(schema["properties"]) == list(owners) and schema["required"] == []   # the schema's, from them


def test_a_registry_that_drifts_from_the_parts_is_refused():
    missing = {n: s for n, s in SPECS.items() if n != "rate"}
    with pytest.raises(TypeError, match=r"only in Settings \['rate'\]"):
        check_registry(missing)
    extra = {**SPECS, "lora": Setting("lora", "bool", False)}
    with pytest.raises(TypeError, match=r"only in the registry \['lora'\]"):
        check_registry(extra)
    retyped = {**SPECS, "slots": Setting("slots", "float", 1.0, 1, 8)}
    with pytest.raises(TypeError, match="slots"):
        check_registry(retyped)


def test_the_wire_dict_is_the_flat_registry_and_comes_back_as_the_same_value():
    s = defaults(SPECS)
    assert s.wire() == {name: spec.default for name, spec in SPECS.items()}
    assert Settings.from_wire(s.wire()) == s
    assert s.scheduling == SchedulingSettings(slots=8, cache_tokens=1024, kv_cache=True, schedule="mixed",
                                              scheduling_policy="fcfs",
                                              max_batched_tokens=256, max_step_ms=0, prefix_caching=True,
                                              speculation="off", spec_tokens=4, weights="dequantised",
                                              activations="fp32")


def test_a_change_is_a_new_value_and_leaves_the_other_parts_as_they_were():
    before = defaults(SPECS)
    after = before.replace(validate(SPECS, {"rate": 2, "slo_ttft_ms": 500}))
    assert after.load == LoadSettings(load=False, rate=2.0, prompt_tokens=128)
    assert after.targets == Targets(slo_ttft_ms=500, slo_tpot_ms=100)
    assert before.load.rate == 1.0 and before.targets.slo_ttft_ms == 2000     # the old value is unchanged
    assert after.sampling is before.sampling and after.scheduling is before.scheduling
    with pytest.raises(FrozenInstanceError):
        after.load.rate = 3.0


def test_delivery_is_configured_when_anything_stands_between():
    off = defaults(SPECS).delivery
    assert off == DeliverySettings(0, 0, 0, 0) and not off.configured()
    assert defaults(SPECS).replace({"net_jitter_ms": 10}).delivery.configured()


def test_the_engine_hands_each_owner_its_part_of_every_new_value(tiny):
    engine = Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))
    old = engine.settings.now
    [ev] = engine.apply_settings(validate(engine.specs, {"slots": 2, "temperature": 0.5, "slo_tpot_ms": 50}))
    s = engine.settings.now
    assert s is not old and old.scheduling.slots != 2
    assert engine.scheduler.slot_limit == 2 and engine.intake.sampling is s.sampling
    assert engine.timing.targets is s.targets and s.targets.slo_tpot_ms == 50
    assert ev.type == "settings" and ev.settings == s.wire() and ev.changed == ["slo_tpot_ms", "slots", "temperature"]
    assert engine.hello().settings == s.wire()


def test_the_protocols_settings_table_names_every_setting_in_the_registry():
    doc = (ROOT / "docs" / "protocol.md").read_text()
    table = doc.split("## Settings (", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    assert sorted(named) == sorted(SPECS) and len(named) == len(set(named))
