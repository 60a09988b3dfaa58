"""Classroom mode in Chromium (the in-process app on the tiny model): /join on a phone-sized
viewport sends a prompt and the answer streams in with TTFT shown; a viewer's page (its URL
asking for other settings) cannot change the engine while the presenter's page can, shows the
QR code and manages the class. Screenshots go to test-artifacts/."""
import threading

import pytest

from helpers import ARTIFACTS, page_module, wait_until
from test_classroom import ask, room, student  # noqa: F401  (room: a fixture)

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def context(browser):
    """A fresh browser profile per role: cookies (the presenter key, a student's id) are its own."""
    made = []

    def make(viewport):
        ctx = browser.new_context(viewport=viewport)
        page = ctx.new_page()
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        made.append(ctx)
        return page
    yield make
    for ctx in made:
        ctx.close()


def test_join_on_a_phone_streams_the_answer_with_its_ttft(room, context):
    ARTIFACTS.mkdir(exist_ok=True)
    room.driver.update_settings({"max_new_tokens": 24})
    wait_until(lambda: room.driver.settings.now.sampling.max_new_tokens == 24, 30, "max_new_tokens applied")
    sub = room.driver.events.subscribe(replay=False)
    page = context(PHONE)
    page.goto(room.url + "/join?code=owl")
    page.wait_for_selector("#join-form:not([hidden])")
    assert page.input_value("#code") == "owl"   # the QR code's address carries the code
    page.fill("#name", "Ada")
    page.click("#join-form button")
    page.wait_for_selector("#ask-form:not([hidden])")
    assert page.text_content("#who") == "you are Ada"
    page.fill("#prompt", "What is a token?")
    page.screenshot(path=str(ARTIFACTS / "join-390x844-before.png"))
    page.click("#btn-ask")
    page.wait_for_function("document.getElementById('f-ttft-engine').textContent !== '—'", timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "join-390x844-after.png"))
    events = sub.get(timeout=1)
    (req,) = [e for e in events if e["type"] == "request"]
    (fin,) = [e for e in events if e["type"] == "finished"]
    assert req["label"] == "Ada" and req["source"] == "join"
    mine = "".join(e["text"] for e in events if e["type"] == "token" and e["id"] == req["id"])
    assert page.text_content("#answer") == mine and mine
    # the engine's figure, exactly as the page's formatter writes it
    as_page_writes = page.evaluate("([util, v]) => util.fmtS(v)", [page_module(page, "util"), fin["ttft"]])
    assert page.text_content("#f-ttft-engine") == as_page_writes
    assert page.text_content("#f-ttft-phone").endswith(("ms", " s"))
    if fin["output_tokens"] >= 2:
        assert float(page.text_content("#f-tps-engine")) == pytest.approx(1 / fin["tpot"], rel=0.01, abs=0.05)
        assert float(page.text_content("#f-tps-phone")) > 0
    # nothing overflows the phone's width
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.errors == []


def test_a_viewer_page_cannot_change_the_engine_the_presenter_can(room, context):
    before = room.driver.settings.now
    viewer = context({"width": 1280, "height": 900})
    viewer.goto(room.url + "/?rate=4&load=true")
    viewer.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
    assert viewer.evaluate("firstToken.state.hello.role") == "viewer"
    assert viewer.is_visible("#viewer-note") and viewer.is_disabled("#btn-load") and viewer.is_disabled("#set-rate")
    # even a message sent by hand is refused
    viewer.evaluate("firstToken.send({type: 'set', settings: {rate: 8}})")
    viewer.wait_for_function("document.getElementById('toast').textContent.includes('viewers cannot change')")
    assert room.driver.settings.now == before and room.driver.settings.now.load.load is False
    assert not viewer.is_visible("#classroom")

    presenter = context({"width": 1920, "height": 1080})
    presenter.goto(room.url + f"/?key={room.classroom.key}&rate=2")
    presenter.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
    assert presenter.evaluate("firstToken.state.hello.role") == "presenter"
    assert room.classroom.key not in presenter.url   # the key left the address bar
    wait_until(lambda: room.driver.settings.now.load.rate == 2.0, 30, "the presenter's URL settings applied")
    assert presenter.is_visible("#classroom svg") and presenter.text_content("#cls-url") == room.url + "/join"
    assert "owl" in presenter.text_content("#classroom")
    presenter.reload()   # the cookie keeps it the presenter
    presenter.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
    assert presenter.evaluate("firstToken.state.hello.role") == "presenter"
    presenter.click("#cls-hide")   # collapsed to the small join card: late students still join
    assert not presenter.is_visible("#classroom") and presenter.is_visible("#cls-card")
    card = presenter.text_content("#cls-card")
    assert f"{room.url}/join" in card and "owl" in card and presenter.is_visible("#cls-card svg")
    presenter.click("#btn-classroom")
    assert presenter.is_visible("#classroom") and presenter.is_hidden("#cls-card")
    assert viewer.errors == [] and presenter.errors == []


