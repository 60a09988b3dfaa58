"""Classroom mode (`python app.py --classroom`): one presenter drives the engine from the
projected page; students join from their phones at /join, each with a name and one prompt
at a time, and watch their request on the projection while the answer streams to the phone.

Who can do what:
* The presenter is whoever opened the page with the secret key printed at start
  (`/?key=...`): that request sets an HttpOnly cookie and redirects to the page without the
  key, so the projected address bar never shows it. A page with that cookie is `presenter`;
  every other page is a `viewer`, whose control messages that change anything are refused
  (server/control.py), `sync` and `leave` excepted.
* A student joins (`POST /join/session`: name, and the join code when one is set) and gets a
  client id in an HttpOnly cookie. `POST /join/ask` queues one prompt (source "join", labelled
  with the name) and streams the answer back as server-sent events. Limits: one request in
  flight per client (409), MAX_IN_FLIGHT for the class together (503 `class_busy`: a script
  holding many identities cannot fill the engine's queue), a token bucket per client (429),
  prompts and names bounded (400), a wrong join code (403); a client the presenter removed is refused (403) on every /join route.
  A student who closes the stream has the request cancelled.
* Joins a script cannot exhaust: a token bucket per network address (JOIN_BURST, then one
  every JOIN_EVERY_S; 429), at most MAX_PER_ADDRESS joined from one address (429) and
  MAX_CLIENTS in all (503); removed students free their place, and when full the student
  idle longest (IDLE_EXPIRE_S) gives up theirs. Names are made unique (" (2)") among the students
  in the class (a removed student's name is free again). The join and view codes are compared
  case-insensitively, with spaces at either end trimmed. Every refused
  join is counted (`refused_joins`, in the presenter's class list).
* POST /v1 (the OpenAI API) would let anyone on the network queue unlimited work past these
  limits: in classroom mode it requires the presenter key, as `Authorization: Bearer KEY`
  (the openai client's api_key) or the presenter's cookie. GET /v1/models stays open.
* The presenter's page can clear the queue (every waiting request cancelled) and remove a
  client (its request cancelled, its later requests refused): the `clear_queue` and
  `remove_client` control messages (server/control.py; `Classroom.remove` here).

This module is the classroom's model (the Classroom, its codes, its students, their limits;
no Flask). The web layer reads it through server/classroom_web.py (who a request is, the
addresses and QR code shown, hello's classroom fields) and serves its routes and request
guards from server/join.py.

A removed student can join again from a fresh browser under another name (no accounts; an
address is only a limit, not an identity: a classroom's phones share one behind a NAT): the
presenter removes again, or restarts with a new join code.
"""
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
import hmac
import itertools
import secrets
import threading
import time
import unicodedata

from engine.settings import SettingError
from .errors import ApiError

PRESENTER_COOKIE = "ft_presenter"
CLIENT_COOKIE = "ft_client"
VIEWER_COOKIE = "ft_viewer"
MAX_NAME = 24           # characters of a student's name
MAX_PROMPT = 500        # characters of a student's prompt
MAX_CLIENTS = 500       # students joined at once (each costs a few hundred bytes)
MAX_IN_FLIGHT = 64      # students' requests in flight at once, the class together (503 past it)
MAX_CODE = 64
RATE_BURST = 3          # token bucket: prompts a student may send back to back...
RATE_EVERY_S = 15.0     # ...then one more every this many seconds
JOIN_BURST = 30         # joins one network address may make back to back...
JOIN_EVERY_S = 1.0      # ...then one more every this many seconds (a class behind one NAT: 30 at once)
MAX_PER_ADDRESS = 100   # students joined at once from one network address
IDLE_EXPIRE_S = 600.0   # when the class (or an address) is full, a student idle this long gives up the place
MAX_REMOVED_KEPT = 1000  # removed students remembered (their cookie refused 403); older ones read as not joined
MAX_ADDRESSES = 10000   # join rate buckets kept (full ones are forgotten first)
REMOVED_ADDRESS_S = 600.0   # a removed student's network address may not join again for this long
VIEWER_REFUSED = "viewers cannot change the engine; ask the presenter"
REMOVED = "the presenter removed you from the class"


class Role(StrEnum):
    """A page's role: what hello.role says and which control messages it may send
    (server/control.py). The wire, the page and the tests keep these strings."""
    SOLO = "solo"              # no classroom: the page drives the engine
    PRESENTER = "presenter"    # the page with the presenter's key (its cookie)
    VIEWER = "viewer"          # any other page of a class: it watches, and changes nothing


