"""The batched sampler: seeded rows reproduce whatever shares their batch, and draws follow
the distribution temperature and top-p define."""
import torch

from engine.model import sampler
from engine.core.sequence import SamplingParams


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


# ------------------------------------------------------------------ the odds (protocol 14)
MIX = [SamplingParams(), SamplingParams(temperature=0.7), SamplingParams(temperature=1.5),
       SamplingParams(temperature=1.0, top_p=0.5), SamplingParams(temperature=0.3, top_p=0.9, seed=5)]


def odds(logits, params, want=5, seeds=None):
    """(tokens, each row's Chance) of one batched pass."""
    seeds = seeds or [p.seed for p in params]
    tokens, got = sampler.sample(logits, params, [sampler.make_generator(s, "cpu") for s in seeds], [want] * len(params))
    return tokens, [got.chance(i) for i in range(len(params))]


def transformed(logits, p):
    """The distribution a row is drawn from, computed here from its definition: softmax at the
    temperature, the nucleus kept (the smallest most-likely set reaching top_p), renormalised."""
    if p.temperature == 0:
        return torch.nn.functional.one_hot(torch.argmax(logits), logits.shape[-1]).double()
    probs = torch.softmax(logits.double() / p.temperature, -1)
    top, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(top, 0) - top < p.top_p
    out = torch.zeros_like(probs).scatter_(0, order, top * keep)
    return out / out.sum()


def test_greedy_takes_the_top_candidate_even_on_an_exact_tie():
    torch.manual_seed(3)
    logits = torch.randn(64, 300) * 3
    logits[5, [17, 201, 250]] = logits[5].max() + 1.0          # a three-way tie for the most likely token
    logits[9, :] = 0.0                                          # every token tied
    tokens, chances = odds(logits, [SamplingParams()] * 64)
    for row, (tok, ch) in enumerate(zip(tokens, chances)):
        assert tok == int(torch.argmax(logits[row]))            # the choice is argmax, as generate()'s
        assert ch.top[0][0] == tok and ch.top[0][1] == 1.0 == ch.p
        assert all(p == 0.0 for _, p, _ in ch.top[1:])          # greedy puts everything on it
        assert ch.top[0][2] == max(raw for _, _, raw in ch.top)
    assert tokens[5] == 17 and {i for i, _, _ in chances[5].top[:3]} == {17, 201, 250}


def test_probabilities_are_at_most_one_and_the_top_sums_to_at_most_one():
    torch.manual_seed(4)
    logits = torch.randn(len(MIX) * 8, 400) * 4
    tokens, chances = odds(logits, MIX * 8, want=20)
    for row, (tok, ch, p) in enumerate(zip(tokens, chances, MIX * 8)):
        assert len(ch.top) == 20
        # (up to float32's rounding: the logits and their softmax are float32)
        for _, q, raw in ch.top + [(tok, ch.p, ch.p_raw)]:
            assert 0.0 <= q <= 1.0 + 1e-6 and 0.0 < raw <= 1.0 + 1e-6
        assert sum(q for _, q, _ in ch.top) <= 1.0 + 1e-6 and sum(r for _, _, r in ch.top) <= 1.0 + 1e-6
        raws = [r for _, _, r in ch.top]
        assert raws == sorted(raws, reverse=True)               # most likely first, by the model's own
        if p.temperature > 0 and p.top_p == 1.0:                # a temperature keeps the order
            assert [q for _, q, _ in ch.top] == sorted([q for _, q, _ in ch.top], reverse=True)
        # what was reported is what the definition gives
        want = transformed(logits[row], p)
        own = torch.softmax(logits[row].double(), -1)
        for i, q, raw in ch.top + [(tok, ch.p, ch.p_raw)]:
            assert abs(q - float(want[i])) < 1e-5 and abs(raw - float(own[i])) < 1e-6
        assert ch.p > 0                                         # the chosen token could be chosen


def test_draws_follow_the_reported_transformed_probabilities():
    """For fixed logits, 6000 seeded draws of each row kind: the tokens' frequencies follow the
    probabilities the odds report for that kind (chi-square), and not the model's own ones
    (the transform is really applied, so the test can fail)."""
    from test_speculation import chi_square_p
    torch.manual_seed(5)
    base = torch.randn(1, 40)        # flat enough that top-p 0.5 keeps several tokens
    n = 6000
    for p in MIX[1:4]:
        tokens, chances = odds(base.repeat(n, 1), [p] * n, want=40, seeds=list(range(n)))
        counts = torch.bincount(torch.tensor(tokens), minlength=40).double()
        expected = torch.zeros(40, dtype=torch.float64)
        for i, q, _ in chances[0].top:
            expected[i] = q
        raw = torch.zeros(40, dtype=torch.float64)
        for i, _, r in chances[0].top:
            raw[i] = r
        assert abs(float(expected.sum()) - 1) < 1e-6           # all 40 tokens listed: the whole distribution
        p_value, stat, df = chi_square_p(counts, expected)
        assert p_value > 0.001, (p, stat, df)
        assert chi_square_p(counts, raw)[0] < 1e-6, p          # T=1 without top-p would not explain them
        assert counts[expected == 0].sum() == 0                # nothing outside the nucleus


