"""The live websocket (/ws): hello, then replayed history, then live events, coalesced into one
JSON array per tick; the page's control messages are handled between sends (server/control.py),
and after a `leave` message it sends nothing more.
A connection's thread sleeps until something happens (a message from the page, an event for it,
the close). Past VIEWERS_PER_TICK open pages a viewer's thread is no longer woken by events
(one token woke a thousand threads at once, and they held /healthz and the students back by up
to ~0.9 s); it looks at its buffer on its own tick (0.5 s at 1,000 pages): about 2,000 short
wake-ups a second for a thousand idle pages, spread out instead of herded. At most
`MAX_VIEWERS` pages are open at once; one more is refused with 503 before its upgrade, except
the classroom presenter's. The place is reserved and counted in one step before the upgrade and
given back when the request ends (its websocket closed, or the upgrade never made), so a burst
of handshakes cannot pass the bound together.
In classroom mode each connection's hello says its role (presenter or viewer; server/classroom.py),
and that role decides which control messages it may send."""
import dataclasses
import logging
import time

from functools import wraps

from flask import Blueprint, Response, current_app, g, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed, Server
from wsproto.events import CloseConnection
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError

from engine.broadcast import encode
from engine.events import Error, Loading
from . import classroom_web, control
from .classroom import Role
from .delivery import Delivery
from .errors import ApiError
from .state import current

SEND_EVERY_S = 0.05       # coalescing tick for websocket frames: at most one frame per tick
VIEWERS_PER_TICK = 100    # open pages served at that tick; more stretch it (send_every)
MAX_SEND_EVERY_S = 0.5
bp = Blueprint("live", __name__)
log = logging.getLogger(__name__)


class BoundedServer(Server):
    """simple-websocket's server end, closing with 1009 ("message too big") as soon as a frame's
    header *declares* more than `max_message_size` bytes. simple-websocket itself counts only
    the bytes received, so a header claiming 2^62 bytes followed by a trickle (or nothing)
    would hold the connection, and its thread, open. The header is wsproto's frame decoder's
    (wsproto 1.3, pinned in requirements.txt)."""

    def _handle_events(self):
        keep_going = super()._handle_events()
        if not keep_going or not self.max_message_size:
            return keep_going
        decoder = getattr(getattr(getattr(self.ws, "connection", None), "_proto", None), "_frame_decoder", None)
        header = getattr(decoder, "header", None)
        if header is None or header.payload_len <= self.max_message_size:
            return keep_going
        try:
            self.sock.send(self.ws.send(CloseConnection(CloseReason.MESSAGE_TOO_BIG, "Message is too big")))
        except (OSError, LocalProtocolError):
            pass
        self.event.set()
        return False


class Upgraded(Response):
    """A websocket view's answer once its connection has closed, as flask-sock 0.7 gives it:
    gunicorn's worker is told by StopIteration that the socket was taken over, and writes
    nothing; Werkzeug's server gets an empty response, written after the close."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode    # simple-websocket's name for the server it took the socket from

    def __call__(self, environ, start_response):
        if self.mode == "gunicorn":
            raise StopIteration()
        return super().__call__(environ, start_response)


class BoundedSock(Sock):
    """flask-sock whose connections are BoundedServers. flask-sock 0.7's `route` makes each
    connection from simple-websocket's `Server`, looked up by that name in its own module, and
    has no option for another class (we used to rebind the name at import); this `route` is
    its decorator making a BoundedServer instead: the view gets the connection, which is
    closed after it, and the WSGI server is answered as flask-sock answers it (`Upgraded`)."""

    def route(self, path, bp=None, **kwargs):
        def decorator(view):
            @wraps(view)
            def websocket_route(*args, **kw):
                conn = BoundedServer(request.environ, **current_app.config.get("SOCK_SERVER_OPTIONS", {}))
                try:
                    view(conn, *args, **kw)
                except (ConnectionClosed, ConnectionError):
                    # the page went: seen by simple-websocket (ConnectionClosed), or by the kernel in
                    # the middle of a send (BrokenPipeError, ConnectionResetError): a peer that left,
                    # not a server error, so no 500 and no traceback in the log
                    pass
                try:
                    conn.close()
                except (ConnectionClosed, OSError, LocalProtocolError):   # it was closed already
                    pass
                return Upgraded(conn.mode)
            (bp or self.app).route(path, websocket=True, **kwargs)(websocket_route)
            return websocket_route
        return decorator


sock = BoundedSock()


def _send(conn, events, candidates=True):
    conn.send(encode(events, candidates))


def send_every(state, role):
    """This connection's coalescing tick: SEND_EVERY_S for up to VIEWERS_PER_TICK open pages, then
    longer in proportion (capped at MAX_SEND_EVERY_S), as the engine's events are sent to every
    page and a thousand pages at 20 frames a second would take the CPU the engine needs. The
    presenter's page stays at SEND_EVERY_S."""
    if role == Role.PRESENTER:
        return SEND_EVERY_S
    return min(MAX_SEND_EVERY_S, SEND_EVERY_S * max(1.0, state.viewers.open / VIEWERS_PER_TICK))


