"""Classroom mode (server/classroom.py) on the in-process app with the tiny model: students
join over HTTP on loopback (one `requests` session each, as separate phones), their requests
appear labelled in the event stream and their answers reach only them; the limits hold (one
request in flight, the rate limit, the join code, names and prompts); the presenter's page
(its key as a cookie) controls the engine and manages the class while a viewer's cannot; /v1
needs the presenter key; and the start-up printout names the addresses."""
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest
import requests
from simple_websocket import Client, ConnectionError as WsRefused

import app as app_mod
from engine import EngineConfig
from engine.core.request import GenerateRequest
from engine.settings import SettingError
from helpers import collect, frames, schema_validator, wait_until
from server.classroom import (JOIN_BURST, JOIN_EVERY_S, MAX_CLIENTS, MAX_NAME, MAX_PER_ADDRESS, MAX_PROMPT,
                              VIEWER_REFUSED, Classroom, clean_name)
from server.classroom_web import base_url, lan_address

NAMES = ["Ada", "Grace", "Alan", "Katherine"]


@pytest.fixture
def room(tiny):
    """The app in classroom mode with join code "owl"; students get 2 prompts in a row, then
    one a minute. `room.gate` paused (cleared) holds every request in the queue: the engine
    thread keeps draining its inbox (cancels, clearing) but runs no step."""
    from helpers import LiveApp
    classroom = Classroom(join_code="owl", rate_burst=2, rate_every_s=60)
    live = LiveApp(tiny, EngineConfig(slots=4, kv_tokens=4096, max_context=512), classroom=classroom)
    live.classroom = classroom
    classroom.base = live.url   # as app.py sets it at start: the address students reach
    live.driver.update_settings({"max_new_tokens": 6})
    wait_until(lambda: live.driver.settings.now.sampling.max_new_tokens == 6, 30, "max_new_tokens applied")
    eng, step = live.driver.engine, live.driver.engine.step
    live.gate = threading.Event()
    live.gate.set()

    def gated():
        if not live.gate.wait(0.01):   # shut: a turn waiting for it to open (the inbox drains between)
            return []
        return step()
    eng.step = gated
    yield live
    live.gate.set()
    live.stop()


def student(room, name, code="owl"):
    s = requests.Session()
    r = s.post(room.url + "/join/session", json={"name": name, "code": code}, timeout=10)
    assert r.status_code == 200, r.text
    return s


def ask(session, room, prompt, events=None, timeout=60):
    """POST /join/ask; (status, parsed SSE events) — events also appended to `events` as they come."""
    events = [] if events is None else events
    with session.post(room.url + "/join/ask", json={"prompt": prompt}, stream=True, timeout=timeout) as r:
        if r.status_code != 200:
            return r.status_code, r.json()
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return 200, events


def presenter_ws(room):
    return Client.connect(room.ws_url, headers={"Cookie": f"ft_presenter={room.classroom.key}"})


def hello_of(conn):
    (hello, *_) = json.loads(conn.receive(timeout=10))
    assert hello["type"] == "hello"
    return hello


def has_error(events):
    return any(e["type"] == "error" for e in events)


# ------------------------------------------------------------------ students