def test_odds_of_a_row_do_not_depend_on_its_batch_and_off_means_none():
    torch.manual_seed(6)
    logits = torch.randn(5, 300) * 2
    _, alone = odds(logits[:1], MIX[3:4], seeds=[11])
    _, batch = odds(logits, [MIX[3]] + MIX[:4], seeds=[11, None, None, None, None])
    assert alone[0] == batch[0]
    tokens, got = sampler.sample(logits, MIX, [None] * 5, [None, 3, None, 0, 5])
    assert [got.chance(i) is None for i in range(5)] == [True, False, True, False, False]
    assert len(got.chance(1).top) == 3 and got.chance(3).top == [] and got.chance(3).p_raw > 0


def test_token_events_carry_the_odds_and_the_wire_rounds_them(tiny):
    """Through the engine: greedy's every token is its first candidate, with the candidates' text;
    an API request asking 12 gets them on its events, the wire carries the page's first SHOWN,
    rounded; with the page's candidates off only the asking request's tokens have odds."""
    from engine import Engine, EngineConfig, events
    from engine.core.request import GenerateRequest
    eng = Engine(tiny, EngineConfig(slots=4, kv_tokens=2048, max_context=256))
    out = []
    plain = eng.new_sequence(GenerateRequest(prompt="We hold these truths", max_new_tokens=6, temperature=0))
    asks = eng.new_sequence(GenerateRequest(prompt="Liberty", max_new_tokens=6, temperature=0.9, seed=2, logprobs=12))
    for seq in (plain, asks):
        out += eng.add(seq)
    while eng.scheduler.running or eng.scheduler.waiting:
        out += eng.step()
    tokens = [e for e in out if isinstance(e, events.Token)]
    assert len(tokens) == 12
    for e in tokens:
        assert len(e.top) == (12 if e.id == asks.id else events.SHOWN)
        assert [text for _, text, _, _ in e.top] == [tiny.tokenizer.decode([i]) for i, _, _, _ in e.top]
        if e.id == plain.id:
            assert e.top[0][0] == e.token_id and e.p == 1.0
        wire = e.to_dict()
        assert len(wire["top"]) == events.SHOWN and wire["p_raw"] == events.wire_prob(e.p_raw)
        assert wire["top"][0] == [e.top[0][0], e.top[0][1], events.wire_prob(e.top[0][2]), events.wire_prob(e.top[0][3])]
        # three significant digits, a tiny probability too (to 3 decimals it was 0)
        assert all(raw == 0 or abs(raw - sent) <= 0.005 * raw for (*_, raw), (*_, sent) in zip(e.top, wire["top"]))
        assert wire["t"] == round(e.t, 6) and wire["sample_s"] == round(e.sample_s, 6)
    eng.candidates = lambda: False
    again = [eng.new_sequence(GenerateRequest(prompt="He has refused", max_new_tokens=3, temperature=0, logprobs=l))
             for l in (None, 0)]
    out = []
    for seq in again:
        out += eng.add(seq)
    while eng.scheduler.running or eng.scheduler.waiting:
        out += eng.step()
    by = {seq.id: [e for e in out if isinstance(e, events.Token) and e.id == seq.id] for seq in again}
    assert all(e.p is None and e.top is None for e in by[again[0].id])
    assert all(e.p == 1.0 and e.top == [] and 0 < e.p_raw <= 1 for e in by[again[1].id])


def test_a_row_that_fails_costs_the_others_neither_their_tokens_nor_their_odds():
    """A row whose generator raises: the batched pass falls back to one row at a time, and the
    rows that sampled keep the odds they get alone (the fallback's odds are joined, laid out to
    the batch's widest top-k)."""
    class Broken:
        def get_state(self):
            return None

        def set_state(self, state):
            pass
    torch.manual_seed(8)
    logits = torch.randn(3, 300) * 2
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, seed=2)]
    gens = [None, Broken(), sampler.make_generator(2, "cpu")]
    try:
        sampler.sample(logits, params, gens, [5, 5, 3])
        raise AssertionError("the broken row did not raise")
    except sampler.RowsFailed as e:
        assert set(e.failed) == {1} and e.tokens[1] is None and e.odds.chance(1) is not None
        got = e
    for row, want in ((0, 5), (2, 3)):
        tok, alone = sampler.sample(logits[row:row + 1], params[row:row + 1],
                                    [sampler.make_generator(params[row].seed, "cpu")], [want])
        assert got.tokens[row] == tok[0] and got.odds.chance(row) == alone.chance(0)
