"""Speculative decoding on the page (issue 20), in Chromium on the in-process tiny app: the
`speculative` preset's guesses on the timeline are the engine's (a filled cell per token whose
`spec` is "accepted", a hollow one per guess a `step` rejected), a forward's hover gives the
tokens it gave out and its guesses, the headline's acceptance figures are the step events'
over its window, the request panel gives the request's `finished` counts, the diagnosis says
whether speculation helped or hurt from measured forwards, and the comparison runs one user and
many with speculation off and on, reporting each one's tokens/s and guesses accepted; readable
on a laptop, a projector (and presenting) and a phone. The tiny model's guesses come from a
proposer that knows its next tokens (`guessing`): n-gram lookup finds almost nothing in its
output to guess from."""
from collections import Counter
import itertools
import math

import pytest
import torch

from helpers import collect, page_module
from test_layout_browser import assert_readable
from test_slo_roofline_browser import events, page_at


@pytest.fixture
def guessing(live, tiny):
    """The tiny app with a proposer that knows what the model will say. The tiny random model's
    output hardly repeats its prompt, so n-gram lookup finds almost nothing to guess (in the
    `speculative` preset: 2 drafts, none accepted). Here the guesses are the model's own greedy
    continuation with one guess off by a token on every third call, so forwards accept all,
    some or none of theirs; the engine verifies them as ever, and its events say what it did."""
    spec, calls = live.driver.engine.scheduler.speculator, itertools.count(1)

    def propose(seq, limit):
        method, k = spec.settings_for(seq)
        k = min(k, limit)
        if method == "off" or k <= 0:
            return []
        ids = torch.tensor([seq.prompt_ids + seq.output_ids])
        with torch.no_grad():
            out = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, do_sample=False)
        guess = out[0, ids.shape[1]:].tolist()
        if guess and next(calls) % 3 == 0:
            guess[-1] = (guess[-1] + 1) % len(tiny.tokenizer)
        return guess

    spec.propose = propose
    return live


def run_preset(page, sub, name, n):
    """Apply preset `name` from the page; the engine's events until its `n` requests finished,
    once the page has them all too."""
    page.evaluate("n => firstToken.send({type: 'preset', name: n})", name)
    evs = collect(sub, lambda got: sum(e["type"] == "finished" for e in got) >= n, timeout=60)
    page.wait_for_function("n => firstToken.state.finishedCount >= n", arg=n, timeout=20_000)
    return evs


def guesses(evs):
    """From the engine's events: accepted-guess tokens per request (`token.spec`), rejected
    guesses per request (`step.spec`: proposed − accepted), and over every step the drafts,
    guesses and accepted guesses."""
    accepted, rejected, total = Counter(), Counter(), Counter()
    for e in evs:
        if e["type"] == "token" and e["spec"] == "accepted":
            accepted[e["id"]] += 1
        elif e["type"] == "step":
            for rid, g in (e["spec"] or {}).items():
                rejected[rid] += g["proposed"] - g["accepted"]
                total.update(drafts=1, proposed=g["proposed"], accepted=g["accepted"])
    return accepted, rejected, total


def of(evs, kind):
    return [e for e in evs if e["type"] == kind]


def pct(x):
    """static/features/ft-speculate.js pct (Math.round: halves up)."""
    return f"{math.floor(x * 100 + 0.5)}%"


def whole_run(page):
    """The timeline paused over the requests, from the first arrival to the last end, drawn now."""
    page.evaluate("""() => { const rs = [...firstToken.state.reqs.values()];
        const a = Math.min(...rs.map(r => r.arrival)), b = Math.max(...rs.map(r => r.end)), d = b - a;
        Object.assign(firstToken.view, {paused: true, right: b + d * 0.04, span: d * 1.08});
        firstToken.refresh(); }""")


