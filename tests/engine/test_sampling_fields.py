"""The request registry's sampling fields in the batched sampler (engine/model/sampler.py), each
against a case computed by hand on fixed logits; a row that asks for none is sampled as before."""
import torch

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
