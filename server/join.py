"""The classroom's routes (its model: server/classroom.py, read through
server/classroom_web.py): the students' /join page and endpoints, the presenter's class
list, and the request guards of classroom mode: the presenter key becoming a cookie, POST /v1
for the presenter only, --view-code, and removed phones refused on every /join route."""
from urllib.parse import urlencode

from flask import Blueprint, Response, current_app, jsonify, redirect, render_template, request

from engine.events import Rejected, Token, wire_prob
from engine.core.request import GenerateRequest
from engine.settings import SettingError
from . import inputs, openai_api as oa
from .api import client_gone
from .classroom import CLIENT_COOKIE, MAX_NAME, MAX_PROMPT, PRESENTER_COOKIE, REMOVED, VIEWER_COOKIE
from .classroom_web import current, is_presenter, may_view
from .errors import ApiError
from .state import model_backend

MAX_BODY = 16 * 1024    # a /join request's JSON body, bytes
VIEW_PATHS = ("/", "/embed", "/ws")   # what --view-code guards: the pages, and the events that carry prompts
bp = Blueprint("join", __name__)


def _cookie(response, name, value):
    response.set_cookie(name, value, httponly=True, samesite="Strict", path="/")
    return response


@bp.before_app_request
def guard():
    """The presenter's key becomes a cookie (and leaves the address bar); POST /v1 needs it."""
    room = current()
    if room is None:
        return None
    if request.path == "/" and "key" in request.args:
        if not room.is_key(request.args["key"]):
            return notice(403, "wrong_key", "Wrong presenter key",
                          "This is not the presenter's address of this class.",
                          "Use the address the app printed when it started (the key changes at every start).")
        rest = {k: v for k, v in request.args.items() if k != "key"}
        return _cookie(redirect("/" + (f"?{urlencode(rest)}" if rest else "")), PRESENTER_COOKIE, room.key)
    if room.view_code is not None and request.path in VIEW_PATHS:
        refused = view_guard(room)
        if refused is not None:
            return refused
    if request.path.startswith("/v1/") and request.method == "POST" and not is_presenter(room):
        message = ("in classroom mode the API needs the presenter key (Authorization: Bearer KEY, the key "
                   "printed at start); students ask at /join")
        raise ApiError(403, message, code="classroom_presenter_only")
    return None


def view_guard(room):
    """--view-code: `?view=CODE` becomes a cookie (and leaves the address bar); without it the
    pages answer a form asking for the code and /ws is refused before its upgrade (403)."""
    if "view" in request.args:
        if room.try_view_code(request.args["view"], request.remote_addr or ""):
            rest = {k: v for k, v in request.args.items() if k != "view"}
            target = request.path + (f"?{urlencode(rest)}" if rest else "")
            return _cookie(redirect(target), VIEWER_COOKIE, room.view_code)
        message = "That is not this class's view code: ask the presenter for it."
    elif may_view(room):
        return None
    else:
        message = "Type the view code the presenter gave to watch the model at work."
    if request.path == "/ws":
        raise ApiError(403, "this class's page needs its view code: open the page with ?view=CODE",
                       code="view_code_required")
    return render_template("view_code.html", path=request.path, message=message), 403


def notice(status, code, title, message, hint=None):
    """A short styled page for a person (a phone, the projector), not a script: why this
    address answers nothing more (`code` is in its data-code, for tests and scripts)."""
    return render_template("notice.html", code=code, title=title, message=message, hint=hint), status


def _room():
    room = current()
    if room is None:
        raise ApiError(404, "classroom mode is off: start the app with --classroom", code="not_classroom")
    return room


@bp.get("/join")
def join_page():
    room = current()
    if room is None:
        return notice(404, "not_classroom", "No class here", "Classroom mode is off on this server.",
                      "The presenter starts it with --classroom.")
    return render_template("join.html", code_required=room.join_code is not None,
                           max_name=MAX_NAME, max_prompt=MAX_PROMPT)


@bp.get("/join/session")
def who_am_i():
    """Whether this phone has joined (a fresh phone has not: that is no error, so 200)."""
    client = request.cookies.get(CLIENT_COOKIE) or ""
    room = _room()
    if client not in room.students:
        return jsonify({"joined": False})
    s = room.student(client)   # ApiError 403 when the presenter removed this phone
    return jsonify({"joined": True, "name": s.name})


