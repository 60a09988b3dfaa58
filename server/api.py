"""The OpenAI-compatible routes (/v1/...) and vLLM's small endpoints beside them (/health,
/version, /tokenize, /detokenize, /tokenizer_info): thin on purpose. Parsing, validation and
response shaping live in server/openai_api.py and server/tokenizing.py; the backend does the work."""
import socket

from flask import Blueprint, Response, current_app, jsonify, request

from engine.events import PROTOCOL

from . import inputs, openai_api as oa, tokenizing
from .state import model_backend

bp = Blueprint("api", __name__)
CLIENT_CLOSED = 499   # nginx's "client closed request": logged, never read by anyone


def client_gone(environ):
    """A probe: has the client closed its connection? The request body has been read, so a
    socket that reads as end-of-stream means the client left (the peek consumes nothing; a
    pipelined next request reads as data, not as gone). Werkzeug and gunicorn both expose the
    socket; elsewhere (the test client, TLS sockets that refuse flags) nobody is seen leaving."""
    sock = environ.get("werkzeug.socket") or environ.get("gunicorn.socket")
    dontwait = getattr(socket, "MSG_DONTWAIT", 0)
    if sock is None or not dontwait:
        return lambda: False

    def gone():
        try:
            return sock.recv(1, socket.MSG_PEEK | dontwait) == b""
        except BlockingIOError:
            return False            # nothing to read: still there
        except ConnectionError:
            return True
        except (OSError, ValueError):
            return False
    return gone


def _generate(kind):
    try:
        backend = model_backend()
        body = inputs.read_object(request.stream)
        req = oa.parse_request(kind, body, backend.api_model, backend.tokenizer.decode)
        timeout_s, gone = current_app.config["REQUEST_TIMEOUT"], client_gone(request.environ)
        if req.stream:
            return Response(oa.start_stream(backend, req, timeout_s, gone), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return jsonify(oa.respond(backend, req, timeout_s, gone))
    except oa.ClientGone:
        return Response(status=CLIENT_CLOSED)


@bp.post("/v1/chat/completions")
def chat_completions():
    return _generate("chat")


@bp.post("/v1/completions")
def completions():
    return _generate("completion")


@bp.get("/v1/models")
def models():
    backend = model_backend()
    return jsonify(oa.models_list(backend.api_model, backend.clock.wall0, backend.max_context))


@bp.get("/health")
def health():
    """vLLM's liveness probe (load tools such as guidellm check it first): 200 with no body while
    the engine serves, 503 while loading or once it failed (/healthz says more)."""
    _, status = model_backend().health()
    return Response(status=status)


@bp.get("/version")
def version():
    """vLLM answers its package version; this server's comparable number is its wire protocol's."""
    return jsonify({"version": f"first-token protocol {PROTOCOL}", "protocol": PROTOCOL})


@bp.post("/tokenize")
def tokenize():
    backend = model_backend()
    body = inputs.read_object(request.stream)
    return jsonify(tokenizing.tokenize(backend.tokenizer, body, backend.api_model, backend.max_context))


@bp.post("/detokenize")
def detokenize():
    backend = model_backend()
    return jsonify(tokenizing.detokenize(backend.tokenizer, inputs.read_object(request.stream), backend.api_model))


@bp.get("/tokenizer_info")
def tokenizer_info():
    backend = model_backend()
    return jsonify(tokenizing.tokenizer_info(backend.tokenizer, backend.max_context))