class Bucket:
    """A token bucket: `burst` takes back to back, then one more every `every_s` seconds."""

    def __init__(self, burst, every_s):
        self.burst, self.every_s = burst, every_s
        self.level, self.at = float(burst), time.monotonic()

    def _refill(self, now):
        self.level = min(self.burst, self.level + (now - self.at) / self.every_s)
        self.at = now

    def take(self, now=None):
        """Take one: 0 when taken, else the seconds until one is there (nothing taken)."""
        self._refill(time.monotonic() if now is None else now)
        if self.level < 1:
            return (1 - self.level) * self.every_s
        self.level -= 1
        return 0

    def give_back(self):
        self.level = min(self.burst, self.level + 1)

    def full(self, now):
        self._refill(now)
        return self.level >= self.burst


@dataclass
class Student:
    id: str
    name: str
    joined: float
    prompts: Bucket                   # the prompt rate limit
    address: str = ""                 # the network address it joined from
    seen: float = 0.0                 # monotonic time of its last request
    request: str | None = None        # the engine request in flight
    asked: int = 0                    # requests queued so far
    removed: bool = False


def clean_name(raw):
    """A name as shown on the projection: control and format characters (newlines, bidi
    overrides, zero-width joiners) removed, whitespace collapsed, at most MAX_NAME
    characters; SettingError when nothing is left."""
    if not isinstance(raw, str):
        raise SettingError("name", "must be a string")
    kept = "".join(" " if c.isspace() else c for c in raw if unicodedata.category(c)[0] != "C" or c.isspace())
    name = " ".join(kept.split())[:MAX_NAME].strip()
    if not name:
        raise SettingError("name", "must have at least one visible character")
    return name


def check_join_code(code, what="join code"):
    """ValueError unless `code` can be typed on a phone and shown: 1..MAX_CODE printable characters."""
    if not code or len(code) > MAX_CODE or not code.isprintable() or code != code.strip():
        raise ValueError(f"the {what} must be 1 to {MAX_CODE} printable characters, "
                         "without spaces at either end")
    return code


def check_view_code(code):
    return check_join_code(code, "view code")


def _fold(code):
    """A code as compared: spaces at either end trimmed, case folded ("OWL", " Owl " and "owl"
    are one code: a phone capitalises the first letter, a projector is read aloud)."""
    return code.strip().casefold().encode()


def same_code(given, code):
    """Whether a typed `given` is `code`, case-insensitively and with spaces trimmed, in constant time."""
    return isinstance(given, str) and hmac.compare_digest(_fold(given), _fold(code))


