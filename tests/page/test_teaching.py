"""The teaching layer in real Chromium on the in-process tiny engine (`live`): presets change
the engine as they say (read from the page's own event stream), the guided tour applies them
and spots the page's parts, presenter mode and its shortcuts, the measure sheet and the
side-by-side comparison."""
from contextlib import contextmanager

import pytest

from helpers import LiveApp, collect, page_module, tiny_tokenizer
from test_browser import Page, restore_engine


def midsize_bundle():
    """A random Llama big enough that a forward's time follows its tokens (the tiny model's is
    mostly overhead): ~10 M parameters, built in a second, no download."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from engine.model import loading as model_mod
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, bos_token_id=None,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config.eos_token_id = None   # random weights: never stop early, every run is max_new_tokens long
    return model_mod.ModelBundle(m, tok, "midsize-random-llama", "cpu", torch.float32, 0.0, False)


@contextmanager
def midsize_app():
    """The midsize model's app on one torch thread: Chromium drawing the page needs the other
    core, and two model threads contending with it make single forwards' times jitter by half."""
    import torch
    from engine import EngineConfig
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    app = LiveApp(midsize_bundle(), EngineConfig(slots=4, kv_tokens=4096, max_context=512))
    try:
        yield app
    finally:
        app.stop()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def midsize():
    with midsize_app() as app:
        yield app


class TeachPage(Page):
    """A page with the teaching helpers."""

    def ft(self):
        """A handle to the page's modules these tests read, {teach, tour, figures, replay, compare,
        util} (static/JOB/ft-NAME.js, the instances the page runs): pass it in an expression's argument."""
        return self.page.evaluate_handle("""async () => { const ft = {};
            for (const n of ["teach", "tour", "figures", "replay", "compare", "util"]) ft[n] = await import(`ft/${n}`);
            return ft; }""")

    def fmt(self, seconds):
        """A duration as the page writes it (fmtS, static/core/ft-util.js)."""
        return self.js("([ft, v]) => ft.util.fmtS(v)", [self.ft(), seconds])

    def active_t(self):
        """The engine time of the lesson shown (the last `preset` event), -1 without one."""
        return self.js("ft => ft.teach.active ? ft.teach.active.t : -1", self.ft())

    def wait_preset(self, name, after):
        """Wait for a `preset` event for `name` later than engine time `after`; its time."""
        self.wait("([ft, n, b]) => ft.teach.active && ft.teach.active.name === n && ft.teach.active.t > b",
                  [self.ft(), name, after], timeout=15_000)
        return self.active_t()

    def preset(self, name):
        """Click a preset's button; wait for its `preset` event; return that event's engine time."""
        before = self.active_t()
        self.page.click(f"#presets .preset[data-preset='{name}']")
        return self.wait_preset(name, before)

    def preset_with(self, name, settings):
        """Apply a preset with settings over its own (as the comparison does); its event's time."""
        before = self.active_t()
        self.js("([n, s]) => firstToken.send({type: 'preset', name: n, settings: s})", [name, settings])
        return self.wait_preset(name, before)

    def preset_settings(self, name):
        """Every setting as applying the preset leaves it (the page's own computation)."""
        return self.js("([ft, n]) => ft.teach.presetSettings(firstToken.state, n)", [self.ft(), name])

    def finished_since(self, t0, n, timeout=300_000):
        """Wait until n requests that arrived since t0 finished; return them (arrival order).
        The deadline is liveness only: a busy 2-core machine can take minutes for a preset's run."""
        ft = self.ft()
        self.wait("([ft, t0, n]) => ft.figures.finishedSince(firstToken.state, t0).length >= n", [ft, t0, n],
                  timeout=timeout)
        return self.js("""([ft, t0]) => ft.figures.finishedSince(firstToken.state, t0).map(r => ({id: r.id, arrival: r.arrival,
            ttft: r.ttft, prefill: r.stages.prefill, queue: r.stages.queue, prompt: r.promptTokens}))""", [ft, t0])

    def max_stat(self, key, t0):
        return self.js("([k, t0]) => Math.max(0, ...firstToken.state.stats.filter(x => x.t >= t0).map(x => x[k]))", [key, t0])

    def idle(self):
        """Load off, every setting back to its default, nothing running."""
        restore_engine(self, timeout=30_000)


@pytest.fixture
def tpage(browser, live):
    p = TeachPage(browser, live.url + "/")
    yield p
    p.close()


@pytest.fixture
def midpage(browser, midsize):
    """A page on the midsize engine, which outlives the test: left idle with default settings."""
    p = TeachPage(browser, midsize.url + "/")
    yield p
    p.idle()
    p.close()