def test_the_timeline_draws_the_engines_guesses_and_the_headline_their_share(guessing, browser):
    with page_at(browser, guessing.url + "/") as page, events(guessing) as sub:
        evs = run_preset(page, sub, "speculative", 1)
        accepted, rejected, total = guesses(evs)
        assert sum(accepted.values()) > 0 and sum(rejected.values()) > 0, total   # both kinds to draw
        whole_run(page)
        drawn = page.evaluate("firstToken.ui.layouts.timeline.guesses")
        by = {"accepted": Counter(), "rejected": Counter()}
        for m in drawn:
            by["accepted"][m["id"]] += m["accepted"]
            by["rejected"][m["id"]] += m["rejected"]
        assert by["accepted"] == accepted and by["rejected"] == rejected, (by, accepted, rejected)
        # every token went to the forward before it: the lane's tokens out per forward in view
        lane = page.evaluate("firstToken.ui.layouts.timeline.perFwd")
        tokens, forwards = sum(e["type"] == "token" for e in evs), sum(e["type"] == "step" for e in evs)
        assert (lane["out"], lane["forwards"]) == (tokens, forwards)

        # the headline: the step events' share of guesses accepted and mean acceptance length (all
        # within its 30 s window), the legend item beside the timeline
        head = page.evaluate("""() => ({fig: !document.getElementById('h-spec-fig').hidden,
            legend: !document.getElementById('tl-spec').hidden, rate: document.getElementById('h-spec').textContent,
            len: document.getElementById('h-spec-len').textContent})""")
        assert head["fig"] and head["legend"]
        assert head["rate"] == pct(total["accepted"] / total["proposed"]), (head, total)
        assert head["len"] == f"{1 + total['accepted'] / total['drafts']:.1f}", (head, total)

        # a speculating forward's hover: the tokens that followed its step event, from what it computed
        last, out = None, Counter()
        for e in evs:
            if e["type"] == "step":
                last = (e["start"], e["end"])
            elif e["type"] == "token" and last is not None:
                out[last] += 1
        st = max((e for e in evs if e["type"] == "step" and e["spec"]),
                 key=lambda e: sum(g["accepted"] for g in e["spec"].values()))
        page.evaluate("""st => { const d = st.end - st.start;   // zoomed in on it: a fifth of the plot wide
            Object.assign(firstToken.view, {paused: true, span: d * 5, right: st.end + d * 2});
            firstToken.refresh(); }""", st)
        x = page.evaluate("st => firstToken.ui.layouts.timeline.f.x((st.start + st.end) / 2)", st)
        box = page.locator("#timeline").bounding_box()
        page.mouse.move(box["x"] + x, box["y"] + 8)   # the lane of forwards across the top
        page.wait_for_function("() => !document.getElementById('tip').hidden")
        g = st["spec"][next(iter(st["spec"]))]
        n = out[(st["start"], st["end"])]
        want = (f"{n} token{'' if n == 1 else 's'} out from {st['tokens']} positions computed · guesses: "
                f"{g['proposed']} verified, {g['accepted']} accepted, {g['proposed'] - g['accepted']} rejected")
        assert want in page.text_content("#tip")


def test_the_request_panel_gives_its_finished_counts(guessing, browser):
    with page_at(browser, guessing.url + "/") as page, events(guessing) as sub:
        evs = run_preset(page, sub, "speculative", 1)
        fin = next(e for e in evs if e["type"] == "finished")
        rid, drafts, guessed, kept = fin["id"], fin["spec_drafts"], fin["spec_draft_tokens"], fin["spec_accepted_tokens"]
        # the engine's two counts agree: its steps' and its finish's (the panel reads either)
        steps = [e["spec"][rid] for e in evs if e["type"] == "step" and rid in (e["spec"] or {})]
        assert (len(steps), sum(g["proposed"] for g in steps), sum(g["accepted"] for g in steps)) == (drafts, guessed, kept)
        page.evaluate("id => { firstToken.select(id); firstToken.refresh(); }", rid)
        want = (f"speculative decoding: {kept} of {guessed} guesses accepted ({pct(kept / guessed)}) in {drafts} "
                f"forward{'' if drafts == 1 else 's'} · mean acceptance length {1 + kept / drafts:.2f} tokens per forward "
                "(engine, at its finish)")
        assert want in page.text_content("#d-sched")


