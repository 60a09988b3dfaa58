"""The web layer: the Flask app factory and its blueprints, serving from a `Backend`
(engine/backend.py): the engine's driver, or observe mode's Observer.

    pages    /, /embed, /static/plotly.min.js, /healthz
    live     /ws: hello, replayed history, live events; control messages from the page
    api      /v1/chat/completions, /v1/completions, /v1/models (OpenAI-compatible)
    metrics  /metrics (Prometheus, vLLM's names)

App state lives in `app.extensions["first_token"]` (server/state.py). `python app.py`
creates the app, then loads the model in the background (server/loader.py) so /healthz
reports progress from the first second; tests hand a ready backend in the config.
"""
from flask import Flask

from . import api, live, metrics, pages
from .state import State


def create_app(config=None):
    """Build the app. `config["BACKEND"]`, if given, is served at once (tests: an engine on the
    tiny random model); otherwise it arrives later through `state.set_backend`."""
    app = Flask(__name__, root_path=str(pages.ROOT), template_folder="templates", static_folder="static")
    app.config.update(config or {})
    state = State()
    app.extensions["first_token"] = state
    for bp in (pages.bp, live.bp, api.bp, metrics.bp):
        app.register_blueprint(bp)
    live.sock.init_app(app)
    if app.config.get("BACKEND") is not None:
        state.set_backend(app.config["BACKEND"])
    return app
