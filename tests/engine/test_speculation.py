"""Speculative decoding on the tiny random Llama: greedy output equals plain decoding with any
proposer, k, policy, preemption and prefix hits; rejected guesses give their KV back; the
events count what was proposed and accepted; sampling stays exact (chi-square) and seeded
requests reproduce with speculation on or off."""
from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig, SettingError
from engine.model import sampler, speculate
from engine import events as ev
from engine.core.kv_cache import block_hashes
from engine.core.request import GenerateRequest
from engine.core.sequence import SamplingParams
from engine.settings import validate
from helpers import reference
from stepping import Run, assert_clean
from test_engine import LONG, PROMPTS


@pytest.fixture
def engine(tiny):
    return Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))


class Oracle:
    """A proposer that knows generate()'s continuation of each prompt and gets some guesses
    wrong on purpose: every third step its guess at position `wrong` is off by one token, so
    steps accept all, some or none of the guesses."""

    def __init__(self, engine, refs, wrong=1):
        self.engine, self.refs, self.wrong, self.calls = engine, refs, wrong, 0
        self.proposed = 0

    def __call__(self, seq, limit):
        k = min(engine_k(self.engine, seq), limit)
        ref = self.refs[seq.prompt]
        n = len(seq.output_ids)
        guess = list(ref[n:n + k])
        self.calls += 1
        if guess and self.calls % 3 == 0:
            i = min(self.wrong, len(guess) - 1)
            guess[i] = (guess[i] + 1) % len(self.engine.tokenizer)
        self.proposed += len(guess)
        return guess


def engine_k(engine, seq):
    return engine.scheduler.speculator.settings_for(seq)[1]


# Text that repeats itself, so that prompt lookup and suffix tries find something to guess from.
REPEATS = ["the cat sat on the mat. the cat sat on the mat. the cat sat",
           "We hold these truths, we hold these truths, we hold",
           "one two three four one two three four one two three four one",
           "Liberty and justice, liberty and justice, liberty and justice for",
           "He has refused He has refused He has",
           "abc abc abc abc abc abc abc"]


def run_prompts(tiny, engine, settings, oracle=False, max_new=None, prompts=PROMPTS):
    """`prompts` through 4 slots, two steps apart, leaving at different steps; returns the run
    and each prompt's generate() reference."""
    engine.apply_settings(validate(engine.specs, settings))
    lengths = max_new or [6 + 5 * i for i in range(len(prompts))]
    refs = {p: reference(tiny, p, n) for p, n in zip(prompts, lengths)}
    if oracle:
        engine.scheduler.speculator.propose = Oracle(engine, refs)
    run = Run(engine)
    for p, n in zip(prompts, lengths):
        run.add(p, max_new_tokens=n)
        run.step(2)
    run.until_idle()
    return run, refs


def spec_counts(run):
    """(guesses verified, accepted) over the run's steps."""
    counts = [c for e in run.of(ev.Step) for c in (e.spec or {}).values()]
    return sum(c["proposed"] for c in counts), sum(c["accepted"] for c in counts)


CASES = [(m, k, "mixed") for m in ("ngram", "suffix", "oracle") for k in (1, 4, 8)] + \
        [(m, 4, policy) for m in ("ngram", "suffix", "oracle") for policy in ("small-budget", "prefill-first")] + \
        [("oracle", 8, "small-budget"), ("oracle", 4, "static")]
POLICIES = {"mixed": {}, "small-budget": {"max_batched_tokens": 16}, "prefill-first": {"schedule": "prefill-first"},
            "static": {"schedule": "static"}}