# The diagnosis's verdict on made-up but consistent events (the page's own modules, no engine):
# plain decode steps measured first, then speculating forwards of one request alone, or of
# eight; each forward's tokens (accepted guesses, then the model's own) arrive here together.
DIAGNOSE = """async ([batch, plainMs, specMs, proposed, accepted]) => {
  const st = await import("ft/state"), dg = await import("ft/diagnose");
  const s = st.createState(), ids = Array.from({length: batch}, (_, i) => `r${i}`);
  const go = (ev, at = null) => st.ingest(s, ev, at);
  go({type: "hello", t: 0, settings: {slots: 8, speculation: "ngram"}, limits: {}, max_slots: 8, mode: "engine"});
  let t = 1;
  const step = (ms, spec) => {
    const n = spec ? batch * (1 + proposed) : batch;   // positions: each request's token and its guesses
    go({type: "step", t: t + ms / 1000, kind: "decode", start: t, end: t + ms / 1000, ids, tokens: n, prefill_tokens: 0,
        decode_tokens: n, kv_cache: true, cache_tokens: 0, cache_blocks_used: 0, per_request: {}, predicted_s: null,
        bound: null, spec});
    t += ms / 1000;
  };
  for (let i = 0; i < 10; i++) step(plainMs, null);
  const arrival = t;
  for (const id of ids) {
    go({type: "request", t, id, source: "load", prompt_tokens: 64, max_new_tokens: 64, preview: ""});
    go({type: "token", t: t + 0.01, id, index: 0, text: "a", first: true, sampled: t + 0.01, spec: null}, t + 0.011);
  }
  t += 0.01;
  for (let i = 0; i < 10; i++) {
    step(specMs, Object.fromEntries(ids.map((id) => [id, {proposed, accepted}])));
    for (const id of ids) {
      for (let k = 0; k <= accepted; k++) {
        go({type: "token", t, id, index: 1 + i * (1 + accepted) + k, text: "a", first: false, sampled: t,
            spec: k < accepted ? "accepted" : "corrected"}, t + 0.002);
      }
    }
  }
  const tokens = 1 + 10 * (1 + accepted), tpot = (t - arrival - 0.01) / (tokens - 1);
  for (const id of ids) {
    go({type: "finished", t, id, reason: "length", source: "load", prompt_tokens: 64, output_tokens: tokens,
        e2e: t - arrival, ttft: 0.01, tpot, stages: {load: 0, queue: 0, tokenize: 0, prefill: 0.005, first_sample: 0.001,
        delivery: 0.001, other: 0.003}, later: {decode: tpot, mixed: 0, stalled: 0, preempted: 0, sample: 0, delivery: 0},
        cached_tokens: 0, preemptions: 0, slo: null, spec_drafts: 10, spec_draft_tokens: 10 * proposed,
        spec_accepted_tokens: 10 * accepted});
  }
  return dg.diagnose(s.reqs.get("r0"), s);
}"""


def test_the_diagnosis_says_whether_speculation_helped_or_hurt(live, browser):
    with page_at(browser, live.url + "/") as page:
        # alone: 22 ms forwards that gave it 4 tokens each against 20 ms plain steps at batch 1
        d = page.evaluate(DIAGNOSE, [1, 20, 22, 4, 3])
        assert d["spec"] == "helped", d
        assert ("Speculative decoding helped: 30 of 40 guesses accepted (75%), 4.0 tokens per speculating forward, "
                "alone in the batch: 5.5 ms per token for a 22 ms forward against 20 ms for a plain decode step at "
                "batch 1 measured here.") in d["text"]
        assert "one or more per model step" in d["text"]
        # eight at once: 120 ms forwards that gave each 3 tokens against 30 ms plain steps at batch 8;
        # their tokens arrive here in one clump per forward, 120 ms apart: that is not a buffering proxy
        d = page.evaluate(DIAGNOSE, [8, 30, 120, 4, 2])
        assert d["spec"] == "hurt" and d["cause"] != "buffering", d
        assert ("20 of 40 guesses accepted (50%), 3.0 tokens per speculating forward, 8 requests in the batch: 40 ms "
                "per token for a 120 ms forward against 30 ms for a plain decode step at batch 8 measured here; 40% of "
                "the positions those forwards computed were rejected guesses") in d["text"]   # 8 × 2 of 8 × 5
        assert "speculation off, or fewer guesses, would likely help" in d["text"]