class Classroom:
    """The classroom's state: the presenter key, the join code, the view code, the students."""

    def __init__(self, join_code=None, base=None, view_code=None, rate_burst=RATE_BURST, rate_every_s=RATE_EVERY_S,
                 max_clients=MAX_CLIENTS, join_burst=JOIN_BURST, join_every_s=JOIN_EVERY_S,
                 max_per_address=MAX_PER_ADDRESS, idle_expire_s=IDLE_EXPIRE_S,
                 removed_address_s=REMOVED_ADDRESS_S, max_in_flight=MAX_IN_FLIGHT):
        if join_code is not None:
            check_join_code(join_code)
        if view_code is not None:
            check_view_code(view_code)
        self.key = secrets.token_urlsafe(18)
        self.join_code = join_code
        self.view_code = view_code    # None: anyone who reaches the port may watch
        self.base = base              # "http://host:port"; None: the address the page was reached at
        self.rate_burst, self.rate_every_s, self.max_clients = rate_burst, rate_every_s, max_clients
        self.join_burst, self.join_every_s = join_burst, join_every_s
        self.max_per_address, self.idle_expire_s = max_per_address, idle_expire_s
        self.removed_address_s = removed_address_s
        self.max_in_flight, self.in_flight = max_in_flight, 0   # students' requests held by a Claim
        self.busy_asks = 0            # prompts refused because the class had max_in_flight
        self.students = {}            # client id -> Student (removed ones too, up to MAX_REMOVED_KEPT)
        self.refused = Counter()      # refused joins by code, for the presenter
        self._joins = {}              # network address -> its join Bucket
        self._blocked = {}            # network address of a removed student -> monotonic time it may join again
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ who may watch
    def is_key(self, *given):
        """Whether any of `given` (a cookie, a bearer token) is the presenter's key, in constant time."""
        return any(hmac.compare_digest(x.encode(), self.key.encode()) for x in given if x)

    def may_view(self, presenter, viewer_cookie):
        """Whether a page may open with its events: always without a view code; with one, the
        `presenter`, or a browser that gave the code (its `viewer_cookie`)."""
        if self.view_code is None or presenter:
            return True
        return bool(viewer_cookie) and same_code(viewer_cookie, self.view_code)

    def try_view_code(self, code, address):
        """True for the right view code; a wrong one counts against the address's join rate
        (as a wrong join code does), so it cannot be guessed fast: ApiError 429 past it."""
        self._attempt(address, "tries")
        return same_code(code, self.view_code)

    def limits(self):
        """The limits the presenter's page shows (hello.classroom.limits)."""
        return {"name_chars": MAX_NAME, "prompt_chars": MAX_PROMPT, "burst": self.rate_burst,
                "every_s": self.rate_every_s, "join_burst": self.join_burst, "join_every_s": self.join_every_s,
                "per_address": self.max_per_address, "students": self.max_clients}

    # ------------------------------------------------------------------ students
    def join(self, name, code, address=""):
        """A new Student, or ApiError: 429 `join_rate_limited` (every attempt from an address
        counts, so a join code cannot be guessed fast), 403 `bad_code`, 400 `bad_name`, 503
        `full`, 429 `address_full`. Every refusal is counted for the presenter (`refuse`)."""
        self._attempt(address)
        if self._blocked.get(address, 0.0) > time.monotonic():
            raise ApiError(403, REMOVED, code="removed")
        if self.join_code is not None and not same_code(code, self.join_code):
            raise ApiError(403, "wrong join code: ask the presenter for it", code="bad_code")
        try:
            name = clean_name(name)
        except SettingError as e:
            raise ApiError(400, f"name: {e.message}", code="bad_name") from None
        with self._lock:
            now = time.monotonic()
            if self._count() >= self.max_clients and not self._expire(now):
                raise ApiError(503, f"the classroom is full ({self.max_clients} joined)", code="full")
            if self._count(address) >= self.max_per_address and not self._expire(now, address):
                raise ApiError(429, f"{self.max_per_address} students have joined from your network "
                                       "address: no more from it", code="address_full")
            student = Student(id=secrets.token_urlsafe(12), name=self._unique(name), joined=time.time(),
                              prompts=Bucket(self.rate_burst, self.rate_every_s), address=address, seen=now)
            self.students[student.id] = student
        return student

    def refuse(self, code):
        """Count a refused join (the presenter's class list shows the counts)."""
        with self._lock:
            self.refused[code or "invalid"] += 1

    def _attempt(self, address, what="joins"):
        """Count an attempt (a join, a view code) against the address's join rate: ApiError 429
        `join_rate_limited` past it."""
        with self._lock:
            wait = self._join_bucket(address).take()
        if wait:
            raise ApiError(429, f"too many {what} from your network: try again in {wait:.0f} s",
                           code="join_rate_limited", retry_after=wait)

    def _join_bucket(self, address):
        bucket = self._joins.get(address)
        if bucket is None:
            if len(self._joins) >= MAX_ADDRESSES:   # forget full buckets first, then the oldest
                now = time.monotonic()
                self._joins = {a: b for a, b in self._joins.items() if not b.full(now)}
                while len(self._joins) >= MAX_ADDRESSES:
                    del self._joins[next(iter(self._joins))]
            bucket = self._joins[address] = Bucket(self.join_burst, self.join_every_s)
        return bucket

    def _count(self, address=None):
        return sum(not s.removed and (address is None or s.address == address) for s in self.students.values())

    def _expire(self, now, address=None):
        """Drop the student (from `address`, or any) idle longest, if idle past idle_expire_s
        with nothing in flight; whether one went. Its cookie then reads as not joined."""
        idle = [s for s in self.students.values() if not s.removed and s.request is None
                and now - s.seen > self.idle_expire_s and (address is None or s.address == address)]
        if not idle:
            return False
        del self.students[min(idle, key=lambda s: s.seen).id]
        return True

    def _unique(self, name):
        """`name`, or with " (2)", " (3)"... when someone in the class has it (case aside). A
        removed student's name is free again: the same person joining again keeps it."""
        taken = {s.name.casefold() for s in self.students.values() if not s.removed}
        if name.casefold() not in taken:
            return name
        for n in itertools.count(2):
            suffix = f" ({n})"
            candidate = name[:MAX_NAME - len(suffix)].rstrip() + suffix
            if candidate.casefold() not in taken:
                return candidate

    def removed(self, client_id):
        """Whether this cookie's student was removed by the presenter."""
        s = self.students.get(client_id or "")
        return s is not None and s.removed

    def student(self, client_id):
        s = self.students.get(client_id or "")
        if s is None:
            raise ApiError(401, "join first: this phone has not joined the class (or the app restarted)",
                              code="not_joined")
        if s.removed:
            raise ApiError(403, REMOVED, code="removed")
        s.seen = time.monotonic()
        return s

    def claim(self, client_id):
        """Admit one request of this client (limits checked): a Claim, or ApiError."""
        with self._lock:
            s = self.student(client_id)
            if s.request is not None:
                raise ApiError(409, "you already have a request in flight: wait for its answer",
                                  code="in_flight")
            if self.in_flight >= self.max_in_flight:   # before the bucket: a busy class spends no prompt
                self.busy_asks += 1
                raise ApiError(503, f"the class has {self.in_flight} prompts in flight: try again in a few seconds",
                               code="class_busy", retry_after=5)
            wait = s.prompts.take()
            if wait:
                raise ApiError(429, f"slow down: one prompt every {self.rate_every_s:g} s "
                                       f"(after {self.rate_burst} in a row); try again in {wait:.0f} s",
                                  code="rate_limited", retry_after=wait)
            s.request = ""            # held until the engine's id is known
            s.asked += 1
            self.in_flight += 1
            return Claim(self, s)

    def remove(self, backend, client_id):
        with self._lock:
            s = self.students.get(client_id if isinstance(client_id, str) else "")
            if s is None:
                raise SettingError("client", "no such client")
            s.removed = True
            now = time.monotonic()
            self._blocked = {a: t for a, t in self._blocked.items() if t > now}
            # The address is this phone's own unless others joined from it too (a NAT): block
            # it then only through the cookie, or the whole network could not join.
            if s.address and not self._count(s.address):
                self._blocked[s.address] = now + self.removed_address_s
            rid = s.request
            gone = [k for k, x in self.students.items() if x.removed]
            for k in gone[:max(0, len(gone) - MAX_REMOVED_KEPT)]:   # the oldest go first
                del self.students[k]
        if rid:
            backend.cancel(rid)

    def roster(self):
        with self._lock:
            return [{"id": s.id, "name": s.name, "joined": s.joined, "asked": s.asked,
                     "in_flight": s.request or None, "removed": s.removed}
                    for s in sorted(self.students.values(), key=lambda s: s.joined)]

    def refused_joins(self):
        """The joins refused so far: {"total", "by_code"}."""
        with self._lock:
            return {"total": sum(self.refused.values()), "by_code": dict(self.refused)}


