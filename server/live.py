"""The live websocket (/ws): hello, then replayed history, then live events, coalesced into one
JSON array per tick; the page's control messages are handled between sends (server/control.py),
and after a `leave` message it sends nothing more.
In classroom mode each connection's hello says its role (presenter or viewer; server/classroom.py),
and that role decides which control messages it may send."""
import json
import logging

from flask import Blueprint
import flask_sock
from flask_sock import Sock
from simple_websocket import Server
from wsproto.events import CloseConnection
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError

from engine.events import Error, Loading
from . import classroom, control
from .state import current

SEND_EVERY_S = 0.05   # coalescing tick for websocket frames
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


flask_sock.Server = BoundedServer   # flask-sock 0.7 makes each connection's Server by this name
sock = Sock()


def _send(conn, events):
    conn.send(json.dumps(events, separators=(",", ":")))


def _idle(conn, backend, sub):
    """After `leave`: send nothing more, and hold the socket open, unread, until the page goes.
    Neither side closes it now: under Werkzeug's server a close while the page is open shows
    in Chromium as an "Invalid frame header" error (flask-sock issue #20)."""
    backend.events.unsubscribe(sub)
    while True:
        conn.receive()   # raises ConnectionClosed, as in the send loop, when the page goes


@sock.route("/ws", bp=bp)
def ws(conn):
    state = current()
    while not state.ready.wait(0.5):
        if state.error:
            _send(conn, [Error(t=0.0, message=f"the model failed to load: {state.error}", fatal=True).to_dict()])
            return
        _send(conn, [Loading(t=0.0, **state.progress).to_dict()])
    backend = state.backend
    role, info, room = classroom.connection_role()
    hello = backend.hello()
    hello.role, hello.classroom = role, info
    sub = backend.events.subscribe()
    try:
        _send(conn, [hello.to_dict()])
        while True:
            raw = conn.receive(timeout=SEND_EVERY_S)
            try:
                out = [e.to_dict() for e in control.handle(backend, raw, role, room)] if raw is not None else []
            except control.Leave:
                _idle(conn, backend, sub)
                return
            except Exception as e:   # a bug, never the client's doing: say so, keep the connection
                log.exception("control message failed")
                out = [control.internal_error(backend, e).to_dict()]
            out += sub.get(timeout=0)
            if out:
                _send(conn, out)
    finally:
        backend.events.unsubscribe(sub)