def _through(line, events, candidates):
    """Events on their way to this page through its delivery line (as they are when it is off),
    each the size this page gets it at (with tokens' candidates or not)."""
    if not line.active():
        return events
    now = time.monotonic()
    line.push(events, now, [len(e.json if candidates else e.lean) if hasattr(e, "lean") else 0 for e in events])
    return line.take(now)


def crowded(state, role):
    """Past VIEWERS_PER_TICK open pages, an event no longer wakes every viewer's thread at once:
    a thousand threads woken by one token queue for the GIL together, ahead of everything else
    the server answers (/healthz, a student's ask) for a few hundred milliseconds. Each viewer
    looks at its buffer on its own (stretched) tick instead, so their turns spread over time.
    The presenter's page is always woken."""
    return role != Role.PRESENTER and state.viewers.open > VIEWERS_PER_TICK


def _idle(conn, backend, sub):
    """After `leave`: send nothing more, and hold the socket open, unread, until the page goes.
    Neither side closes it now: under Werkzeug's server a close while the page is open shows
    in Chromium as an "Invalid frame header" error (flask-sock issue #20)."""
    backend.events.unsubscribe(sub)
    while True:
        conn.receive()   # raises ConnectionClosed, as in the send loop, when the page goes


@bp.before_app_request
def bound_viewers():
    """Reserve this page's place before its upgrade, or refuse it past MAX_VIEWERS (the
    presenter's never: a class's audience must not lock its teacher out)."""
    if request.path != "/ws":
        return None
    bound = current_app.config["MAX_VIEWERS"]
    room = classroom_web.current()
    if current().viewers.reserve(bound, exempt=room is not None and classroom_web.is_presenter(room)):
        g.viewer_place = True
        return None
    raise ApiError(503, f"this server already has {bound} pages open (--max-viewers): try again later",
                   code="too_many_viewers", retry_after=10)


@bp.teardown_app_request
def free_viewer_place(_exc):
    """The page's place back, once its request ends: the websocket closed, or refused after the
    place was taken (another check, a failed upgrade)."""
    if g.pop("viewer_place", False):
        current().viewers.release()


@sock.route("/ws", bp=bp)
def ws(conn):
    _serve(conn, current())


def _serve(conn, state):
    while not state.ready.wait(0.5):
        if state.error:
            _send(conn, [Error(t=0.0, message=f"the model failed to load: {state.error}", fatal=True).to_dict()])
            return
        _send(conn, [Loading(t=0.0, **state.progress).to_dict()])
    backend = state.backend
    role, info, room = classroom_web.connection_role()
    hello = dataclasses.replace(backend.hello(), role=role, classroom=info)
    # simple-websocket sets conn.event when a message or the close arrives; events set it too,
    # except in a crowd (see `crowded`)
    sub = backend.events.subscribe(wake=lambda: None if crowded(state, role) else conn.event.set())
    line = Delivery(backend.settings)   # this page's proxy buffer and network, when set (server/delivery.py)
    try:
        _send(conn, [hello.to_dict()])
        sent, looked = 0.0, time.monotonic()
        while True:
            now = time.monotonic()
            due = line.wait_s(now)
            if crowded(state, role):   # no wake from events: look at this page's own tick instead
                tick = max(0.0, looked + send_every(state, role) - now)
                due = tick if due is None else min(due, tick)
            conn.event.wait(1.0 if due is None else min(1.0, due))
            looked = time.monotonic()
            conn.event.clear()
            out = []
            # every message that arrived (receive raises ConnectionClosed once the page is gone)
            while (raw := conn.receive(timeout=0)) is not None:
                try:
                    out += [e.to_dict() for e in control.handle(backend, raw, role, room, sub)]
                except control.Leave:
                    _idle(conn, backend, sub)
                    return
                except Exception as e:   # a bug, never the client's doing: say so, keep the connection
                    log.exception("control message failed")
                    out.append(control.internal_error(backend, e).to_dict())
            if not out:   # only events: let more of them join this frame
                time.sleep(max(0.0, sent + send_every(state, role) - time.monotonic()))
            out += _through(line, sub.get(timeout=0), sub.candidates)
            if out:
                _send(conn, out, sub.candidates)
                sent = time.monotonic()
    finally:
        backend.events.unsubscribe(sub)
