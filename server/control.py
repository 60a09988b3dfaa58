"""Page → backend control messages (the websocket's `set`, `submit`, `load`, `burst`,
`reset`, `preset`, `measure`, `reload`, `sync`, `view`, `leave`; in classroom mode the presenter's
`clear_queue` and `remove_client`): parsed and validated here, transport-free, so every bad message
gets an `error` reply naming the field and changes nothing. A classroom viewer may send `sync`,
`view` (its own stream only) and `leave` only."""
from engine.events import Error, Sync
from engine.core.fields import FIELDS
from engine.core.request import GenerateRequest
from engine.settings import SettingError, coerce
from . import inputs
from .classroom import VIEWER_REFUSED, Role
from .errors import ApiError

MAX_MESSAGE_BYTES = 256 * 1024


class Leave(Exception):
    """The page stops listening (it replays a trace now): the transport sends it nothing more."""


def _error(backend, message, field=None):
    return Error(t=backend.clock.now(), message=message, field=field)


def internal_error(backend, exc):
    """The `error` reply to a message whose handling failed inside the server (logged there)."""
    return _error(backend, f"the server failed on this message ({type(exc).__name__}, in its log)",
                  "message")


def _parse(backend, raw):
    """(the message as a dict, None), or (None, the `error` reply) for a frame that is not one."""
    if isinstance(raw, bytes) or raw is None:
        return None, _error(backend, "messages must be JSON text frames", "message")
    if len(raw) > MAX_MESSAGE_BYTES:
        return None, _error(backend, f"message larger than {MAX_MESSAGE_BYTES} bytes", "message")
    try:
        msg = inputs.loads(raw)   # bounded nesting; every string one the tokenizer takes
    except ApiError as e:
        return None, _error(backend, e.message, e.param or "message")
    if not isinstance(msg, dict):
        return None, _error(backend, "message must be a JSON object", "message")
    return msg, None


def _submit(backend, msg, room):
    """A page's own request: its prompt, and any of the registry's fields (engine/core/fields.py)
    by their names; one it leaves out (or sends as null) takes the request's default. `n`: its
    samples, each a request."""
    asked = {f.name: msg[f.name] for f in FIELDS if msg.get(f.name) is not None}
    request = GenerateRequest(prompt=msg.get("prompt"), source="page", chat=msg.get("chat", True), **asked)
    for sample in request.samples():
        backend.submit(sample)


def _sync(backend, msg, room):
    client_t = coerce("client_t", "float", msg.get("client_t"))   # finite: the reply is echoed JSON
    now = backend.clock.now()
    return [Sync(t=now, client_t=client_t, server_time=backend.clock.wall0 + now)]


# Each message type's action: (backend, message, classroom) -> events for this client (sync's
# reply) or None; what the backend answers is not the client's (what changed reaches every page
# as events).
def _set(backend, msg, room):
    backend.update_settings(msg.get("settings"))


def _load(backend, msg, room):
    backend.update_settings({"load": msg.get("on")})


def _burst(backend, msg, room):
    backend.burst(msg.get("n", 8), seed=msg.get("seed"))


def _reset(backend, msg, room):
    backend.reset()


def _preset(backend, msg, room):
    backend.apply_preset(msg.get("name"), msg.get("settings"))


def _measure(backend, msg, room):
    backend.measure()


def _reload(backend, msg, room):
    backend.reload()


def _clear_queue(backend, msg, room):
    backend.clear_queue()


def _remove_client(backend, msg, room):
    room.remove(backend, msg.get("client"))


COMMANDS = {"set": _set, "load": _load, "burst": _burst, "reset": _reset, "preset": _preset,
            "measure": _measure, "reload": _reload, "submit": _submit, "sync": _sync}
CLASSROOM_COMMANDS = {"clear_queue": _clear_queue, "remove_client": _remove_client}   # the presenter's


def _view(msg, stream):
    """This page's own stream: tokens' candidates or not (engine/broadcast.py)."""
    stream.candidates = coerce("candidates", "bool", msg.get("candidates"))


def handle(backend, raw, role=Role.SOLO, classroom=None, stream=None):
    """Apply one raw client message from a page of this `role` (server/classroom.py's Role);
    return the events to send back to that client only, or raise Leave. `classroom`: the
    Classroom, if any; `stream`: the page's subscription, which `view` sets."""
    msg, refusal = _parse(backend, raw)
    if refusal is not None:
        return [refusal]
    kind = msg.get("type")
    if kind == "leave":
        raise Leave()
    if kind == "view" and stream is not None:
        try:
            _view(msg, stream)
        except SettingError as e:
            return [_error(backend, e.message, e.field)]
        return []
    if role == Role.VIEWER and kind != "sync":
        return [_error(backend, VIEWER_REFUSED, "type")]
    action = None
    if isinstance(kind, str):   # (a viewer was refused everything but sync already)
        action = COMMANDS.get(kind) or (CLASSROOM_COMMANDS.get(kind) if classroom is not None else None)
    if action is None:
        return [_error(backend, f"unknown message type {kind!r} (expected set, submit, load, burst, "
                                "reset, preset, measure, reload, sync, view or leave; clear_queue or remove_client in "
                                "classroom mode)", "type")]
    try:
        return action(backend, msg, classroom) or []
    except SettingError as e:
        return [_error(backend, e.message, e.field)]
