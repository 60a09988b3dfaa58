"""The web layer: the Flask app factory and its blueprints, serving from a `Backend`
(engine/backend.py): the engine's driver, or observe mode's Observer (observe/).

    pages    /, /embed, /static/plotly.min.js, /healthz
    live     /ws: hello, replayed history, live events; control messages from the page
    api      /v1/chat/completions, /v1/completions, /v1/models (OpenAI-compatible); vLLM's /health,
             /version, /tokenize, /detokenize, /tokenizer_info
    metrics  /metrics (Prometheus, vLLM's names)
    join     /join, /join/session, /join/ask, /classroom/clients (--classroom; the model:
             server/classroom.py, as the web layer sees it: server/classroom_web.py)

Errors: any route or hook raises `errors.ApiError`; one registered handler answers it.
Live objects (the backend, the classroom, the open pages) are in `app.extensions["first_token"]`
(server/state.py); `app.config` holds plain configuration values. `python app.py`
creates the app, then loads the model in the background (server/loader.py) so /healthz
reports progress from the first second; tests hand a ready backend in the config.
"""
from flask import Flask

from . import api, control, errors, join, live, metrics, openai_api, pages, security
from .state import State

DEFAULTS = {
    "ALLOWED_ORIGINS": (),                             # --allow-origin: other origins that may use /ws and /v1
    "FRAME_ANCESTORS": "*",                            # --frame-ancestors: who may frame /embed
    "ALLOWED_HOSTS": None,                             # Host names answered (None: any); app.py sets it on loopback
    "REQUEST_TIMEOUT": openai_api.REQUEST_TIMEOUT_S,   # --request-timeout: an API request's deadline, s
    "MAX_VIEWERS": 1000,                               # --max-viewers: open pages at once (presenter not counted)
    # A websocket message larger than this closes the connection before it is buffered whole
    # (server/live.py's BoundedServer, made with these options);
    # up to it, an oversized control message gets an `error` reply (server/control.py).
    "SOCK_SERVER_OPTIONS": {"max_message_size": 4 * control.MAX_MESSAGE_BYTES},
}


def create_app(config=None, backend=None, classroom=None):
    """Build the app. `backend`, if given, is served at once (tests: an engine on the tiny random
    model); otherwise it arrives later through `state.set_backend`. `classroom`: a
    server.classroom.Classroom (--classroom). Config keys (DEFAULTS) carry the command line's
    limits; ValueError names a bad allowed origin."""
    app = Flask(__name__, root_path=str(pages.ROOT), template_folder="templates", static_folder="static")
    app.config.update(DEFAULTS)
    app.config.update(config or {})
    errors.init_app(app)
    security.init_app(app)
    state = State(classroom)
    app.extensions["first_token"] = state
    for bp in (pages.bp, live.bp, api.bp, metrics.bp, join.bp):
        app.register_blueprint(bp)
    if backend is not None:
        state.set_backend(backend)
    return app
