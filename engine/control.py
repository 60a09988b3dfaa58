"""Client → engine control messages (the websocket's `set`, `submit`, `load`, `burst`,
`reset`, `sync`): parsed and validated here, transport-free, so every bad message gets
an `error` reply naming the field and changes nothing."""
import json

from .settings import SettingError

MAX_MESSAGE_BYTES = 256 * 1024


def _error(engine, message, field=None):
    return {"type": "error", "t": engine.clock.now(), "message": message, "field": field}


def handle(engine, raw):
    """Apply one raw client message; return the events to send back to that client only."""
    if isinstance(raw, bytes) or raw is None:
        return [_error(engine, "messages must be JSON text frames", "message")]
    if len(raw) > MAX_MESSAGE_BYTES:
        return [_error(engine, f"message larger than {MAX_MESSAGE_BYTES} bytes", "message")]
    try:
        msg = json.loads(raw)
    except ValueError as e:
        return [_error(engine, f"not valid JSON: {e}", "message")]
    if not isinstance(msg, dict):
        return [_error(engine, "message must be a JSON object", "message")]
    kind = msg.get("type")
    try:
        if kind == "set":
            engine.update_settings(msg.get("settings"))
        elif kind == "load":
            engine.update_settings({"load": msg.get("on")})
        elif kind == "burst":
            engine.burst(msg.get("n", 8))
        elif kind == "reset":
            engine.reset()
        elif kind == "submit":
            chat = msg.get("chat", True)
            if not isinstance(chat, bool):
                raise SettingError("chat", "must be true or false")
            engine.submit(prompt=msg.get("prompt"), source="page", chat=chat,
                          max_new_tokens=msg.get("max_new_tokens"), temperature=msg.get("temperature"),
                          top_p=msg.get("top_p"), seed=msg.get("seed"))
        elif kind == "sync":
            client_t = msg.get("client_t")
            if isinstance(client_t, bool) or not isinstance(client_t, (int, float)):
                raise SettingError("client_t", "must be a number")
            return [{"type": "sync", "t": engine.clock.now(), "client_t": client_t,
                     "server_time": engine.clock.wall0 + engine.clock.now()}]
        else:
            return [_error(engine, f"unknown message type {kind!r} (expected set, submit, load, burst, "
                                   "reset or sync)", "type")]
    except SettingError as e:
        return [_error(engine, e.message, e.field)]
    return []