def test_the_presenter_sees_students_on_the_timeline_and_removes_one(room, context):
    ARTIFACTS.mkdir(exist_ok=True)
    presenter = context({"width": 1920, "height": 1080})
    presenter.goto(room.url + f"/?key={room.classroom.key}")
    presenter.wait_for_function("() => window.firstToken && firstToken.state.hello", timeout=30_000)
    sessions = {n: student(room, n) for n in ("Ada", "Grace", "Alan")}
    threads = [threading.Thread(target=ask, args=(s, room, f"{n} asks something")) for n, s in sessions.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    presenter.wait_for_function("[...firstToken.state.reqs.values()].filter(r => r.label).length === 3")
    assert sorted(presenter.evaluate("[...firstToken.state.reqs.values()].map(r => r.label)")) == ["Ada", "Alan", "Grace"]
    # students joined: the panel gave way to the small card; the presenter opens the class list
    presenter.wait_for_function("() => document.getElementById('cls-card-count').textContent === '3 joined'")
    presenter.click("#cls-open")
    presenter.wait_for_selector("#cls-list li[data-client] >> text=Grace")
    assert presenter.text_content("#cls-count") == "Students (3)"
    presenter.screenshot(path=str(ARTIFACTS / "classroom-presenter-1920x1080.png"))
    presenter.click("#cls-list li:has-text('Grace') .cls-remove")
    wait_until(lambda: [c["name"] for c in room.classroom.roster() if c["removed"]] == ["Grace"], 30, "Grace removed")
    presenter.wait_for_function("document.getElementById('cls-count').textContent === 'Students (2)'")
    r = sessions["Grace"].post(room.url + "/join/ask", json={"prompt": "still here?"}, timeout=10)
    assert r.status_code == 403
    assert presenter.errors == []


# The parts the join card must leave clear, each as much of it as its scrolling panel shows.
CLEAR_OF_CARD = """() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
  const parts = [];
  for (const sel of ['#lesson', '.timeline-wrap', '.why-h', '#d-why', '#d-accounting', '.spot']) {
    for (const e of document.querySelectorAll(sel)) {
      if (e.hidden || !e.getClientRects().length || e.matches('h2, h3, .strip-head')) continue;
      const r = box(e), panel = e.parentElement.closest('.panel');
      if (panel && ['auto', 'scroll'].includes(getComputedStyle(panel).overflowY)) {
        const p = panel.getBoundingClientRect(); r.top = Math.max(r.top, p.top); r.bottom = Math.min(r.bottom, p.bottom);
      }
      if (r.bottom > r.top) parts.push({what: sel, ...r});
    }
  }
  const card = document.getElementById('cls-card');
  const shown = card && !card.hidden && getComputedStyle(card).visibility !== 'hidden';
  return {card: shown ? box(card) : null, covered: card && card.dataset.covered, parts,
          button: document.getElementById('btn-classroom').textContent};
}"""


@pytest.mark.parametrize("width,height", [(1280, 800), (1024, 768)])
def test_the_join_card_leaves_the_explanation_and_the_timeline_clear(room, context, width, height):
    """Presenter mode with a class joined: the small join card takes a corner where it covers
    neither the request panel's explanation ("Why does this response feel slow?", its measured
    stages), the timeline nor the lesson (at 1280x800 it sat over the explanation); with no
    corner free it steps aside and the header's button carries the code. Before anyone asks, the
    empty timeline speaks of the students' phones (presenter mode has no prompt box)."""
    presenter = context({"width": width, "height": height})
    presenter.goto(room.url + f"/?key={room.classroom.key}&present=1")
    presenter.wait_for_function("() => window.firstToken && firstToken.state.hello && !document.getElementById('start').hidden")
    words = presenter.inner_text("#start")
    assert "your phones" in words and "box above" not in words, words
    sessions = [student(room, f"Student {i:02d}") for i in range(30)]
    for s in sessions[:3]:
        assert ask(s, room, "What is a token?")[0] == 200
    presenter.wait_for_function("() => firstToken.state.finishedCount >= 3 && document.getElementById('d-why').textContent")
    presenter.wait_for_function("() => document.getElementById('cls-card-count').textContent === '30 joined'")
    presenter.evaluate("firstToken.refresh()")
    got = presenter.evaluate(CLEAR_OF_CARD)
    presenter.screenshot(path=str(ARTIFACTS / f"classroom-card-present-{width}x{height}.png"))
    if got["card"] is None:
        assert got["covered"] == "true" and "owl" in got["button"], got
    else:
        c = got["card"]
        hits = [p for p in got["parts"] if c["left"] < p["right"] and p["left"] < c["right"] and c["top"] < p["bottom"] and p["top"] < c["bottom"]]
        assert hits == [], (c, hits)
    assert {"#d-why", ".timeline-wrap"} <= {p["what"] for p in got["parts"]}   # the check saw them
    assert presenter.errors == []