@pytest.mark.slow
@pytest.mark.parametrize("method,k,policy", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_greedy_equals_generate_with_speculation(tiny, engine, method, k, policy):
    """Joins and leaves, prompt chunks beside speculating decodes (small-budget), whole prompts
    first (prefill-first), static batches: every output equals generate() run alone."""
    settings = {"speculation": "ngram" if method == "oracle" else method, "spec_tokens": k, **POLICIES[policy]}
    prompts = PROMPTS if method == "oracle" else REPEATS
    run, refs = run_prompts(tiny, engine, settings, oracle=method == "oracle", prompts=prompts)
    for rid, p in zip(run.ids, prompts):
        assert run.tokens(rid) == refs[p], f"{p!r} diverged"
    proposed, accepted = spec_counts(run)
    assert proposed > 0                              # the proposer really guessed
    assert max(c["proposed"] for e in run.of(ev.Step) for c in (e.spec or {}).values()) <= k
    if method == "oracle":
        assert 0 < accepted < proposed              # some guesses kept, some given back
        assert len(run.of(ev.Step)) < sum(len(refs[p]) for p in prompts)   # fewer forwards than tokens
    assert_clean(engine)


@pytest.mark.slow
def test_the_budget_carries_guesses_and_every_decode_keeps_its_token(tiny, engine):
    """A budget of 16 with four decoding requests guessing 8 each: guesses are cut so that no
    step exceeds the budget, and every running decode still gets its token in every step."""
    sched, skipped = engine.scheduler, []
    schedule = sched.schedule

    def checked(kv_cache_on):
        decoding = [s for s in sched.running if s.decoding]
        plan = schedule(kv_cache_on)
        planned = {seg.seq.id for seg in plan.segments}
        skipped.extend(s.id for s in decoding if s.id not in planned and s in sched.running)
        return plan

    sched.schedule = checked
    run, refs = run_prompts(tiny, engine, {"speculation": "ngram", "spec_tokens": 8, "max_batched_tokens": 16},
                            oracle=True, max_new=[40] * len(PROMPTS))
    assert all(step.tokens <= 16 for step in run.of(ev.Step))
    assert any(step.tokens == 16 and step.spec for step in run.of(ev.Step))   # the budget did bind
    assert not skipped                               # nobody's decode waited for another's guesses
    for rid, p in zip(run.ids, PROMPTS):
        assert run.tokens(rid) == refs[p]
    assert_clean(engine)


def test_rejected_guesses_give_their_blocks_back(tiny, engine):
    """Guesses that cross into a new block and are rejected: the block is freed in the same step
    and the block table covers exactly the computed positions."""
    engine.apply_settings({"speculation": "ngram", "spec_tokens": 8})
    prompt = PROMPTS[1]
    ref = reference(tiny, prompt, 30)
    run = Run(engine)
    seq_holder = {}

    def wrong(seq, limit):          # always 8 wrong guesses
        seq_holder["seq"] = seq
        return [(t + 1) % 400 for t in ref[len(seq.output_ids):len(seq.output_ids) + min(8, limit)]]

    engine.scheduler.speculator.propose = wrong
    rid = run.add(prompt, max_new_tokens=30)
    while not run.of(ev.Finished, rid):
        run.step()
        seq = seq_holder.get("seq")
        if seq is not None and seq.slot is not None:
            assert len(seq.block_table) == engine.blocks.pool.blocks_for(seq.num_computed)
            assert engine.blocks.used == len(seq.block_table)
    assert run.tokens(rid) == ref
    steps = [e for e in run.of(ev.Step) if e.spec]
    assert steps and all(s.spec[rid]["accepted"] == 0 for s in steps)
    assert all(t.spec in (None, "corrected") for t in run.of(ev.Token, rid))
    assert_clean(engine)


def test_preemption_with_speculation_recomputes_and_matches(tiny, engine):
    engine.apply_settings({"cache_tokens": 112, "speculation": "ngram", "spec_tokens": 4})
    refs = {p: reference(tiny, p, 30) for p in (PROMPTS[1], PROMPTS[3])}
    engine.scheduler.speculator.propose = Oracle(engine, refs)
    run = Run(engine)
    a = run.add(PROMPTS[1], max_new_tokens=30)
    b = run.add(PROMPTS[3], max_new_tokens=30)
    run.until_idle()
    assert run.of(ev.Preempted)
    assert max(e.cache_blocks_used for e in run.of(ev.Step)) <= 7
    assert run.tokens(a) == refs[PROMPTS[1]] and run.tokens(b) == refs[PROMPTS[3]]
    assert any(e.spec for e in run.of(ev.Step))
    assert_clean(engine)


def test_prefix_hits_with_speculation(tiny, engine):
    engine.apply_settings({"speculation": "suffix", "spec_tokens": 4})
    shared = engine.tokenizer.decode(engine.tokenizer(LONG)["input_ids"][:70])
    prompts = [shared + tail for tail in (" Liberty", " He has refused", " We hold")]
    refs = {p: reference(tiny, p, 12) for p in prompts}
    engine.scheduler.speculator.propose = Oracle(engine, refs, wrong=0)
    run = Run(engine)
    first = run.add(prompts[0], max_new_tokens=12)
    run.until_idle()
    later = [run.add(p, max_new_tokens=12) for p in prompts[1:]]
    run.until_idle()
    assert all(run.finished(r).cached_tokens == 64 for r in later)
    for r, p in zip([first] + later, prompts):
        assert run.tokens(r) == refs[p]
    # every block ever named by a prefix hash holds prompt tokens only, never a guess
    named = {h for p in prompts for h in block_hashes(engine.tokenizer(p)["input_ids"], 16)}
    assert engine.blocks.pool.by_hash and set(engine.blocks.pool.by_hash) <= named
    assert_clean(engine)


def test_events_count_what_was_proposed_and_accepted(tiny, engine):
    run, refs = run_prompts(tiny, engine, {"speculation": "ngram", "spec_tokens": 4}, oracle=True)
    for rid in run.ids:
        steps = [e.spec[rid] for e in run.of(ev.Step) if e.spec and rid in e.spec]
        fin = run.finished(rid)
        assert fin.spec_drafts == len(steps) > 0
        assert fin.spec_draft_tokens == sum(s["proposed"] for s in steps)
        assert fin.spec_accepted_tokens == sum(s["accepted"] for s in steps)
        kinds = [t.spec for t in run.of(ev.Token, rid)]
        # every accepted guess is a token marked so, unless the request ended inside the run
        assert kinds.count("accepted") <= fin.spec_accepted_tokens
        assert kinds.count("bonus") + kinds.count("corrected") <= fin.spec_drafts
        assert kinds[0] is None                     # the first token comes from the prompt's forward
    e = run.of(ev.Step)[-1].to_dict()
    assert "spec" in e and run.of(ev.Token)[-1].to_dict()["spec"] in (None, "accepted", "corrected", "bonus")


def test_seeded_sampling_is_the_same_with_speculation_on_or_off(tiny, engine):
    """With temperature, a seeded request's tokens depend on its seed only: speculating (with
    guesses often right, taken from the plain run) changes none of them."""
    def go(spec, propose=None):
        engine.reset()
        engine.apply_settings({"speculation": spec, "spec_tokens": 4})
        if propose:
            engine.scheduler.speculator.propose = propose
        run = Run(engine)
        ids = [run.add(p, max_new_tokens=24, temperature=0.9, top_p=0.95, seed=11 + i) for i, p in enumerate(PROMPTS[:4])]
        run.until_idle()
        return {p: run.tokens(r) for p, r in zip(PROMPTS, ids)}, run

    plain, _ = go("off")
    oracle = Oracle(engine, plain)
    spec, run = go("ngram", oracle)
    assert spec == plain
    accepted = sum(s["accepted"] for e in run.of(ev.Step) for s in (e.spec or {}).values())
    assert accepted > 0 and oracle.proposed > accepted
    assert_clean(engine)


def chi_square_p(counts, probs):
    """p-value of Pearson's chi-square test of `counts` against `probs` (cells with expectation
    below 5 pooled)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat.double() / 2)), stat, df


@pytest.mark.slow
def test_rejection_sampling_keeps_the_target_distribution(tiny):
    """The tiny model's next-token distribution at temperature 0.8, top-p 0.9, with a guess
    drawn from its likely tokens: over 6000 seeded draws, the first emitted token follows the
    target distribution (chi-square), and so does the token after an accepted guess."""
    model = tiny.model
    ids = tiny.tokenizer(PROMPTS[3], add_special_tokens=False)["input_ids"]
    params = SamplingParams(temperature=0.8, top_p=0.9)

    def target(logits):
        p = torch.softmax(logits / params.temperature, -1)
        return sampler._top_p(p[None], torch.tensor([params.top_p]))[0] / 1.0

    with torch.no_grad():
        base = model(torch.tensor([ids])).logits[0, -1]
    guess = int(torch.argmax(base))     # the most likely token: accepted often enough to test what follows
    with torch.no_grad():
        after = model(torch.tensor([ids + [guess]])).logits[0, -2:]
    p0 = target(after[0])
    p0 = p0 / p0.sum()
    p1 = target(after[1])
    p1 = p1 / p1.sum()
    n = 6000
    first = torch.zeros_like(p0, dtype=torch.float64)
    second = torch.zeros_like(p0, dtype=torch.float64)
    for seed in range(n):
        g = sampler.make_generator(seed, "cpu")
        (run,), failed, _ = sampler.verify(after, [params], [g], [(guess,)])
        assert not failed
        first[run[0]] += 1
        if len(run) == 2:
            second[run[1]] += 1
    p_first, stat1, df1 = chi_square_p(first, p0.double())
    p_second, stat2, df2 = chi_square_p(second, p1.double())
    print(f"chi-square first token: {stat1:.1f} on {df1} df, p={p_first:.3f}; after an accepted guess: "
          f"{stat2:.1f} on {df2} df, p={p_second:.3f}; accepted {int(second.sum())}/{n} (p(g)={p0[guess]:.3f})")
    assert p_first > 0.001 and p_second > 0.001
    assert abs(second.sum() / n - p0[guess]) < 4 * (p0[guess] * (1 - p0[guess]) / n) ** 0.5
    # and a wrong distribution is told apart (the test can fail)
    assert chi_square_p(first, torch.roll(p0.double(), 1))[0] < 1e-6


def test_a_seeded_generator_ends_as_if_it_drew_once_per_token():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 2
    params = SamplingParams(temperature=1.0, seed=3)
    g = sampler.make_generator(3, "cpu")
    (run,), _, _ = sampler.verify(logits, [params], [g], [(1, 2, 3)])
    plain = sampler.make_generator(3, "cpu")
    for _ in run:
        sampler._draw(plain, logits[:1])
    assert torch.equal(g.get_state(), plain.get_state())


def test_ngram_proposer_takes_the_most_recent_longest_match():
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert speculate.ngram_propose(toks, 2) == [7, 8]          # after the most recent "1 2 3"
    assert speculate.ngram_propose([4, 5, 6, 7], 3) == []
    assert speculate.ngram_propose([5, 6, 1, 5, 6], 8) == [1, 5, 6]   # stops at the end


def test_suffix_proposer_learns_from_earlier_requests_and_forgets_them():
    spec = speculate.Speculator()
    spec.configure("suffix", 4)
    params = SamplingParams()
    done = SimpleNamespace(id="a", prompt_ids=[1, 2], output_ids=[10, 11, 12, 13, 14, 15], params=params)
    assert spec.propose(done, 4) == []
    spec.finished(done)
    new = SimpleNamespace(id="b", prompt_ids=[7, 10, 11], output_ids=[], params=params)
    assert spec.propose(new, 4) == [12, 13]       # "10 11" matched: no more guesses than the match is long
    assert spec.propose(new, 1) == [12]
    spec.finished(new)
    longer = SimpleNamespace(id="b2", prompt_ids=[10, 11, 12, 13], output_ids=[], params=params)
    assert spec.propose(longer, 4) == [14, 15]    # a 4-token match, and the remembered output ends there
    spec.finished(longer)
    for i in range(speculate.CACHED_REQUESTS):       # older outputs are evicted, counts and all
        spec.propose(SimpleNamespace(id=f"x{i}", prompt_ids=[1], output_ids=[], params=params), 1)
        spec.finished(SimpleNamespace(id=f"x{i}", prompt_ids=[1], output_ids=[100 + i, 200 + i], params=params))
    assert spec.propose(SimpleNamespace(id="c", prompt_ids=[10, 11], output_ids=[], params=params), 4) == []
    spec.forget()
    assert spec.shared.root == [0, {}]


def test_settings_and_request_overrides_are_validated(engine):
    with pytest.raises(SettingError):
        validate(engine.specs, {"speculation": "medusa"})
    with pytest.raises(SettingError):
        validate(engine.specs, {"spec_tokens": 9})
    for bad in ({"method": "eagle"}, {"num_speculative_tokens": 0}, {"method": "ngram", "draft_model": "x"}, [],
                {"num_speculative_tokens": 9}):
        with pytest.raises(SettingError) as e:     # a field of the request, checked when it is built
            GenerateRequest(prompt="hi", speculative_config=bad)
        assert e.value.field.startswith("speculative_config")
    seq = engine.new_sequence(GenerateRequest(prompt="hi", speculative_config={"method": "suffix",
                                                                               "num_speculative_tokens": 2.0}))
    assert (seq.params.speculation, seq.params.spec_tokens) == ("suffix", 2)
    assert engine.scheduler.speculator.settings_for(seq) == ("suffix", 2)


@pytest.mark.slow
def test_a_request_override_speculates_while_the_setting_is_off(tiny, engine):
    refs = {p: reference(tiny, p, 20) for p in PROMPTS[:2]}
    oracle = Oracle(engine, refs)
    engine.scheduler.speculator.propose = lambda seq, limit: (
        oracle(seq, limit) if engine.scheduler.speculator.settings_for(seq)[0] != "off" else [])
    run = Run(engine)
    on = run.add(PROMPTS[0], max_new_tokens=20, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    off = run.add(PROMPTS[1], max_new_tokens=20)
    run.until_idle()
    assert run.finished(on).spec_drafts > 0 and run.finished(off).spec_drafts == 0
    assert max(s["proposed"] for e in run.of(ev.Step) for s in (e.spec or {}).values()) <= 3
    assert run.tokens(on) == refs[PROMPTS[0]] and run.tokens(off) == refs[PROMPTS[1]]
    assert_clean(engine)


def test_a_step_time_target_counts_guesses_as_decode_rows(tiny, engine):
    """Under `max_step_ms` the scheduler asks the step-cost model for room beside this step's
    decode rows, guesses included: the very count the step recorder reports to that model
    (`step.decode_tokens`), so what it fits and what it is asked agree."""
    asked = []
    engine.scheduler.step_cost.prefill_tokens = lambda target_s, rows: asked.append(rows) or 16
    engine.apply_settings(validate(engine.specs, {"speculation": "ngram", "spec_tokens": 4, "max_step_ms": 50}))
    refs = {PROMPTS[0]: reference(tiny, PROMPTS[0], 24)}
    engine.scheduler.speculator.propose = Oracle(engine, refs)
    run = Run(engine)
    rid = run.add(PROMPTS[0], max_new_tokens=24)
    run.until_idle()
    assert run.tokens(rid) == refs[PROMPTS[0]]
    steps = run.of(ev.Step)
    assert any(e.spec for e in steps)
    assert asked == [e.decode_tokens for e in steps]
    assert_clean(engine)


def test_the_roofline_counts_logits_at_every_guess(engine):
    roof = engine.roofline
    with_guesses = SimpleNamespace(start=10, n=4, logits=True, draft=(1, 2, 3))
    assert roof.predict_segments([with_guesses]) == roof.predict([(10, 4, 4)])
    assert roof.cost([(10, 4, 4)])[0] - roof.cost([(10, 4, True)])[0] == 3 * 2 * roof.head_params


def test_a_forward_that_gives_several_tokens_is_one_inter_token_gap(tiny, engine):
    """As vLLM counts inter-token latency: one gap per forward that gave a request tokens, not a
    zero gap between the tokens one verifying forward gave out together."""
    run, refs = run_prompts(tiny, engine, {"speculation": "ngram", "spec_tokens": 4}, oracle=True)
    forwards = {rid: len({t.sampled for t in run.of(ev.Token, rid)}) for rid in run.ids}
    tokens = sum(len(run.of(ev.Token, rid)) for rid in run.ids)
    assert tokens > sum(forwards.values())          # some forwards did give several tokens
    gaps = engine.timing.stats.itl
    assert len(gaps) == sum(n - 1 for n in forwards.values())
    assert min(gaps) > 0


def odds_by_position(run, rid):
    """Each token's odds as its event carries them: (id, p, p_raw, [(candidate, p, p_raw)])."""
    return [(e.token_id, e.p, e.p_raw, [(i, p, raw) for i, _, p, raw in e.top]) for e in run.of(ev.Token, rid)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_accepted_tokens_carry_the_odds_plain_decoding_gives(tiny, engine, temperature):
    """Greedy and seeded sampling, with an oracle that gets some guesses wrong: every token of the
    speculating run has the same odds (its chosen token's probabilities, the candidates and
    theirs) as the same token of a plain run, accepted guesses included, since each comes from
    its own row of logits; a corrected token names the guess it replaced, with that guess's
    probability at its position (greedy: 0 as drawn, what the plain run's logits give it raw)."""
    prompts = PROMPTS[:3]
    kw = dict(max_new_tokens=20, temperature=temperature, seed=3, ignore_eos=True)
    refs = {p: reference(tiny, p, 20) for p in prompts}
    plain, spec = Run(engine), None
    for p in prompts:
        plain.add(p, **kw)
    plain.until_idle()
    other = Engine(tiny, EngineConfig(slots=4, kv_tokens=4096, block_size=16, max_context=512))
    other.apply_settings(validate(other.specs, {"speculation": "ngram", "spec_tokens": 4}))
    truth = {p: plain.tokens(rid) for p, rid in zip(prompts, plain.ids)}
    other.scheduler.speculator.propose = Oracle(other, truth if temperature else refs)
    spec = Run(other)
    for p in prompts:
        spec.add(p, **kw)
    spec.until_idle()
    kinds = [e.spec for e in spec.of(ev.Token)]
    assert "accepted" in kinds and "corrected" in kinds
    for a, b in zip(plain.ids, spec.ids):
        assert spec.tokens(b) == plain.tokens(a)                  # seeded: the same tokens either way
        for (ta, pa, ra, top_a), (tb, pb, rb, top_b) in zip(odds_by_position(plain, a), odds_by_position(spec, b)):
            assert ta == tb and pa == pytest.approx(pb, abs=1e-5) and ra == pytest.approx(rb, abs=1e-5)
            assert [i for i, _, _ in top_a] == [i for i, _, _ in top_b]
            assert [x for _, x, _ in top_a] == pytest.approx([x for _, x, _ in top_b], abs=1e-5)
            assert [x for _, _, x in top_a] == pytest.approx([x for _, _, x in top_b], abs=1e-5)
    corrected = [e for e in spec.of(ev.Token) if e.spec == "corrected"]
    assert all(e.rejected is not None and e.rejected[0] != e.token_id for e in corrected)
    assert all(e.rejected is None for e in spec.of(ev.Token) if e.spec != "corrected")
    for e in corrected:
        guess, _, p_guess, raw_guess = e.rejected
        assert 0.0 < raw_guess < 1.0 and 0.0 <= p_guess < 1.0
        if temperature == 0:
            assert p_guess == 0.0 and raw_guess <= e.p_raw       # greedy rejects all but the argmax
