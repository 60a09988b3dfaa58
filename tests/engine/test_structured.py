"""Structured output in the engine (engine/model/structured.py): a constraint checked when the
request is built, a token mask in the sampler (after bias and penalties, so `p` is after it), a
finished grammar ending its request, and constrained rows beside unconstrained ones in one batch."""
import json
import re

import jsonschema
import pytest
import torch

from engine import Engine, EngineConfig, GenerateRequest, SettingError
from engine.core.sequence import SamplingParams
from engine.model import sampler, structured
from helpers import reference
from stepping import Pair, Run

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                                           "size": {"enum": ["S", "M", "L"]}},
          "required": ["name", "ok", "size"], "additionalProperties": False}


def text(run, bundle, rid):
    return bundle.tokenizer.decode(run.tokens(rid), skip_special_tokens=True)


def test_a_mask_rules_tokens_out_before_the_draw_and_p_is_after_it():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]]).repeat(2, 1)
    allowed = torch.tensor([False, True, False, True])
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0)]
    torch.manual_seed(0)
    got = sampler.sample(logits.repeat(200, 1), params * 200, [None] * 400, masks=[allowed, None] * 200)
    assert set(got[::2]) == {1, 3} and len(set(got[1::2])) > 2     # the unmasked rows: anything
    tokens, odds = sampler.sample(logits, params[:1], [None], [4], masks=[allowed])
    p = {i: drawn for i, drawn, _ in odds.chance(0).top}
    e1, e3 = torch.tensor(1.0).exp(), torch.tensor(0.0).exp()
    assert p[0] == 0 and p[2] == 0 and abs(p[1] - float(e1 / (e1 + e3))) < 1e-6
    raw = {i: r for i, _, r in odds.chance(0).top}
    assert abs(raw[0] - float(torch.softmax(logits[0], -1)[0])) < 1e-6   # the model's own, unmasked
    greedy = sampler.sample(logits[:1], [SamplingParams()], [None], masks=[allowed])
    assert greedy == [1]


@pytest.mark.parametrize("value, says", [
    ({"json": {"type": "nope"}}, "json does not compile"), ({"regex": "[a-"}, "regex does not compile"),
    ({"choice": []}, "choice must be"), ({"grammar": "start: ("}, "grammar does not compile"),
    ({"json": {"type": "object"}, "regex": "a"}, "exactly one"), ({"structural_tag": "x"}, "unsupported key"),
    ("json", "must be an object"), ({"json": "{not json"}, "not valid JSON"), ({"json": True}, "JSON schema"),
    ({"json_object": "yes"}, "must be true"), ({"regex": "a", "disable_any_whitespace": 1}, "true or false")])
def test_a_constraint_that_does_not_compile_is_refused_when_the_request_is_built(value, says):
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", structured_outputs=value)
    assert e.value.field == "structured_outputs" and says in str(e.value)


def test_constrained_rows_beside_unconstrained_ones_in_one_batch(tiny):
    """Greedy and seeded requests without a constraint give what they give alone (the mask is
    their neighbours' only); the constrained ones follow their schema, regex and choice, and a
    finished grammar ends its request with "stop"."""
    prompt = "We hold these truths to be self-evident"
    run = Run(Engine(tiny, EngineConfig(slots=8)))
    seeded_alone = run.add(prompt, max_new_tokens=12, temperature=1.0, seed=4, ignore_eos=True)
    run.until_idle()
    rids = {"schema": run.add(prompt, max_new_tokens=60,
                              structured_outputs={"json": SCHEMA, "disable_any_whitespace": True}),
            "plain": run.add(prompt, max_new_tokens=12, ignore_eos=True),
            "regex": run.add(prompt, max_new_tokens=40, temperature=1.0, seed=2,
                             structured_outputs={"regex": "[0-9]{3}-[a-z]{2,5}"}),
            "seeded": run.add(prompt, max_new_tokens=12, temperature=1.0, seed=4, ignore_eos=True),
            "choice": run.add(prompt, max_new_tokens=10, temperature=1.0, structured_outputs={"choice": ["yes", "no"]})}
    run.step()
    assert len(run.engine.scheduler.running) == 5          # one batch
    run.until_idle()
    jsonschema.validate(json.loads(text(run, tiny, rids["schema"])), SCHEMA)
    assert re.fullmatch("[0-9]{3}-[a-z]{2,5}", text(run, tiny, rids["regex"]))
    assert text(run, tiny, rids["choice"]) in ("yes", "no")
    assert {run.finished(rids[k]).reason for k in ("schema", "regex", "choice")} == {"stop"}
    plain = run.tokens(rids["plain"])
    assert plain == reference(tiny, prompt, 12) and run.tokens(rids["seeded"]) == run.tokens(seeded_alone)
    # the same greedy request unconstrained writes no JSON: the schema's text was the mask's doing
    assert not tiny.tokenizer.decode(plain).lstrip().startswith("{")
    assert run.engine.blocks.used == 0 and run.engine.in_flight == 0


def test_the_tokenizer_is_converted_once_per_model(tiny):
    grammars = structured.Grammars(tiny.tokenizer)
    grammars.matcher({"regex": "a+"})
    converted = grammars._ll_tokenizer
    grammars.matcher({"choice": ["x"]})
    assert converted is not None and grammars._ll_tokenizer is converted


def test_a_matcher_that_refuses_a_token_fails_its_request_alone(tiny):
    run = Run(Engine(tiny, EngineConfig(slots=4)))
    bad = run.add("hello", max_new_tokens=8, structured_outputs={"regex": "[a-z]+"})
    good = run.add("hello", max_new_tokens=8, ignore_eos=True)

    def refuse(token):
        raise structured.GrammarError(f"token {token} refused")
    run.engine._by_id[bad].grammar.accept = refuse
    run.until_idle()
    assert run.finished(bad).reason == "error" and run.finished(good).reason == "length"
    assert run.engine.blocks.used == 0 and run.engine.in_flight == 0


def test_a_constrained_request_handed_to_a_decode_instance_keeps_its_grammar(tiny):
    """Disaggregated, the matcher (this process's object) does not travel: the decode instance
    makes it anew over the output so far."""
    config = EngineConfig(slots=2, kv_tokens=2048, block_size=16, max_context=512)
    pair = Pair(tiny, config, config, prompt="We hold these truths")
    rid = pair.add(max_new_tokens=40, temperature=1.0, seed=9, structured_outputs={"regex": "[0-9]{2}-[a-z]{3,6}"})
    pair.until_idle()
    assert re.fullmatch("[0-9]{2}-[a-z]{3,6}", text(pair, tiny, rid)) and pair.finished(rid).reason == "stop"
    assert pair.d.blocks.used == 0 and pair.p.blocks.used == 0