@pytest.fixture
def smallpage(browser, midsize):
    """An iframe-sized page on the midsize engine, for the tests that time single forwards: a
    full-HD canvas redrawn at 60 Hz in software takes CPU those forwards then lack, and more of
    it as rows pile up. The figures are the same; its presets panel is folded away (presets
    are sent, not clicked)."""
    p = TeachPage(browser, midsize.url + "/", 640, 400)
    yield p
    p.idle()
    p.close()


def test_every_preset_button_applies_its_settings_and_shows_its_lesson(tpage):
    presets = tpage.js("firstToken.state.hello.presets")
    assert len(presets) >= 11
    util = page_module(tpage.page, "util")
    for p in presets:
        tpage.preset(p["name"])
        want = tpage.preset_settings(p["name"])
        tpage.wait("w => Object.entries(w).every(([k, v]) => firstToken.state.settings[k] === v)", want, timeout=10_000)
        tpage.wait("t => document.getElementById('lesson-title').textContent === t && "
                   "!document.getElementById('lesson').hidden", p["title"], timeout=5_000)
        # the preset's words, then what the page adds from this run: a sampling lesson's seeding,
        # and where the run contradicts the claim, what it measured (ft-teach.js banner)
        text, seeded = tpage.page.text_content("#lesson-text"), tpage.js("([u, p]) => u.seededText(p)", [util, p])
        assert text.startswith(p["explain"] + seeded), (text, seeded)
        assert (seeded != "") == any(a.get("prompt") and a.get("temperature", 0) > 0 for a in p["actions"])
        rest = text[len(p["explain"] + seeded):]
        assert rest == "" or (p["name"] == "idle" and rest.startswith(" On this run it did queue:")), rest
        assert tpage.page.text_content("#lesson-watch") == p["watch"]
        assert tpage.page.get_attribute(f"#presets .preset[data-preset='{p['name']}']", "class").split() == ["preset", "on"]
    assert sum('"type":"preset"' in m for m in tpage.sent) == len(presets)
    tpage.idle()
    assert tpage.errors == []


@pytest.mark.slow
def test_queueing_preset_grows_ttft_while_prefill_stays_flat(smallpage):
    """What `queueing` shows, judged by the engine's own forwards (how long a forward takes is
    this machine's business): later arrivals wait through more forwards before their prefill, and
    every prefill is one forward of the same prompt alone."""
    t0 = smallpage.preset_with("queueing", None)
    done = smallpage.finished_since(t0, 12)
    assert smallpage.max_stat("queue", t0) >= 3               # requests waited
    queued = sorted(done, key=lambda r: r["arrival"])[1:]      # the burst behind the first (one arrival time)
    # Forwards each request waited through between its arrival and its prefill: they grow down
    # the queue, and the last waited at least through every other's prefill.
    waited = smallpage.js("""ids => ids.map(id => { const s = firstToken.state, r = s.reqs.get(id);
        return s.steps.filter(x => x.kind !== 'release' && x.start >= r.arrival && x.end <= r.prefills[0].start).length; })""",
                          [r["id"] for r in queued])
    assert waited == sorted(waited) and waited[-1] >= waited[0] + len(queued) - 1, waited
    ttfts = [r["ttft"] for r in queued]
    assert ttfts[-1] > ttfts[0]                                # one arrival time, a later first token
    assert sum(r["queue"] for r in queued[-4:]) > sum(r["queue"] for r in queued[:4])
    # The same prompt work for every request (the engine's prefill events)...
    work = smallpage.js("ids => ids.map(id => firstToken.state.reqs.get(id).prefills.reduce((a, p) => a + p.tokens, 0))",
                        [r["id"] for r in queued])
    assert set(work) == {queued[0]["prompt"]}
    # ...computed whole and alone (prefill-first, a budget of one prompt), so every request's
    # prefill figure is one forward of its own prompt and nothing else.
    alone = smallpage.js("""ids => ids.map(id => { const s = firstToken.state, p = s.reqs.get(id).prefills;
        const st = s.steps.find(x => x.start === p[0].start && x.kind !== 'release');
        return p.length === 1 && st.tokens === p[0].tokens; })""", [r["id"] for r in queued])
    assert all(alone)
    smallpage.wait("() => /TTFT p50 .* vs prefill median/.test(document.getElementById('lesson-live').textContent)", timeout=5_000)
    prefill = [r["prefill"] for r in queued]
    print(f"queueing: forwards waited {waited}; TTFT {ttfts[0] * 1000:.0f} → {ttfts[-1] * 1000:.0f} ms; "
          f"prefill {min(prefill) * 1000:.1f}-{max(prefill) * 1000:.1f} ms")
    assert smallpage.errors == []


