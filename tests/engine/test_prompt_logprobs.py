"""Prompt log-probabilities as prefill output (vLLM's `prompt_logprobs`, the API's echo with
logprobs), and prompts given as token ids: an engine on the tiny random model stepped by hand,
against transformers' own teacher-forced forward."""
import math

import pytest
import torch

from engine import Engine, EngineConfig, SettingError
from engine import events as ev
from engine.core.request import GenerateRequest
from stepping import Run, assert_clean

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
        "of foolishness, it was the epoch of belief, it was the epoch of incredulity")


@pytest.fixture
def engine(tiny):
    return Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))


def teacher_forced(bundle, ids):
    """transformers' log-softmax at every position of `ids` (row j: the token after j)."""
    with torch.no_grad():
        logits = bundle.model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def prompt_of(run, rid):
    (first,) = [e for e in run.of(ev.Token, rid) if e.index == 0]
    return first.prompt


def check_against_reference(entries, ids, ref, k):
    assert len(entries) == len(ids) and "p_raw" not in entries[0] and entries[0]["token_id"] == ids[0]
    for j in range(1, len(ids)):
        e, row = entries[j], ref[j - 1]
        assert e["token_id"] == ids[j]
        assert math.log(e["p_raw"]) == pytest.approx(row[ids[j]].item(), abs=1e-4)
        assert e["rank"] == int((row > row[ids[j]]).sum()) + 1
        assert [c[0] for c in e["top"]] == torch.topk(row, k).indices.tolist()
        assert [math.log(c[3]) for c in e["top"]] == pytest.approx(torch.topk(row, k).values.tolist(), abs=1e-4)


def test_prompt_logprobs_equal_transformers_teacher_forced_over_chunks(engine, tiny):
    """A 40-odd-token prompt prefilled in 16-token chunks: every prompt token's log-probability
    (the first has none), rank and top-5 are transformers' teacher-forced ones within 1e-4; a
    request beside it that asks for none gets none, and the same greedy output as without."""
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    ref = teacher_forced(tiny, ids)
    engine.apply_settings({"max_batched_tokens": 16})
    run = Run(engine)
    asks = run.add(None, prompt_ids=ids, prompt_logprobs=5, max_new_tokens=3, temperature=0)
    plain = run.add(TEXT, max_new_tokens=3, temperature=0)
    run.until_idle()
    assert len([s for s in run.of(ev.Step) if asks in s.ids and s.prefill_tokens]) >= 3   # chunked
    check_against_reference(prompt_of(run, asks), ids, ref, 5)
    assert "".join(e["text"] for e in prompt_of(run, asks)) == tiny.tokenizer.decode(ids)
    assert prompt_of(run, plain) is None
    assert run.tokens(asks) == run.tokens(plain)   # token ids are the prompt the text tokenizes to
    assert [e.prompt for e in run.of(ev.Token, asks) if e.index > 0] == [None, None]   # only the first carries it
    assert_clean(engine)


def test_a_prefix_cache_hit_is_not_read_by_a_request_that_asks_for_prompt_logprobs(engine, tiny):
    """The same prompt again, once its blocks are cached: without prompt log-probabilities it
    finds them (cached_tokens > 0); asking for them it recomputes every position (cached_tokens
    0), and gets them all, equal to the first time's."""
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    run = Run(engine)
    first = run.add(None, prompt_ids=ids, prompt_logprobs=2, max_new_tokens=1)
    run.until_idle()
    hit = run.add(None, prompt_ids=ids, max_new_tokens=1)
    run.until_idle()
    again = run.add(None, prompt_ids=ids, prompt_logprobs=2, max_new_tokens=1)
    run.until_idle()
    assert run.finished(hit).cached_tokens > 0
    assert run.finished(again).cached_tokens == 0
    assert prompt_of(run, again) == prompt_of(run, first)
    check_against_reference(prompt_of(run, again), ids, teacher_forced(tiny, ids), 2)
    assert_clean(engine)


def test_token_id_prompts_are_taken_as_they_are_or_refused_naming_prompt(engine, tiny):
    vocab = len(tiny.tokenizer)
    seq = engine.new_sequence(GenerateRequest(prompt_ids=[5, 6, 7], max_new_tokens=1))
    assert seq.prompt_ids == [5, 6, 7] and seq.prompt == tiny.tokenizer.decode([5, 6, 7])
    for bad in ([vocab], [-1], [], [1.5], [True], "12"):
        with pytest.raises(SettingError) as e:
            engine.new_sequence(GenerateRequest(prompt_ids=bad, max_new_tokens=1))
        assert e.value.field == "prompt"
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", prompt_ids=[1])
    assert e.value.field == "prompt"
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", prompt_logprobs=21)
    assert e.value.field == "prompt_logprobs"
    assert_clean(engine)


def test_disaggregated_the_prefill_instance_computes_them_and_the_decode_instance_hands_them_out(tiny):
    """Prefill and decode engines (engine/disagg/): the prompt's odds are computed where the prompt
    is, travel with the request in its hand-off (pickled, as down the pipe), and come out with its
    first token on the decode instance, equal to transformers' teacher-forced ones."""
    from test_disagg import Pair
    pair = Pair(tiny)
    ids = tiny.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    seq = pair.p.new_sequence(GenerateRequest(prompt_ids=ids, prompt_logprobs=3, max_new_tokens=2))
    pair.route(pair.p.add(seq))
    pair.until_idle()
    check_against_reference(prompt_of(pair, seq.id), ids, teacher_forced(tiny, ids), 3)
    assert_clean(pair.p, pair.d)