def test_the_speculation_comparison_runs_one_user_and_many_both_ways(guessing, browser):
    with page_at(browser, guessing.url + "/") as page, events(guessing) as sub:
        page.click("#btn-compare")
        compare = page_module(page, "compare")
        page.select_option("#c-which", "speculation")
        page.click("#c-run")
        # the engine's events, read as they come (a subscription's buffer is bounded), until the page is done
        evs = collect(sub, lambda got: page.evaluate("c => c.runs !== null && !document.getElementById('c-run').disabled",
                                                     compare), timeout=240)
        assert not any(e["type"] == "dropped" for e in evs)
        # the engine's four runs, by their `preset` events: A off then B ngram, one user then many
        runs, cur = [], None
        for e in evs:
            if e["type"] == "preset":
                cur = {"name": e["name"], "spec": e["overrides"]["speculation"], "events": []}
                runs.append(cur)
            elif cur is not None:
                cur["events"].append(e)
        assert [(r["name"], r["spec"]) for r in runs] == [("speculative", "off"), ("speculative-busy", "off"),
                                                          ("speculative", "ngram"), ("speculative-busy", "ngram")]
        page.evaluate("firstToken.refresh()")
        tps = {}
        for side, pair in (("a", runs[:2]), ("b", runs[2:])):
            figs = page.evaluate("""side => Object.fromEntries([...document.querySelectorAll('#c-' + side + '-figs .fig')]
                .map(f => [f.dataset.k, f.querySelector('.v').textContent]))""", side)
            for run in pair:
                evs_run = run["events"]
                ids = {e["id"] for e in of(evs_run, "request")}
                fin = [e for e in of(evs_run, "finished") if e["id"] in ids]
                who = f"{len(ids)} user{'' if len(ids) == 1 else 's'}"
                span = max(e["t"] for e in fin) - min(e["t"] for e in of(evs_run, "request"))
                tps[side, who] = sum(e["output_tokens"] for e in fin) / span
                assert figs[f"tokens/s · {who}"] == f"{tps[side, who]:.1f}", (side, who, figs)
                _, _, total = guesses(evs_run)
                want = (f"{pct(total['accepted'] / total['proposed'])} · {1 + total['accepted'] / total['drafts']:.2f}"
                        if total["drafts"] else "none")
                assert figs[f"guesses accepted · length · {who}"] == want, (side, who, figs)
                steps = [e for e in of(evs_run, "step") if ids & set(e["ids"])]
                assert figs[f"tokens/forward · {who}"] == f"{len(of(evs_run, 'token')) / len(steps):.2f}", (side, who, figs)
                assert (total["drafts"] > 0) == (side == "b")
        status = page.text_content("#c-status")
        assert "both from an empty prefix cache" in status
        gain = {who: f"×{tps['b', who] / tps['a', who]:.2f}" for who in ("1 user", "8 users")}   # the crossover
        assert (f"speculation on (ngram) against speculation off, total tokens/s: {gain['1 user']} with 1 user, "
                f"{gain['8 users']} with 8 users.") in status, status


# A laptop, a projector (and presenting on it), a phone.
SCREENS = [("1366x768", 1366, 768, False), ("1920x1080", 1920, 1080, False), ("1920x1080-present", 1920, 1080, True),
           ("phone-390x844", 390, 844, False)]


@pytest.mark.parametrize("name,width,height,present", SCREENS, ids=[s[0] for s in SCREENS])
def test_the_speculative_preset_is_readable(guessing, browser, name, width, height, present):
    url = guessing.url + ("/?present=1" if present else "/")
    with page_at(browser, url, width, height) as page, events(guessing) as sub:
        run_preset(page, sub, "speculative", 1)
        whole_run(page)
        assert page.evaluate("firstToken.ui.layouts.timeline.guesses.length") > 0
        assert page.is_visible("#h-spec-fig")
        assert_readable(page, f"spec-{name}")