class Claim:
    """A student's one request in flight, from `Classroom.claim` until `release`. As a context
    manager it is the one place a failure frees the student: leaving the `with` by an exception,
    or without `hand_over()` (the answer's stream then releases it when it closes), releases it.
    A claim released before the engine took its request gives the prompt back to the rate limit."""

    def __init__(self, room, student):
        self.room, self.student, self.rid, self.held = room, student, "", True
        self._handed, self._backend = False, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None or not self._handed:
            if self.rid:                 # the engine took it, but nobody will read the answer
                self._backend.cancel(self.rid)
            self.release()
        return False

    def hand_over(self):
        """The answer's stream owns the claim now; it calls `release` when it ends."""
        self._handed = True

    def started(self, backend, rid):
        """The engine took the request; if the presenter removed this student meanwhile, cancel it."""
        self._backend = backend
        with self.room._lock:
            self.rid = self.student.request = rid
            removed = self.student.removed
        if removed:
            backend.cancel(rid)

    def release(self):
        """The request ended (idempotent: a late call never frees the student's next request)."""
        with self.room._lock:
            if not self.held:
                return
            self.held = False
            s = self.student
            s.request = None
            self.room.in_flight -= 1
            if not self.rid:          # nothing reached the engine: the prompt is not spent
                s.prompts.give_back()
                s.asked -= 1
