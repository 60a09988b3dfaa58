"""The live page in real Chromium against hostile text: prompts typed into the page, and model
output that is HTML (the in-process app on the tiny model, its detokenised text replaced by
markup), plus a hostile setting name echoed in an error. Nothing may run or be injected: the
text must appear as text."""
import json

import pytest

from engine.core import engine as engine_mod
from engine.core.detok import Detokenizer
from helpers import frames_drawn


# Each would set window.__xss or open a dialog if it ever became markup.
OUTPUT = ['<img src=x onerror="window.__xss=1;alert(1)">', "<script>window.__xss=2</script>",
          '<b id="injected">bold</b>', '<svg onload="window.__xss=3">', "&lt;i&gt;"]
PROMPT = '<img src=x onerror="window.__xss=4;alert(4)"><script>alert(5)</script>'
# (the page's own inline scripts are its import map and the one line that imports its boot module)
INJECTED = "img[src='x'], #injected, svg[onload], script:not([src]):not([type='importmap']):not([type='module'])"


class HostileDetokenizer(Detokenizer):
    """Real detokenisation underneath, but every token's text is the next piece of markup."""

    def add(self, token_id):
        super().add(token_id)
        self.n = getattr(self, "n", -1) + 1
        return OUTPUT[self.n % len(OUTPUT)]


@pytest.fixture
def page(browser, live, monkeypatch):
    monkeypatch.setattr(engine_mod, "Detokenizer", HostileDetokenizer)
    p = browser.new_page(viewport={"width": 1280, "height": 900})
    p.dialogs, p.errors = [], []
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.goto(live.url + "/")
    p.wait_for_function("() => window.firstToken && firstToken.state.hello && "
                        "document.getElementById('conn').dataset.state === 'connected'", timeout=60_000)
    yield p
    p.close()


def test_hostile_prompt_and_model_output_render_as_text(page):
    scripts = page.evaluate("document.scripts.length")
    page.fill("#prompt", PROMPT)
    page.press("#prompt", "Enter")
    page.wait_for_function("() => { const id = firstToken.ui.selected, r = id && firstToken.state.reqs.get(id);"
                           " return r && r.end !== null && r.pieces; }", timeout=60_000)
    rid = page.evaluate("firstToken.ui.selected")
    text = page.evaluate("id => firstToken.state.reqs.get(id).text.join('')", rid)
    assert text.startswith("".join(OUTPUT[:3]))    # the model's output really was markup
    # The panel refreshes at 4 Hz: within a tick it shows the whole output, as text.
    page.wait_for_function("t => document.getElementById('d-text').textContent === t", arg=text, timeout=5_000)
    page.hover("#timeline")                        # tooltips draw request text too
    frames_drawn(page, 3)   # the tooltip draws on a later frame; no markup from it is what is checked
    assert PROMPT in page.text_content("#d-chips")
    assert page.evaluate(f"document.querySelectorAll(\"{INJECTED}\").length") == 0
    assert page.evaluate("document.scripts.length") == scripts
    assert page.evaluate("window.__xss") is None
    assert page.dialogs == [] and page.errors == []


def test_a_hostile_name_in_an_error_is_shown_as_text(page):
    name = '<img src=x onerror="window.__xss=6">'
    page.evaluate("m => firstToken.send(m)", {"type": "set", "settings": {name: 1}})
    page.wait_for_function("n => document.getElementById('toast').textContent.includes(n)", arg=name,
                           timeout=10_000)
    assert page.evaluate(f"document.querySelectorAll(\"{INJECTED}\").length") == 0
    assert page.evaluate("window.__xss") is None and page.dialogs == []
    json.dumps(page.evaluate("firstToken.state.settings"))   # the page state is intact


def test_an_injected_inline_script_does_not_run_and_the_page_still_works(page):
    """The CSP's second line: were markup ever to reach the page (the tests above: it does not), an
    inline `<script>` or an `onerror=` in it would not run, for neither carries this response's
    nonce; the page's own scripts (the import map and its modules, plotly.js) run, and it still
    streams a prompt."""
    page.evaluate("""() => {
        window.__violations = [];
        document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.effectiveDirective));
        const s = document.createElement('script');
        s.textContent = 'window.__xss = 7';
        document.body.appendChild(s);
        document.body.insertAdjacentHTML('beforeend', '<img id="injected" src="data:," onerror="window.__xss = 8">');
    }""")
    page.wait_for_function("() => window.__violations.length >= 2", timeout=10_000)
    assert sorted(page.evaluate("window.__violations")) == ["script-src-attr", "script-src-elem"]
    assert page.evaluate("window.__xss") is None
    page.fill("#prompt", "Liberty")
    page.press("#prompt", "Enter")
    page.wait_for_function("() => { const id = firstToken.ui.selected, r = id && firstToken.state.reqs.get(id);"
                           " return r && r.end !== null && r.text.length > 0; }", timeout=60_000)
    assert page.evaluate("typeof Plotly") == "object"   # the page's own external script ran
    assert page.dialogs == [] and page.errors == []
