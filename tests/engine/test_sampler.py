"""The batched sampler: seeded rows reproduce whatever shares their batch, and draws follow
the distribution temperature and top-p define."""
import torch

from engine import sampler
from engine.sequence import SamplingParams


def draw(logits, params, seeds):
    return sampler.sample(logits, params, [sampler.make_generator(s, "cpu") for s in seeds])


def test_a_seeded_row_is_the_same_alone_or_in_any_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 500) * 2
    mine = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    alone = [draw(logits[:1], [mine], [7])[0] for _ in range(3)]
    assert len(set(alone)) == 1                            # same seed, same logits: same token
    others = [SamplingParams(temperature=t, top_p=p) for t, p in ((0.0, 1.0), (1.5, 1.0), (1.0, 0.5), (0.7, 0.95))]
    for k in range(1, 5):                                  # batched with greedy, hot, top-p and seeded rows
        batch = [mine] + others[:k]
        got = draw(torch.cat([logits[:1], logits[1:k + 1]]), batch, [7] + [None, None, 3, None][:k])
        assert got[0] == alone[0]


def test_draws_follow_temperature_and_top_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = probs.clamp(min=1e-12).log().repeat(4000, 1)
    torch.manual_seed(1)
    got = torch.tensor(sampler.sample(logits, [SamplingParams(temperature=1.0)] * 4000, [None] * 4000))
    freq = torch.bincount(got, minlength=5).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03) and freq[4] == 0
    # top_p 0.7: the nucleus is {0, 1} (0.5 + 0.3 >= 0.7), renormalised to 0.625 / 0.375
    got = torch.tensor(sampler.sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)] * 4000, [None] * 4000))
    freq = torch.bincount(got, minlength=5).float() / 4000
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.625) < 0.03
    # a low temperature sharpens towards the most likely token
    got = sampler.sample(logits[:2000], [SamplingParams(temperature=0.2)] * 2000, [None] * 2000)
    assert got.count(0) / 2000 > 0.9


def test_top_p_with_a_flat_distribution_falls_back_to_a_full_sort():
    """Past CANDIDATES tokens the nucleus is still exact: a flat 5000-token distribution with
    top_p 0.5 keeps the top half, never the rest."""
    logits = torch.zeros(1, 5000)
    logits[0, :2500] = 1e-3                                # the top half is (barely) more likely
    torch.manual_seed(2)
    got = sampler.sample(logits.repeat(300, 1), [SamplingParams(temperature=1.0, top_p=0.5)] * 300, [None] * 300)
    assert max(got) < 2500 and len(set(got)) > 200
