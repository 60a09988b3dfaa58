"""Page → backend control messages (the websocket's `set`, `submit`, `load`, `burst`,
`reset`, `preset`, `measure`, `sync`, `leave`; in classroom mode the presenter's `clear_queue`
and `remove_client`): parsed and validated here, transport-free, so every bad message gets an
`error` reply naming the field and changes nothing. A classroom viewer may send `sync` and
`leave` only."""
from engine.events import Error, Sync
from engine.settings import SettingError
from . import inputs
from .classroom import VIEWER_REFUSED
from .openai_api import ApiError

MAX_MESSAGE_BYTES = 256 * 1024


class Leave(Exception):
    """The page stops listening (it replays a trace now): the transport sends it nothing more."""


def _error(backend, message, field=None):
    return Error(t=backend.clock.now(), message=message, field=field)


def internal_error(backend, exc):
    """The `error` reply to a message whose handling failed inside the server (logged there)."""
    return _error(backend, f"the server failed on this message ({type(exc).__name__}, in its log)",
                  "message")


def handle(backend, raw, role="solo", classroom=None):
    """Apply one raw client message from a page of this `role` ("solo", "presenter", "viewer");
    return the events to send back to that client only, or raise Leave. `classroom`: the
    Classroom, if any."""
    if isinstance(raw, bytes) or raw is None:
        return [_error(backend, "messages must be JSON text frames", "message")]
    if len(raw) > MAX_MESSAGE_BYTES:
        return [_error(backend, f"message larger than {MAX_MESSAGE_BYTES} bytes", "message")]
    try:
        msg = inputs.loads(raw)   # bounded nesting; every string one the tokenizer takes
    except ApiError as e:
        return [_error(backend, e.message, e.param or "message")]
    if not isinstance(msg, dict):
        return [_error(backend, "message must be a JSON object", "message")]
    kind = msg.get("type")
    if kind == "leave":
        raise Leave()
    if role == "viewer" and kind != "sync":
        return [_error(backend, VIEWER_REFUSED, "type")]
    try:
        if kind == "set":
            backend.update_settings(msg.get("settings"))
        elif kind == "load":
            backend.update_settings({"load": msg.get("on")})
        elif kind == "burst":
            backend.burst(msg.get("n", 8), seed=msg.get("seed"))
        elif kind == "reset":
            backend.reset()
        elif kind == "preset":
            backend.apply_preset(msg.get("name"), msg.get("settings"))
        elif kind == "measure":
            backend.measure()
        elif kind == "submit":
            chat = msg.get("chat", True)
            if not isinstance(chat, bool):
                raise SettingError("chat", "must be true or false")
            backend.submit(prompt=msg.get("prompt"), source="page", chat=chat,
                           max_new_tokens=msg.get("max_new_tokens"), temperature=msg.get("temperature"),
                          top_p=msg.get("top_p"), seed=msg.get("seed"))
        elif kind == "sync":
            client_t = msg.get("client_t")
            if isinstance(client_t, bool) or not isinstance(client_t, (int, float)):
                raise SettingError("client_t", "must be a number")
            now = backend.clock.now()
            return [Sync(t=now, client_t=client_t, server_time=backend.clock.wall0 + now)]
        elif kind == "clear_queue" and classroom is not None:   # (a viewer was refused above)
            backend.clear_queue()
        elif kind == "remove_client" and classroom is not None:
            classroom.remove(backend, msg.get("client"))
        else:
            return [_error(backend, f"unknown message type {kind!r} (expected set, submit, load, burst, "
                                    "reset, preset, measure, sync or leave; clear_queue or remove_client in classroom "
                                    "mode)", "type")]
    except SettingError as e:
        return [_error(backend, e.message, e.field)]
    return []