def test_students_requests_appear_labelled_and_each_answer_reaches_only_its_student(room):
    sub = room.driver.events.subscribe(replay=False)
    sessions = {name: student(room, name) for name in NAMES}
    results = {}

    def run(name):
        results[name] = ask(sessions[name], room, f"{name} asks: what is a token?")
    threads = [threading.Thread(target=run, args=(n,)) for n in NAMES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    events = collect(sub, lambda evs: sum(e["type"] == "finished" for e in evs) >= len(NAMES), timeout=30)
    check = schema_validator()
    for e in events:
        check.validate(e)
    requests_by_label = {e["label"]: e for e in events if e["type"] == "request"}
    assert set(requests_by_label) == set(NAMES)
    texts = set()
    for name in NAMES:
        status, got = results[name]
        assert status == 200, got
        start, *tokens, fin = got
        rid = requests_by_label[name]["id"]
        assert requests_by_label[name]["source"] == "join" and name in requests_by_label[name]["preview"]
        assert start == {"type": "start", "id": rid, "name": name}
        assert fin["type"] == "finished" and fin["reason"] in ("stop", "length")
        (engine_fin,) = [e for e in events if e["type"] == "finished" and e["id"] == rid]
        # the phone gets exactly its own request's tokens and the engine's own measurements
        mine = [e["text"] for e in events if e["type"] == "token" and e["id"] == rid]
        assert [t["text"] for t in tokens] == mine and len(mine) == engine_fin["output_tokens"] >= 1
        # and how sure the model was of each (the phone marks the unsure ones), as the page is told
        assert [t["p_raw"] for t in tokens] == [e["p_raw"] for e in events if e["type"] == "token" and e["id"] == rid]
        assert all(0 < t["p_raw"] <= 1 for t in tokens)
        assert fin["ttft"] == engine_fin["ttft"] > 0 and fin["tpot"] == engine_fin["tpot"]
        assert fin["output_tokens"] == engine_fin["output_tokens"] and engine_fin["source"] == "join"
        texts.add((rid, "".join(mine)))
    assert len({rid for rid, _ in texts}) == len(NAMES)
    roster = {c["name"]: c for c in room.classroom.roster()}
    assert set(roster) == set(NAMES) and all(c["asked"] == 1 and c["in_flight"] is None for c in roster.values())


def test_one_request_in_flight_per_student_then_the_rate_limit(room):
    ada = student(room, "Ada")
    room.gate.clear()   # the first request waits in the queue
    first = []
    t = threading.Thread(target=ask, args=(ada, room, "one", first))
    t.start()
    wait_until(lambda: first, 30, "the first ask accepted")
    status, body = ask(ada, room, "two")
    assert status == 409 and body["error"]["code"] == "in_flight"
    other = student(room, "Grace")   # another student is not held up by Ada's limit
    second = []
    t2 = threading.Thread(target=ask, args=(other, room, "hello", second))
    t2.start()
    wait_until(lambda: second, 30, "the other student's ask accepted")
    room.gate.set()
    t.join(30)
    t2.join(30)
    assert first[-1]["type"] == "finished" and second[-1]["type"] == "finished"
    # 2 in a row allowed (the 409 did not spend one), then one a minute
    assert ask(ada, room, "again")[0] == 200
    r = ada.post(room.url + "/join/ask", json={"prompt": "and again"}, timeout=10)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 60 and "slow down" in r.json()["error"]["message"]


def test_the_class_together_has_a_bound_on_requests_in_flight(room):
    """Many identities (a script that joined many times) cannot fill the engine's queue: past
    the class-wide bound an ask is 503 `class_busy`, spends no prompt, and the presenter sees it;
    once a request ends, the next student's ask goes in."""
    room.classroom.max_in_flight = 2
    room.gate.clear()
    held = [[], []]
    threads = [threading.Thread(target=ask, args=(student(room, n), room, "hi", held[i]))
               for i, n in enumerate(NAMES[:2])]
    for t in threads:
        t.start()
    wait_until(lambda: all(held), 30, "both asks accepted")
    third = student(room, NAMES[2])
    r = third.post(room.url + "/join/ask", json={"prompt": "me too"}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "class_busy" and r.headers["Retry-After"]
    clients = requests.get(room.url + "/classroom/clients", cookies={"ft_presenter": room.classroom.key},
                           timeout=10).json()
    assert clients["in_flight"] == {"now": 2, "max": 2, "refused": 1}
    room.gate.set()
    for t in threads:
        t.join(30)
    assert all(h[-1]["type"] == "finished" for h in held)
    wait_until(lambda: room.classroom.in_flight == 0, 30, "no request in flight")
    # rate_burst is 2: the refused ask spent none, so two go in back to back
    assert ask(third, room, "now")[0] == 200 and ask(third, room, "again")[0] == 200


def test_join_code_names_and_prompts_are_checked(room):
    s = requests.Session()
    for code in (None, "", "owls", "o wl", "0wl", 5):
        r = s.post(room.url + "/join/session", json={"name": "Eve", "code": code}, timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "bad_code", code
    for bad in ("", "   ", "\n\t\r", "\x00\x07\u200b\u202e", None, 12, ["Ada"]):
        r = s.post(room.url + "/join/session", json={"name": bad, "code": "owl"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_name", bad
    assert s.post(room.url + "/join/session", data="not json", timeout=10).status_code == 400
    assert room.classroom.students == {}
    r = s.post(room.url + "/join/session", json={"name": "  Ada\u202e\n  Love\x00lace" + "x" * 40, "code": "owl"},
               timeout=10)
    assert r.status_code == 200
    name = r.json()["name"]
    assert name == ("Ada Lovelace" + "x" * 40)[:MAX_NAME] and s.get(room.url + "/join/session").json() == {"joined": True, "name": name}
    for prompt in ("", "   ", "x" * (MAX_PROMPT + 1), None):
        r = s.post(room.url + "/join/ask", json={"prompt": prompt}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_prompt", prompt
    # never joined (no cookie, or a made-up one)
    for cookies in ({}, {"ft_client": "made-up"}):
        r = requests.post(room.url + "/join/ask", json={"prompt": "hi"}, cookies=cookies, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "not_joined"
        r = requests.get(room.url + "/join/session", cookies=cookies, timeout=10)
        assert r.status_code == 200 and r.json() == {"joined": False}


def test_bad_input_on_join_is_a_400_and_frees_the_student(room):
    """Nesting, a lone surrogate and a NUL at /join/session and /join/ask: each a 400 naming
    the problem, then the same phone joins and asks. A refusal after the claim (the engine's
    NUL check) frees the student and spends no prompt: three of them, then the two in a row the
    rate limit allows still go through."""
    s = requests.Session()
    for raw, code in (("[" * 10000, "nested_too_deeply"), ('{"name": "\\ud800", "code": "owl"}', "invalid_text")):
        r = s.post(room.url + "/join/session", data=raw, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    s = student(room, "Ada")
    for raw, code in (("[" * 10000, "nested_too_deeply"), ('{"prompt": "hi \\udfff"}', "invalid_text"),
                      ('{"prompt": "a\\u0000b"}', "bad_prompt"), ('{"prompt": "\\u0000"}', "bad_prompt"),
                      ('{"prompt": "x\\u0000"}', "bad_prompt")):
        r = s.post(room.url + "/join/ask", data=raw, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
        assert code == "nested_too_deeply" or r.json()["error"]["param"] == "prompt"
    assert ask(s, room, "first")[1][-1]["type"] == "finished"
    assert ask(s, room, "second")[1][-1]["type"] == "finished"
    (ada,) = room.classroom.roster()
    assert ada["asked"] == 2 and ada["in_flight"] is None


def test_a_student_whose_request_failed_in_the_server_can_ask_again(room, monkeypatch):
    """Issue 25's lock-out: a failure after the claim (here the tokenizer's TypeError on a lone
    surrogate, had it got that far) used to leave the student `409 in_flight` for good."""
    s = student(room, "Ada")
    submit, calls = room.driver.submit, []

    def failing(request):
        calls.append(request)
        if len(calls) == 1:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")
        return submit(request)
    monkeypatch.setattr(room.driver, "submit", failing)
    r = s.post(room.url + "/join/ask", json={"prompt": "boom"}, timeout=10)
    assert r.status_code == 500
    assert room.classroom.roster()[0]["in_flight"] is None
    status, events = ask(s, room, "again")
    assert status == 200 and events[-1]["type"] == "finished" and len(calls) == 2


def phone(room, address):
    """A test client of the app as a phone at network address `address`."""
    client = room.app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def join_as(client, name, code="owl"):
    return client.post("/join/session", json={"name": name, "code": code})


@pytest.fixture
def clock(monkeypatch):
    """The classroom's monotonic clock, synthetic: a microsecond on at each reading (so its
    events keep their order), and as far as the test moves `.t`."""
    from server import classroom as classroom_mod
    now = SimpleNamespace(t=time.monotonic())

    def monotonic():
        now.t += 1e-6
        return now.t
    monkeypatch.setattr(classroom_mod, "time", SimpleNamespace(monotonic=monotonic, time=time.time))
    return now


def test_a_join_flood_from_one_address_is_capped_while_another_student_joins(room, clock):
    """1,000 joins from one address: its burst (30), then one a second (on the classroom's
    clock, synthetic here), every other one a 429 `join_rate_limited` with Retry-After, all
    counted on the presenter's class list; a student on another address joins and asks meanwhile."""
    bot = phone(room, "10.0.0.66")
    replies = [join_as(bot, f"bot{i}") for i in range(999)]
    assert [r.status_code for r in replies].count(200) == 30            # the burst, in a few ms of its clock
    clock.t += 1.0
    replies += [join_as(bot, "bot999"), join_as(bot, "bot1000")]
    assert [r.status_code for r in replies[-2:]] == [200, 429]         # one more a second
    ok = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code != 200]
    assert len(ok) == 31
    assert all(r.status_code == 429 and r.get_json()["error"]["code"] == "join_rate_limited"
               and 1 <= int(r.headers["Retry-After"]) <= 2 and "try again" in r.get_json()["error"]["message"]
               for r in refused)
    grace = student(room, "Grace")           # 127.0.0.1: another address
    assert ask(grace, room, "am I in?")[1][-1]["type"] == "finished"
    r = requests.get(room.url + "/classroom/clients", cookies={"ft_presenter": room.classroom.key}, timeout=10)
    assert r.json()["refused_joins"] == {"total": len(refused), "by_code": {"join_rate_limited": len(refused)}}
    assert len(r.json()["clients"]) == len(ok) + 1


def test_a_wrong_code_counts_against_the_join_rate(room):
    guesser = phone(room, "10.0.0.7")
    codes = [join_as(guesser, "Eve", code=f"guess{i}").get_json()["error"]["code"] for i in range(40)]
    assert codes[:30] == ["bad_code"] * 30 and set(codes[31:]) == {"join_rate_limited"}


def test_the_per_address_cap_and_places_freed_by_removal_and_idle_expiry(room, clock):
    c = room.classroom
    c.join_burst, c.max_per_address, c.max_clients = 1000, 3, 4
    phones = {name: phone(room, "10.0.0.8") for name in "ABCD"}     # one network, four phones
    for name in "ABC":
        assert join_as(phones[name], name).status_code == 200
    r = join_as(phones["D"], "D")
    assert r.status_code == 429 and r.get_json()["error"]["code"] == "address_full"
    (a_id,) = [k for k, s in c.students.items() if s.name == "A"]
    c.remove(room.driver, a_id)                      # the presenter removes A: its place is free
    assert join_as(phones["D"], "D").status_code == 200
    assert join_as(phone(room, "10.0.0.9"), "E").status_code == 200
    r = join_as(phone(room, "10.0.0.10"), "F")
    assert r.status_code == 503 and r.get_json()["error"]["code"] == "full"   # B, C, D, E
    assert phones["B"].get("/join/session").get_json() == {"joined": True, "name": "B"}   # B was seen last
    c.idle_expire_s = 0.2
    clock.t += 0.3   # all idle past the expiry: the next join takes the longest idle place
    assert join_as(phone(room, "10.0.0.10"), "F").status_code == 200
    assert sorted(s.name for s in c.students.values() if not s.removed) == ["B", "D", "E", "F"]
    r = phones["C"].get("/join/session")             # C expired: join again
    assert r.status_code == 200 and r.get_json() == {"joined": False}
    assert phones["C"].post("/join/ask", json={"prompt": "hi"}).status_code == 401
    assert c.refused_joins()["by_code"] == {"address_full": 1, "full": 1}


def test_names_are_made_unique(room):
    c = room.classroom
    c.join_burst = 1000
    p = phone(room, "10.0.0.11")
    got = [join_as(p, n).get_json()["name"] for n in ("Ada", "Ada", "ada", " Ada\n", "Ada (2)")]
    assert got == ["Ada", "Ada (2)", "ada (3)", "Ada (4)", "Ada (2) (2)"]
    long = "x" * MAX_NAME
    assert [join_as(p, long).get_json()["name"] for _ in range(2)] == [long, "x" * (MAX_NAME - 4) + " (2)"]


def test_a_removed_device_is_refused_on_every_join_route(room):
    ada = phone(room, "10.0.0.12")
    assert join_as(ada, "Ada").status_code == 200
    (client_id,) = [k for k, s in room.classroom.students.items() if s.name == "Ada"]
    room.classroom.remove(room.driver, client_id)
    assert ada.get("/join").status_code == 403
    for r in (ada.get("/join/session"), join_as(ada, "Ada again"), ada.post("/join/ask", json={"prompt": "hi"})):
        assert r.status_code == 403 and r.get_json()["error"]["code"] == "removed"
    assert room.classroom.refused_joins() == {"total": 1, "by_code": {"removed": 1}}
    fresh = phone(room, "10.0.0.12")                 # a fresh browser at that address: refused too, for a while
    assert join_as(fresh, "Ada").get_json()["error"]["code"] == "removed"
    assert join_as(phone(room, "10.0.0.13"), "Grace").status_code == 200   # other addresses join
    room.classroom._blocked["10.0.0.12"] = time.monotonic()   # as after removed_address_s
    # the same person joining again keeps the name: a removed student's is free again
    assert join_as(fresh, "Ada").get_json()["name"] == "Ada"
    page = ada.get("/join")                          # a reload of the removed phone: a page that says so
    assert page.status_code == 403 and page.headers["Content-Type"].startswith("text/html")
    assert 'data-code="removed"' in page.text and "removed you from the class" in page.text
    assert "ft-classroom.css" in page.text           # styled as the join page is


def test_join_codes_are_compared_case_insensitively_with_spaces_trimmed(room):
    """A phone typing "OWL", or capitalising it to "Owl", or a stray space: the same code; none
    counts as a bad code. Anything else is still refused."""
    c = room.classroom
    names = []
    for i, code in enumerate(("OWL", " Owl ", "owl", "oWl\t")):
        r = phone(room, f"10.0.1.{i}").post("/join/session", json={"name": f"P{i}", "code": code})
        assert r.status_code == 200, (code, r.get_json())
        names.append(r.get_json()["name"])
    assert names == ["P0", "P1", "P2", "P3"]
    assert c.refused_joins() == {"total": 0, "by_code": {}}
    r = phone(room, "10.0.1.9").post("/join/session", json={"name": "Eve", "code": "OWLS"})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "bad_code"
    assert c.refused_joins() == {"total": 1, "by_code": {"bad_code": 1}}


def test_clean_name():
    assert clean_name(" a\tb  c ") == "a b c"
    assert clean_name("\u202eevil\u200d") == "evil"
    assert len(clean_name("é" * 100)) == MAX_NAME
    with pytest.raises(SettingError):
        clean_name("\x1b\x00\u200b")


def test_a_student_who_leaves_has_the_request_cancelled(room):
    sub = room.driver.events.subscribe(replay=False)
    ada = student(room, "Ada")
    room.gate.clear()
    r = ada.post(room.url + "/join/ask", json={"prompt": "long wait"}, stream=True, timeout=10)
    line = next(x for x in r.iter_lines(decode_unicode=True) if x.startswith("data: "))
    rid = json.loads(line[6:])["id"]
    r.close()   # the phone closes the stream
    evs = []
    wait_until(lambda: evs.extend(sub.get(timeout=0.2)) or
               any(e["type"] == "finished" and e["id"] == rid for e in evs), 30, "the closed stream's request finished")
    (fin,) = [e for e in evs if e["type"] == "finished" and e["id"] == rid]
    assert fin["reason"] == "cancelled"
    wait_until(lambda: room.classroom.roster()[0]["in_flight"] is None, 30, "the roster shows nothing in flight")


# ------------------------------------------------------------------ presenter and viewers


def test_the_presenter_key_becomes_a_cookie_and_a_wrong_one_is_refused(room):
    r = requests.get(room.url + "/?key=wrong", allow_redirects=False, timeout=10)
    assert r.status_code == 403
    r = requests.get(room.url + f"/?key={room.classroom.key}&rate=2", allow_redirects=False, timeout=10)
    assert r.status_code == 302 and r.headers["Location"] == "/?rate=2"
    cookie = r.headers["Set-Cookie"]
    assert f"ft_presenter={room.classroom.key}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_a_view_code_keeps_the_page_and_its_events_to_the_class(tiny):
    """--view-code: without the code the pages answer a form (403) and /ws is refused before its
    upgrade; ?view=CODE becomes a cookie that opens both; the presenter needs none; wrong codes
    count against the address's join rate; students still join and ask at /join."""
    from helpers import LiveApp
    classroom = Classroom(join_code="owl", view_code="heron", join_burst=5, join_every_s=60)
    live = LiveApp(tiny, EngineConfig(slots=4, kv_tokens=4096, max_context=512), classroom=classroom)
    classroom.base = live.url
    live.classroom = classroom
    try:
        for path in ("/", "/embed"):
            r = requests.get(live.url + path, timeout=10)
            assert r.status_code == 403 and 'name="view"' in r.text
        with pytest.raises(WsRefused):
            Client.connect(live.ws_url)
        r = requests.get(live.url + "/ws", timeout=10, headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "view_code_required"
        r = requests.get(live.url + "/?view=heron&theme=light", allow_redirects=False, timeout=10)
        assert r.status_code == 302 and r.headers["Location"] == "/?theme=light"
        assert "ft_viewer=heron" in r.headers["Set-Cookie"] and "HttpOnly" in r.headers["Set-Cookie"]
        viewer = requests.Session()
        assert viewer.get(live.url + "/?view=heron", timeout=10).status_code == 200   # follows to the page
        assert viewer.get(live.url + "/embed", timeout=10).status_code == 200
        conn = Client.connect(live.ws_url, headers={"Cookie": "ft_viewer=heron"})
        assert hello_of(conn)["role"] == "viewer"
        conn.close()
        conn = presenter_ws(live)
        hello = hello_of(conn)
        assert hello["role"] == "presenter" and hello["classroom"]["view_url"] == live.url + "/?view=heron"
        conn.close()
        s = student(live, "Ada")                      # /join needs the join code, not the view code
        assert ask(s, live, "hello")[0] == 200
        # every try counts (two right ones and a join so far): two wrong codes, then the join rate
        # (5 attempts in a row) refuses even the right one
        for _ in range(2):
            r = requests.get(live.url + "/?view=crane", timeout=10)
            assert r.status_code == 403 and "not this class" in r.text
        r = requests.get(live.url + "/?view=heron", allow_redirects=False, timeout=10)
        assert r.status_code == 429 and r.json()["error"]["code"] == "join_rate_limited"
    finally:
        live.stop()


def test_hello_says_each_connection_its_role(room):
    viewer, presenter = Client.connect(room.ws_url), presenter_ws(room)
    try:
        v, p = hello_of(viewer), hello_of(presenter)
    finally:
        viewer.close()
        presenter.close()
    schema_validator().validate(v)
    schema_validator().validate(p)
    assert v["role"] == "viewer" and p["role"] == "presenter"
    assert v["classroom"] == {"join_url": room.url + "/join", "code_required": True}   # no code for viewers
    room_p = p["classroom"]
    assert room_p["join_code"] == "owl" and room_p["join_url_with_code"] == room.url + "/join?code=owl"
    assert room_p["qr_svg"].startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in room_p["qr_svg"]
    assert "http" not in room_p["qr_svg"].split(">", 1)[1]   # a QR code of paths, nothing fetched
    assert room_p["view_url"] is None and room_p["limits"] == {
        "name_chars": MAX_NAME, "prompt_chars": MAX_PROMPT, "burst": 2, "every_s": 60,
        "join_burst": JOIN_BURST, "join_every_s": JOIN_EVERY_S, "per_address": MAX_PER_ADDRESS,
        "students": MAX_CLIENTS}


def test_a_viewer_cannot_change_the_engine_but_the_presenter_can(room):
    before = room.driver.settings.now
    sub = room.driver.events.subscribe(replay=False)
    viewer = Client.connect(room.ws_url)
    try:
        hello_of(viewer)
        refused = [{"type": "set", "settings": {"rate": 4.0}}, {"type": "load", "on": True}, {"type": "burst", "n": 3},
                   {"type": "reset"}, {"type": "submit", "prompt": "hi"}, {"type": "preset", "name": "idle"},
                   {"type": "measure"}, {"type": "clear_queue"}, {"type": "remove_client", "client": "x"}]
        for msg in refused:
            viewer.send(json.dumps(msg))
        viewer.send(json.dumps({"type": "view", "candidates": True}))   # its own stream: allowed
        viewer.send(json.dumps({"type": "sync", "client_t": 7.0}))
        got = frames(viewer, 10, until=lambda ev: any(e["type"] == "sync" for e in ev) and
                     sum(e["type"] == "error" for e in ev) >= len(refused))
        assert room.driver.events.candidates_shown()
    finally:
        viewer.close()
    errors = [e for e in got if e["type"] == "error"]
    assert len(errors) == len(refused) and all(e["message"] == VIEWER_REFUSED and e["field"] == "type" for e in errors)
    assert any(e["type"] == "sync" and e["client_t"] == 7.0 for e in got)
    # A marker after them: the engine thread applies its inbox in order, so once the marker's
    # settings event is out, a refused message that got through would have landed before it.
    room.driver.update_settings({"max_new_tokens": before.sampling.max_new_tokens})
    marked = collect(sub, lambda evs: any(e["type"] == "settings" and e["changed"] == ["max_new_tokens"] for e in evs))
    assert room.driver.settings.now == before
    assert not [e for e in marked + sub.get(timeout=0) if e["type"] in ("request", "reset", "preset", "measure") or
                (e["type"] == "settings" and "max_new_tokens" not in e["changed"])]
    presenter = presenter_ws(room)
    try:
        hello_of(presenter)
        presenter.send(json.dumps({"type": "set", "settings": {"rate": 4.0}}))
        got = frames(presenter, 10, until=lambda ev: any(e["type"] == "settings" and "rate" in e["changed"] for e in ev))
    finally:
        presenter.close()
    assert not [e for e in got if e["type"] == "error"] and room.driver.settings.now.load.rate == 4.0


def test_the_presenter_clears_the_queue_and_removes_a_student(room):
    sub = room.driver.events.subscribe(replay=False)
    sessions = {name: student(room, name) for name in NAMES}
    room.gate.clear()
    streams = {name: [] for name in NAMES}
    threads = [threading.Thread(target=ask, args=(sessions[n], room, f"{n} waits", streams[n])) for n in NAMES]
    for t in threads:
        t.start()
    wait_until(lambda: all(streams.values()), 30, "every student's ask accepted")
    ids = {n: streams[n][0]["id"] for n in NAMES}
    presenter, viewer = presenter_ws(room), Client.connect(room.ws_url)
    try:
        hello_of(presenter)
        hello_of(viewer)
        ada = next(c["id"] for c in room.classroom.roster() if c["name"] == "Ada")
        viewer.send(json.dumps({"type": "remove_client", "client": ada}))
        assert [e["message"] for e in frames(viewer, 5, until=has_error) if e["type"] == "error"] == [VIEWER_REFUSED]
        presenter.send(json.dumps({"type": "remove_client", "client": "nobody"}))
        (err,) = [e for e in frames(presenter, 5, until=has_error)
                  if e["type"] == "error"]
        assert err["field"] == "client"
        presenter.send(json.dumps({"type": "remove_client", "client": ada}))
        threads[0].join(10)
        assert streams["Ada"][-1]["type"] == "error" and streams["Ada"][-1]["code"] == "cancelled"
        assert all(t.is_alive() for t in threads[1:])   # the others still wait
        assert all(streams[n][-1]["type"] == "start" for n in NAMES[1:])
        presenter.send(json.dumps({"type": "clear_queue"}))
        for t in threads[1:]:
            t.join(10)
    finally:
        presenter.close()
        viewer.close()
        room.gate.set()
    for n in NAMES[1:]:
        assert streams[n][-1] == {"type": "error", "code": "cancelled", "message": streams[n][-1]["message"]}
    evs = sub.get(timeout=1)
    assert {e["id"] for e in evs if e["type"] == "finished" and e["reason"] == "cancelled"} == set(ids.values())
    r = sessions["Ada"].post(room.url + "/join/ask", json={"prompt": "back?"}, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "removed"
    assert ask(sessions["Grace"], room, "after the clearing")[1][-1]["type"] == "finished"


def test_clients_list_is_the_presenters_only(room):
    student(room, "Ada")
    assert requests.get(room.url + "/classroom/clients", timeout=10).status_code == 403
    r = requests.get(room.url + "/classroom/clients", cookies={"ft_presenter": room.classroom.key}, timeout=10)
    assert [c["name"] for c in r.json()["clients"]] == ["Ada"]


def test_the_api_needs_the_presenter_key_in_classroom_mode(room):
    body = {"model": room.driver.api_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = requests.post(room.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 403 and r.json()["error"]["code"] == "classroom_presenter_only"
    r = requests.post(room.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403
    r = requests.post(room.url + "/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {room.classroom.key}"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert requests.get(room.url + "/v1/models", timeout=10).status_code == 200


# ------------------------------------------------------------------ outside classroom mode


def test_solo_mode_is_unchanged(live):
    conn = Client.connect(live.ws_url)
    try:
        hello = hello_of(conn)
        conn.send(json.dumps({"type": "clear_queue"}))
        (err,) = [e for e in frames(conn, 5, until=has_error) if e["type"] == "error"]
    finally:
        conn.close()
    assert hello["role"] == "solo" and hello["classroom"] is None and err["field"] == "type"
    assert requests.get(live.url + "/join", timeout=10).status_code == 404
    r = requests.post(live.url + "/join/session", json={"name": "Ada"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_classroom"
    r = requests.get(live.url + "/join/session", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_classroom"


def test_the_engine_checks_a_label(live):
    for bad in (5, "", "x" * 65):
        with pytest.raises(SettingError) as e:
            live.driver.submit(GenerateRequest(prompt="hi", label=bad))
        assert e.value.field == "label"


# ------------------------------------------------------------------ start-up


def test_classroom_start_binds_the_network_unless_told_and_prints_the_addresses():
    args = app_mod.parse_args(["--classroom", "--join-code", "owl", "--port", "5050"])
    assert args.host == "0.0.0.0"
    assert app_mod.parse_args(["--classroom", "--host", "127.0.0.1"]).host == "127.0.0.1"
    assert app_mod.parse_args([]).host == "127.0.0.1"
    ip = lan_address()
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", ip)
    room = Classroom(join_code="owl", base=base_url(args.host, args.port))
    text = "\n".join(app_mod.classroom_banner(args, room))
    assert "WARNING" in text and "anyone on this network" in text
    assert f"http://{ip}:5050/?key={room.key}" in text and f"http://{ip}:5050/join" in text and "owl" in text
    assert Classroom().key != room.key   # random per start
    loop = app_mod.parse_args(["--classroom", "--host", "127.0.0.1"])
    text = "\n".join(app_mod.classroom_banner(loop, Classroom(base=base_url(loop.host, loop.port))))
    assert "WARNING" not in text and "http://127.0.0.1:5000/join" in text
    viewing = app_mod.parse_args(["--classroom", "--view-code", "heron"])
    text = "\n".join(app_mod.classroom_banner(viewing, Classroom(view_code=viewing.view_code,
                                                                  base=base_url(loop.host, loop.port))))
    assert "http://127.0.0.1:5000/?view=heron" in text


@pytest.mark.parametrize("argv", [["--join-code", "x"], ["--classroom", "--join-code", " x"],
                                  ["--view-code", "x"], ["--classroom", "--view-code", ""],
                                  ["--observe-api-key", "k"]])
def test_bad_classroom_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        app_mod.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_a_classroom_may_observe_another_server():
    """`--classroom --observe URL` is a class on an observed server (tests/server/test_observe.py runs one)."""
    args = app_mod.parse_args(["--classroom", "--observe", "http://127.0.0.1:9/v1", "--observe-api-key", "k"])
    assert args.classroom and args.observe == "http://127.0.0.1:9/v1" and args.observe_api_key == "k"