def test_long_document_prefills_longer_than_idle(midpage):
    """The long document's prefill is more than 4x the work of idle's: forwards over its whole
    prompt, read from the engine's prefill events (their time is printed, not judged: it is this
    machine's business, measured by `make bench`)."""
    prefill = {}
    for name in ("idle", "long-document"):
        t0 = midpage.preset(name)
        (r,) = midpage.finished_since(t0, 1)
        work = midpage.js("id => firstToken.state.reqs.get(id).prefills.reduce((a, p) => a + p.tokens, 0)", r["id"])
        prefill[name] = {"prompt": r["prompt"], "computed": work, "s": r["prefill"]}
    print(f"prefill: {prefill}")
    assert all(p["computed"] == p["prompt"] for p in prefill.values())
    assert prefill["long-document"]["computed"] > 4 * prefill["idle"]["computed"]
    midpage.wait("() => /prefill median .* for \\d+-token prompts/.test(document.getElementById('lesson-live').textContent)",
               timeout=5_000)


def test_kv_cache_off_step_work_grows_with_sequence_length(smallpage):
    """With the cache off every decode step computes the whole sequence again: each step's
    forward is one position longer than the last. That work, read from the engine's step
    events, is what makes the step time grow (printed, not judged: measured by `make bench`)."""
    t0 = smallpage.preset_with("kv-cache-off", None)
    smallpage.finished_since(t0, 1)
    k = smallpage.js("([ft, t0]) => ft.figures.recomputeSlope(firstToken.state, t0)", [smallpage.ft(), t0])
    lens = smallpage.js("""t0 => firstToken.state.steps.filter((st) => st.kind === "decode" && !st.kv && st.start >= t0)
                             .map((st) => st.tokens / st.ids.length)""", t0)
    print(f"kv-cache-off: {k}, {len(lens)} steps")
    assert len(lens) >= 6 and lens == list(range(int(lens[0]), int(lens[0]) + len(lens)))
    assert k["long"]["len"] > 2 * k["short"]["len"]
    live = smallpage.page.text_content("#lesson-live")
    assert "decode step" in live and "cache off" in live


def test_many_users_gives_more_total_tokens_per_second_than_idle(tpage):
    """More users, more tokens per forward: the batch carries many decodes where idle's carries
    one (the engine's step events, mixed steps' decode rows too; tokens/s, which follows from it,
    is printed, not judged). How soon three streams overlap depends on the machine's speed and
    the Poisson arrivals, so the many-users side is awaited (a liveness bound), not sampled."""
    most_decodes = """t => Math.max(0, ...firstToken.state.steps.filter(st => st.start >= t && st.kind !== "release")
                                                         .map(st => st.decodeIds.length))"""
    t0 = tpage.preset("idle")
    tpage.finished_since(t0, 1)
    idle, idle_batch = tpage.max_stat("tps", t0), tpage.js(most_decodes, t0)
    t1 = tpage.preset("many-users")
    tpage.wait(f"t => ({most_decodes})(t) > 2", t1, timeout=60_000)
    many, many_batch = tpage.max_stat("tps", t1), tpage.js(most_decodes, t1)
    print(f"tokens/s: idle {idle:.1f}, many users {many:.1f}; decodes per forward {idle_batch} vs {many_batch}")
    assert idle_batch == 1 and many_batch > 2 * idle_batch
    assert "total" in tpage.page.text_content("#lesson-live")
    tpage.idle()


@pytest.mark.slow
def test_preset_from_the_url_is_applied_once_and_bad_names_are_named(browser, live):
    p = TeachPage(browser, live.url + "/?preset=queueing&max_new_tokens=8")
    try:
        p.wait_preset("queueing", -1)
        p.wait("() => firstToken.state.settings.max_new_tokens === 8 && firstToken.state.settings.slots === 2", timeout=10_000)
        assert sum('"type":"preset"' in m for m in p.sent) == 1
        assert "ignored" not in p.page.text_content("#toast")
    finally:
        p.close()
    sub = live.driver.events.subscribe(replay=False)
    p = TeachPage(browser, live.url + "/?preset=nope")
    try:
        p.wait("() => document.getElementById('toast').textContent.includes('name: unknown preset')", timeout=10_000)
        # Nothing changed: the server refused the preset when it answered. A marker the engine
        # applies after anything it could have queued: once its event is out, nothing else came.
        live.driver.update_settings({"slots": 2})
        came = collect(sub, lambda evs: any(e["type"] == "settings" and e["changed"] == ["slots"] for e in evs))
        assert [e["type"] for e in came if e["type"] in ("preset", "reset", "settings")] == ["settings"]
        # the preset shown is still the one applied before (from the replayed history)
        assert p.js("ft => ft.teach.active.name", p.ft()) == "queueing" and p.js("firstToken.state.settings.slots") == 2
        p.idle()
    finally:
        live.driver.events.unsubscribe(sub)
        p.close()


