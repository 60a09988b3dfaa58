"""HTTP routes for the ecosystem: the OpenAI-compatible API (/v1/...) and /metrics.

Thin on purpose: parsing, validation and response shaping live in engine/openai_api.py,
the metrics in engine/metrics.py. Engine modules are imported on first use, as in app.py,
so the app starts serving /healthz before torch is imported.
"""
from flask import Blueprint, Response, jsonify, request


def blueprint(state):
    """The routes, serving from `state.engine` (absent while loading; an Observer in observe mode)."""
    bp = Blueprint("api", __name__)
    metrics = {}

    def attach_metrics(engine):
        if engine.mode == "engine":
            from engine.metrics import EngineMetrics
            metrics["engine"] = EngineMetrics.attach(engine)

    state.on_engine(attach_metrics)

    def local_engine():
        from engine.openai_api import ApiError
        eng = state.engine
        if eng is None:
            raise ApiError(503, f"the model is loading ({state.progress['message']})", code="loading")
        if eng.mode == "observe":
            raise ApiError(404, f"this is an observe-mode page with no model of its own; send requests "
                                f"to {eng.base_url}", code="observe_mode")
        return eng

    def generate(kind):
        from engine import openai_api as oa
        try:
            eng = local_engine()
            body = oa.parse_body(request.stream.read(oa.MAX_BODY_BYTES + 1))
            req = oa.parse_request(kind, body, eng.bundle.name)
            if req.stream:
                return Response(oa.start_stream(eng, req, eng.bundle.name), mimetype="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return jsonify(oa.respond(eng, req, eng.bundle.name))
        except oa.ApiError as e:
            return jsonify(e.body()), e.status

    @bp.post("/v1/chat/completions")
    def chat_completions():
        return generate("chat")

    @bp.post("/v1/completions")
    def completions():
        return generate("completion")

    @bp.get("/v1/models")
    def models():
        from engine import openai_api as oa
        try:
            eng = local_engine()
        except oa.ApiError as e:
            return jsonify(e.body()), e.status
        return jsonify(oa.models_list(eng.bundle.name, eng.clock.wall0, eng.max_context))

    @bp.get("/metrics")
    def prometheus():
        m = metrics.get("engine")
        if m is None:
            if state.engine is None:
                return Response("loading\n", status=503, mimetype="text/plain")
            return Response("observe mode: scrape the observed server's own /metrics\n", status=404,
                            mimetype="text/plain")
        from engine.metrics import CONTENT_TYPE
        return Response(m.render(), content_type=CONTENT_TYPE)

    return bp
