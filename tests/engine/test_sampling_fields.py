"""The request registry's sampling fields in the batched sampler (engine/model/sampler.py), each
against a case computed by hand on fixed logits; a row that asks for none is sampled as before."""
import pytest
import torch

from engine import GenerateRequest, SettingError
from engine import events as ev
from engine.core.sequence import SamplingParams
from engine.model import sampler

# one row's distribution at temperature 1: 0.5, 0.3, 0.15, 0.05 and (all but) nothing
PROBS = [0.5, 0.3, 0.15, 0.05, 0.0]
LOGITS = torch.tensor(PROBS).clamp(min=1e-12).log()


def chances(logits, params, want=5):
    """(tokens, each row's Chance) of one batched pass, unseeded."""
    tokens, odds = sampler.sample(logits, params, [None] * len(params), [want] * len(params))
    return tokens, [odds.chance(i) for i in range(len(params))]


def drawn(chance):
    """{token id: its probability as drawn} of a row's candidates."""
    return {i: p for i, p, _ in chance.top}


def test_min_p_drops_the_tokens_under_its_share_of_the_most_likely_and_renormalises():
    # min_p 0.2: the floor is 0.2 x 0.5 = 0.1, so 0.05 goes; 0.5, 0.3, 0.15 renormalised by 0.95.
    # Then top_p 0.8 over those: 0.526 + 0.316 reaches it, so 0.15 goes too: 0.5 / 0.8 and 0.3 / 0.8.
    rows = [SamplingParams(temperature=1.0, min_p=0.2), SamplingParams(temperature=1.0),
            SamplingParams(temperature=1.0, min_p=0.2, top_p=0.8), SamplingParams(min_p=0.9)]
    _, (floor, plain, both, greedy) = chances(LOGITS.repeat(4, 1), rows)
    assert drawn(floor)[3] == 0 and all(abs(drawn(floor)[i] - PROBS[i] / 0.95) < 1e-6 for i in range(3))
    assert all(abs(drawn(plain)[i] - PROBS[i]) < 1e-6 for i in range(4))    # a row without: unchanged
    assert abs(drawn(both)[0] - 0.625) < 1e-6 and abs(drawn(both)[1] - 0.375) < 1e-6 and drawn(both)[2] == 0
    assert greedy.top[0][:2] == (0, 1.0)                                      # greedy: the argmax still
    for ch in (floor, plain, both):                                           # the model's own: raw
        assert all(abs(raw - PROBS[i]) < 1e-6 for i, _, raw in ch.top)
    torch.manual_seed(5)
    got = sampler.sample(LOGITS.repeat(3000, 1), [rows[0]] * 3000, [None] * 3000)
    assert 3 not in got and abs(got.count(2) / 3000 - 0.15 / 0.95) < 0.03


def expected(logits):
    """The distribution at temperature 1 of `logits` as changed by hand."""
    return torch.softmax(torch.tensor(logits, dtype=torch.float64), -1).tolist()


# fixed logits over a vocabulary of 5, a prompt holding token 3, an output holding 1 twice and 2 once
X = [2.0, 1.0, -1.0, 0.5, 0.0]
SEEN = ([3], [1, 1, 2])


@pytest.mark.parametrize("asks, changed", [
    # repetition 2 on tokens 1, 2 (output) and 3 (prompt): 1.0 / 2, -1.0 * 2, 0.5 / 2
    (dict(repetition_penalty=2.0), [2.0, 0.5, -2.0, 0.25, 0.0]),
    # frequency 0.5 times the output's counts (1: twice, 2: once); the prompt's token 3 untouched
    (dict(frequency_penalty=0.5), [2.0, 0.0, -1.5, 0.5, 0.0]),
    # presence 0.3 once for each token of the output
    (dict(presence_penalty=0.3), [2.0, 0.7, -1.3, 0.5, 0.0]),
    # a negative presence penalty favours them
    (dict(presence_penalty=-1.0), [2.0, 2.0, 0.0, 0.5, 0.0]),
    # all three: repetition first, then the subtractions (vLLM's order)
    (dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.3), [2.0, -0.8, -2.8, 0.25, 0.0]),
    # a logit bias, before the penalties: token 0 +1, token 4 -100 (never chosen)
    (dict(logit_bias={0: 1.0, 4: -100.0}, presence_penalty=0.3), [3.0, 0.7, -1.3, 0.5, -100.0]),
])
def test_each_change_to_the_logits_is_the_hand_computed_one(asks, changed):
    logits = torch.tensor([X, X])
    rows = [SamplingParams(temperature=1.0, **asks), SamplingParams(temperature=1.0)]
    _, (mine, plain) = sample_seen(logits, rows, [SEEN, SEEN])
    want = expected(changed)
    assert all(abs(p - want[i]) < 1e-6 for i, p, _ in mine.top)
    own = torch.softmax(torch.tensor(X, dtype=torch.float64), -1).tolist()
    for ch in (mine, plain):   # the model's own probabilities are raw
        assert all(abs(raw - own[i]) < 1e-6 for i, _, raw in ch.top)
    assert all(abs(p - own[i]) < 1e-6 for i, p, _ in plain.top)   # the row beside it: unchanged


def sample_seen(logits, params, seen, want=5):
    tokens, odds = sampler.sample(logits, params, [None] * len(params), [want] * len(params), seen=seen)
    return tokens, [odds.chance(i) for i in range(len(params))]