@pytest.mark.slow
def test_guided_tour_applies_each_step_and_spots_its_part(tpage):
    steps = tpage.js("ft => ft.tour.STEPS.map(s => ({key: s.key, title: s.title, preset: s.preset, spot: s.spot}))", tpage.ft())
    assert [s["title"] for s in steps][:7] == ["Tokens", "Prefill", "Decode", "Fewer bytes to read, faster decode",
                                               "The KV cache", "Batching", "Queueing"]
    tpage.page.click("#btn-tour")
    for i, step in enumerate(steps):
        if i:
            tpage.page.click("#tour-next")
        tpage.wait("t => document.getElementById('lesson-title').textContent === t", step["title"], timeout=5_000)
        if step["preset"]:
            tpage.wait("([ft, n]) => ft.teach.active && ft.teach.active.name === n", [tpage.ft(), step["preset"]],
                       timeout=15_000)
            want = tpage.preset_settings(step["preset"])
            tpage.wait("w => Object.entries(w).every(([k, v]) => firstToken.state.settings[k] === v)", want, timeout=10_000)
        assert tpage.js("document.body.classList.contains('touring')")
        if step["key"] == "slow":   # as the step asks: a request is clicked, one measured to its end
            tpage.wait("() => [...firstToken.state.reqs.values()].some(r => r.stages)", timeout=30_000)
            tpage.js("""() => { const ui = firstToken.ui;
                               ui.selected = [...firstToken.state.reqs.values()].filter(r => r.stages).pop().id;
                               ui.dirtyDom = true; }""")
        if ".acc-ttft" in step["spot"]:   # a finished request's accounting: the shown request's, once it ends
            tpage.wait("p => { const r = p.selectedReq(firstToken.state, firstToken.ui); return r && r.stages; }",
                       page_module(tpage.page, "panels"), timeout=60_000)
        # a spotted part drawn on the page's tick (the request panel's accounting among them), counted
        # in the same look: the shown request can change to a newer one still running, whose panel
        # has no accounting yet (a CI run read 0 a moment after the wait saw it)
        spotted = tpage.page.wait_for_function(
            "sels => { const n = sels.map(s => [...document.querySelectorAll(s)].filter(e => e.classList.contains('spot')).length);"
            " return n.every(k => k >= 1) && n; }", arg=step["spot"], timeout=15_000, polling=100).json_value()
        assert all(n >= 1 for n in spotted), (step, spotted)
        # the rest is dimmed, the spotted part is not
        assert tpage.js("s => getComputedStyle(document.querySelector(s)).opacity", step["spot"][0]) == "1"
        assert tpage.page.text_content("#tour-pos") == f"{i + 1} / {len(steps)}"
    assert tpage.page.is_disabled("#tour-next")
    tpage.page.keyboard.press("ArrowLeft")
    tpage.wait("t => document.getElementById('lesson-title').textContent === t", steps[-2]["title"], timeout=5_000)
    tpage.page.click("#tour-end")
    tpage.wait("() => !document.body.classList.contains('touring') && !document.querySelector('.spot')", timeout=5_000)
    tpage.idle()
    assert tpage.errors == []