@bp.post("/join/session")
def join():
    room = current()
    try:
        room = _room()
        body = _json_body()
        s = room.join(body.get("name"), body.get("code"), request.remote_addr or "")
    except ApiError as e:
        if room is not None:
            room.refuse(e.code)
        raise
    return _cookie(jsonify({"name": s.name}), CLIENT_COOKIE, s.id)


@bp.before_request
def refuse_removed():
    """A device the presenter removed (its cookie) is refused 403 on every /join route,
    joining again included."""
    room = current()
    if room is None or not request.path.startswith("/join") or not room.removed(request.cookies.get(CLIENT_COOKIE)):
        return None
    if request.path == "/join":
        return notice(403, "removed", "You were removed from the class", f"{REMOVED[0].upper()}{REMOVED[1:]}.",
                      "This phone cannot ask the model any more. Ask the presenter if this was a mistake.")
    if request.path == "/join/session" and request.method == "POST":
        room.refuse("removed")
    raise ApiError(403, REMOVED, code="removed")


@bp.get("/classroom/clients")
def clients():
    room = current()
    if room is None or not is_presenter(room):
        raise ApiError(403, "only the presenter's page sees the class list", code="presenter_only")
    return jsonify({"clients": room.roster(), "refused_joins": room.refused_joins(),
                    "in_flight": {"now": room.in_flight, "max": room.max_in_flight, "refused": room.busy_asks}})


def _json_body():
    return inputs.read_object(request.stream, MAX_BODY)


@bp.post("/join/ask")
def ask():
    """Queue this student's prompt; stream the answer back (server-sent events: `start`, `token`
    …, then `finished` with the engine's measured TTFT and time per output token, or `error`)."""
    room = _room()
    body = _json_body()
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ApiError(400, "prompt: write something first", code="bad_prompt")
    if len(prompt) > MAX_PROMPT:
        raise ApiError(400, f"prompt: at most {MAX_PROMPT} characters", code="bad_prompt")
    backend = model_backend(observed_ok=True)
    with room.claim(request.cookies.get(CLIENT_COOKIE)) as claim:   # any failure in here frees it
        try:
            # logprobs 0: each token's own probability, which the phone marks the unsure tokens by
            handle = backend.submit(GenerateRequest(prompt=prompt.strip(), source="join", label=claim.student.name,
                                                    chat=True, stream=True, logprobs=0))
        except SettingError as e:
            raise ApiError(400, f"{e.field}: {e.message}", e.field, "bad_prompt") from None
        claim.started(backend, handle.id)
        items = oa.outputs(backend, handle, current_app.config["REQUEST_TIMEOUT"],
                           client_gone(request.environ))
        response = Response(_answer(claim, items), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        # Also when the stream never started (the phone left at once): cancel and free the student.
        response.call_on_close(lambda: (items.close(), claim.release()))
        claim.hand_over()
        return response


def _answer(claim, items):
    """The SSE body. Closing it early (the phone left) cancels the request (`oa.outputs`)."""
    try:
        yield oa.sse({"type": "start", "id": claim.rid, "name": claim.student.name})
        for ev in items:
            if ev is None:
                yield ": waiting\n\n"       # a keep-alive, and a write that fails once the phone left
            elif isinstance(ev, Token):   # p_raw: how sure the model was of it (the phone marks the unsure)
                yield oa.sse({"type": "token", "text": ev.client(), "p_raw": wire_prob(ev.p_raw)})
            elif isinstance(ev, Rejected):
                yield oa.sse({"type": "error", "message": f"the engine refused it: {ev.reason}", "code": ev.code})
            elif ev.reason in ("cancelled", "error"):       # Finished, without an answer
                why = "it was cancelled (the presenter cleared the queue, reset or removed you)" \
                    if ev.reason == "cancelled" else f"the engine failed: {ev.error}"
                yield oa.sse({"type": "error", "message": why, "code": ev.reason})
            else:
                yield oa.sse({"type": "finished", "reason": ev.reason, "ttft": ev.ttft, "tpot": ev.tpot,
                              "e2e": ev.e2e, "prompt_tokens": ev.prompt_tokens, "output_tokens": ev.output_tokens,
                              # observe mode: timed by this app as a client of the observed server
                              "measured_by": "client" if ev.client_side else "engine"})
    except ApiError as e:
        yield oa.sse({"type": "error", "message": e.message, "code": e.code})
    except oa.ClientGone:
        pass
    finally:
        items.close()       # cancels the request unless it ended
        claim.release()