def test_a_greedy_row_takes_the_argmax_of_its_changed_logits():
    logits = torch.tensor([X] * 3)
    rows = [SamplingParams(logit_bias={0: -100.0}), SamplingParams(presence_penalty=2.0),
            SamplingParams(repetition_penalty=1.5)]
    tokens, got = sample_seen(logits, rows, [SEEN, ([], [0]), ([0], [])])
    # 0 banned: 1.0 is next; 0 seen once: 2.0 - 2 = 0 < 1.0; 0 in the prompt: 2.0 / 1.5 = 1.33 still first
    assert tokens == [1, 1, 0]
    assert [ch.p for ch in got] == [1.0, 1.0, 1.0] and all(ch.top[0][0] == 0 for ch in got)   # by the model's own


def test_logit_bias_minus_100_is_never_drawn():
    torch.manual_seed(6)
    got = sampler.sample(LOGITS.repeat(3000, 1), [SamplingParams(temperature=1.5, logit_bias={0: -100.0})] * 3000,
                         [None] * 3000)
    assert set(got) == {1, 2, 3}   # not 0, banned; not 4, whose probability is 0 already


def test_rows_that_ask_for_no_change_are_sampled_from_the_logits_as_they_are():
    logits = torch.tensor([X, X])
    plain = [SamplingParams(temperature=1.0, seed=1), SamplingParams()]
    assert sampler._changed(logits, plain, None)[0] is logits    # no copy, nothing done
    asked = plain + [SamplingParams(temperature=1.0, seed=2, frequency_penalty=1.0)]
    alone = sampler.sample(logits, plain, [sampler.make_generator(1, "cpu"), None])
    beside = sampler.sample(torch.tensor([X] * 3), asked, [sampler.make_generator(1, "cpu"), None,
                                                           sampler.make_generator(2, "cpu")], seen=[None, None, SEEN])
    assert beside[:2] == alone


def test_speculative_rows_see_the_guesses_before_them():
    """A guess verified in the same forward counts as output for the rows after it: greedy with
    presence 1.5, token 0 (2.0) is taken, then 1 (1.9) beats 0's 2.0 - 1.5."""
    row = [2.0, 1.9, 0.0, 0.0, 0.0]
    runs, failed, _ = sampler.verify(torch.tensor([row, row]), [SamplingParams(presence_penalty=1.5)], [None],
                                     [[0]], seen=[([], [])])
    assert failed == {} and runs == [[0, 1]]


PROMPT = "We hold these truths to be self-evident, that all men"


def by_hand(logits, prompt, output, repetition, frequency, presence):
    """The penalties applied one token at a time, from their definitions."""
    out = logits.clone()
    for t in set(prompt) | set(output):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(output):
        out[t] -= frequency * output.count(t) + presence
    return out


def test_the_engine_penalises_what_the_request_has_seen(driver, tiny):
    """Greedy through the engine with all three penalties: each token is the argmax of the
    model's logits (teacher-forced, transformers) penalised by hand over the prompt and the
    tokens before it; and somewhere the penalties changed which token that is."""
    asks = dict(repetition_penalty=1.2, frequency_penalty=-1.0, presence_penalty=-2.0)   # rewards: it repeats
    handle = driver.submit(GenerateRequest(prompt=PROMPT, max_new_tokens=16, temperature=0, ignore_eos=True,
                                           stream=True, **asks))
    out = [e.token_id for e in handle.events(timeout=60) if isinstance(e, ev.Token)]
    prompt = tiny.tokenizer(PROMPT, add_special_tokens=False).input_ids
    assert len(out) == 16
    changed = 0
    with torch.no_grad():
        for j, tok in enumerate(out):
            logits = tiny.model(torch.tensor([prompt + out[:j]])).logits[0, -1].double()
            assert tok == int(torch.argmax(by_hand(logits, prompt, out[:j], *asks.values()))), j
            changed += tok != int(torch.argmax(logits))
    assert changed > 0


@pytest.mark.parametrize("asks, field", [(dict(logit_bias={"400": 5}), "logit_bias"),
                                         (dict(stop_token_ids=[3, 400]), "stop_token_ids")])
def test_a_token_id_beyond_the_vocabulary_is_refused_and_nothing_is_queued(driver, asks, field):
    eng = driver.engine
    assert len(eng.tokenizer) == 400
    with pytest.raises(SettingError) as e:
        driver.submit(GenerateRequest(prompt="hi", **asks))
    assert e.value.field == field and "vocabulary" in e.value.message
    assert driver._inbox.empty() and eng.in_flight == 0 and eng.blocks.used == 0


@pytest.mark.parametrize("asks, field", [
    (dict(logit_bias={"5": 101}), "logit_bias"), (dict(logit_bias={"x": 1}), "logit_bias"),
    (dict(logit_bias={"5": float("nan")}), "logit_bias"), (dict(logit_bias=[5]), "logit_bias"),
    (dict(logit_bias={"-1": 1}), "logit_bias"), (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(presence_penalty="a"), "presence_penalty"), (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(min_p=1.5), "min_p"), (dict(stop_token_ids=[-1]), "stop_token_ids"),
    (dict(stop_token_ids="5"), "stop_token_ids"), (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop_token_ids=list(range(301))), "stop_token_ids"),
])
def test_a_bad_value_is_refused_naming_its_field(asks, field):
    with pytest.raises(SettingError) as e:
        GenerateRequest(prompt="hi", **asks)
    assert e.value.field == field