def test_presenter_mode_and_shortcuts_not_while_typing(browser, live):
    p = TeachPage(browser, live.url + "/?present=1")
    try:
        assert p.js("document.body.classList.contains('present')")
        assert not p.page.is_visible("#controls")
        p.page.keyboard.press("?")
        assert p.page.is_visible("#help")
        p.page.keyboard.press("Escape")
        assert not p.page.is_visible("#help")
        p.page.keyboard.press("p")
        assert not p.js("document.body.classList.contains('present')") and "present" not in p.js("location.search")
        # typing in the prompt box fires nothing
        p.page.fill("#prompt", "")
        p.page.type("#prompt", "p2?s")
        assert p.page.input_value("#prompt") == "p2?s"
        assert not p.js("document.body.classList.contains('present')") and not p.page.is_visible("#help")
        assert not any('"type":"preset"' in m for m in p.sent)
        p.page.locator("#prompt").blur()
        second = p.js("firstToken.state.hello.presets[1].name")
        p.page.keyboard.press("2")
        ft = p.ft()
        p.wait("([ft, n]) => ft.teach.active && ft.teach.active.name === n", [ft, second], timeout=15_000)
        p.page.keyboard.press("ArrowRight")
        p.wait("ft => ft.tour.index === 0 && document.body.classList.contains('touring')", ft, timeout=5_000)
        p.page.keyboard.press("s")      # slow motion: the last seconds again at ¼ speed, view only
        p.wait("ft => ft.replay.active() && ft.replay.player.speed === 0.25", ft, timeout=2_000)
        p.page.keyboard.press("s")      # back to live
        p.wait("ft => !ft.replay.active()", ft, timeout=2_000)
        p.page.keyboard.press("p")
        assert p.js("document.body.classList.contains('present')") and p.js("location.search").count("present=1") == 1
        p.idle()
        assert p.errors == []
    finally:
        p.close()


def test_measure_announces_the_pause_and_draws_the_sweep(tpage):
    tpage.page.click("#btn-measure")
    assert tpage.page.is_visible("#sheet-measure")
    tpage.wait("() => document.getElementById('m-status').dataset.status === 'done'", timeout=60_000)
    assert any('"type":"measure"' in m for m in tpage.sent)
    # the finished sweep drawn, not a partial one drawn from a progress event before it
    tpage.wait("() => ['m-kv', 'm-steps', 'm-rates'].every(id => { const e = document.getElementById(id);"
               " return e.data && !e.classList.contains('partial'); })", timeout=5_000)
    got = tpage.js("""() => { const d = (id) => document.getElementById(id).data;
        return {steps: d('m-steps').map(t => [t.name, t.x.length]), rates: d('m-rates').length,
                kv: d('m-kv').map(t => [t.name, t.y.length]), slots: firstToken.state.hello.max_slots}; }""")
    names = [n for n, _ in got["steps"]]
    assert "estimate: memory-bandwidth floor" in names
    assert any(n.startswith("context ") for n in names)
    assert all(k >= 2 for _, k in got["steps"])
    assert [n for n, _ in got["kv"]] == ["KV cache on", "KV cache off (recompute)"] and all(k >= 3 for _, k in got["kv"])
    assert got["rates"] >= 2
    tpage.page.click("#m-close")
    assert tpage.errors == []


@pytest.mark.slow
def test_compare_runs_a_preset_twice_with_the_same_prompts_and_draws_both(tpage):
    tpage.page.click("#btn-compare")
    tpage.page.select_option("#c-which", "kv")
    tpage.page.click("#c-run")
    tpage.wait("() => document.getElementById('c-status').textContent.startsWith('Done') && "
               "document.getElementById('c-b-figs').textContent.includes('TTFT')", timeout=120_000)
    runs = tpage.js("""ft => { const r = ft.compare.runs, f = (x) => ft.compare.figures(x.s);
        const lens = (x) => [...x.s.reqs.values()].map(q => q.promptTokens);
        return {a: f(r.a), b: f(r.b), kvA: r.a.s.settings.kv_cache, kvB: r.b.s.settings.kv_cache,
                lensA: lens(r.a), lensB: lens(r.b), same: r.a.prompts.join('|') === r.b.prompts.join('|'),
                said: document.getElementById('sheet-compare').dataset.same,
                figs: document.getElementById('c-a-figs').textContent + document.getElementById('c-b-figs').textContent}; }""", tpage.ft())
    assert runs["a"]["n"] == runs["b"]["n"] == 1      # the kv-cache-off preset's one request
    assert runs["same"]
    assert runs["kvA"] is True and runs["kvB"] is False
    assert runs["lensA"] == runs["lensB"]
    assert runs["said"] == str(runs["same"]).lower()   # the page says whether the prompts matched, truthfully
    assert "TTFT p50" in runs["figs"] and "total tokens/s" in runs["figs"]
    # both timelines drew rows from their own recording, on one time axis from 0
    rows = tpage.js("() => ['c-a-canvas', 'c-b-canvas'].map(id => { const c = document.getElementById(id);"
                    " const g = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let lit = 0;"
                    " for (let i = 0; i < g.length; i += 16) if (g[i] + g[i + 1] + g[i + 2] > 200) lit++; return lit; })")
    assert all(n > 50 for n in rows)
    tpage.idle()
    assert tpage.errors == []
