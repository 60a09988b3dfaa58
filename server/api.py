"""The OpenAI-compatible routes (/v1/...): thin on purpose. Parsing, validation and response
shaping live in server/openai_api.py; the backend does the work."""
from flask import Blueprint, Response, jsonify, request

from . import openai_api as oa
from .state import current

bp = Blueprint("api", __name__)


def _backend():
    """The backend serving a model here, or ApiError (loading, or it failed to; observe mode has none)."""
    state = current()
    backend = state.backend
    if backend is None:
        if state.error:
            raise oa.ApiError(503, f"the model failed to load: {state.error}", code="load_failed")
        raise oa.ApiError(503, f"the model is loading ({state.progress['message']})", code="loading")
    if backend.api_model is None:
        raise oa.ApiError(404, f"this page has no model of its own: it observes {backend.hello().target}; "
                               "send requests there", code="observe_mode")
    return backend


def _generate(kind):
    try:
        backend = _backend()
        body = oa.parse_body(request.stream.read(oa.MAX_BODY_BYTES + 1))
        req = oa.parse_request(kind, body, backend.api_model)
        if req.stream:
            return Response(oa.start_stream(backend, req), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return jsonify(oa.respond(backend, req))
    except oa.ApiError as e:
        return jsonify(e.body()), e.status


@bp.post("/v1/chat/completions")
def chat_completions():
    return _generate("chat")


@bp.post("/v1/completions")
def completions():
    return _generate("completion")


@bp.get("/v1/models")
def models():
    try:
        backend = _backend()
    except oa.ApiError as e:
        return jsonify(e.body()), e.status
    return jsonify(oa.models_list(backend.api_model, backend.clock.wall0, backend.max_context))
