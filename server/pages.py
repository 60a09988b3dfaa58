"""The page, its embeddable form, the shipped example traces, plotly.js from the installed
package, and /healthz.

/embed takes URL parameters (each checked here; a bad one is a 400 that says what is
allowed): `panels` (the strips shown besides the timeline), `theme` (dark or light),
`compact` (small type for small frames), and either `trace=examples/NAME.json` (replay a
shipped example: no websocket, no engine work) or `preset=NAME`. The engine is one for every
reader of every article, and a preset resets it: so `preset=NAME` with a shipped recording of
that lesson (examples/NAME.json) is redirected to that recording, replayed for this reader alone;
without one, or with `live=1`, the page runs it live, at once when it is the engine's only viewer
and otherwise after asking, saying whom it resets (static/teach/ft-teach.js). Only the traces in
examples/ are served, by name. The full page
takes the same view parameters, and `?trace=URL` for any same-origin trace.

The pages' scripts are native ES modules, static/JOB/ft-NAME.js, in one folder per job (core:
state, connection, replay and controls; draw: timeline, canvases, charts and panels; features:
delivery, speculation, observed server, SLO marks, weights and busy; teach: presets, tour,
diagnosis, measure, compare and presenter mode; classroom: the join page and the classroom
strip). They import each other by bare specifiers (`import {fmtS} from "ft/util"`). Every template gets `import_map`, the
`<script type="importmap">` that maps each specifier to its file; `app.py export` renders the
same templates with each specifier mapped to a data: URL of the file's text instead, since a
page opened from file:// cannot load module scripts from files (server/export.py).
"""
from pathlib import Path
import re

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, send_file, url_for

from .state import current

ROOT = Path(__file__).resolve().parents[1]   # templates/ and static/ sit at the top level
EXAMPLES = ROOT / "examples"
STATIC = ROOT / "static"
# ft/NAME -> its file's path under static/ (JOB/ft-NAME.js). A module's name is unique across the
# folders, so the specifiers say what a module is, not where it sits.
MODULES = {p.stem.removeprefix("ft-"): p.relative_to(STATIC).as_posix() for p in sorted(STATIC.glob("*/ft-*.js"))}
PANELS = ("timeline", "kv", "blocks", "queue", "slots", "detail")   # the page's parts, in page order
EMBED_PANELS = ("timeline",)                                          # /embed's default
THEMES = ("dark", "light")
EXAMPLE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
TRACE_PARAM = re.compile(rf"examples/({EXAMPLE_NAME.pattern})\.json")
bp = Blueprint("pages", __name__)


class BadParam(ValueError):
    """A URL parameter the page cannot honour: answered with 400 and this message."""


def import_map(url_of):
    """The pages' import map: each module's specifier `ft/NAME` -> url_of("JOB/ft-NAME.js")."""
    return {"imports": {f"ft/{name}": url_of(path) for name, path in MODULES.items()}}


@bp.app_context_processor
def served_modules():
    """Every template's import map, for pages served by this app: the modules' /static URLs.
    (A value passed to render_template wins over this one: the export passes its own.)"""
    return {"import_map": import_map(lambda filename: url_for("static", filename=filename))}


def plotly_js_path():
    import plotly
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def example_names():
    """The shipped example traces, by name (examples/NAME.json)."""
    return sorted(p.stem for p in EXAMPLES.glob("*.json") if EXAMPLE_NAME.fullmatch(p.stem))


def example_path(name):
    """examples/NAME.json for a shipped example's name, else None (nothing else is ever read)."""
    return EXAMPLES / f"{name}.json" if name in example_names() else None


def page_options(args, embed):
    """The template's view options from URL parameters (BadParam names a bad one)."""
    panels = EMBED_PANELS if embed else PANELS
    if args.get("panels"):
        asked = [p.strip() for p in args["panels"].split(",") if p.strip()]
        unknown = [p for p in asked if p not in PANELS]
        if unknown:
            raise BadParam(f"panels: unknown panel(s) {', '.join(unknown)}; choose from {', '.join(PANELS)}")
        panels = ("timeline",) + tuple(p for p in PANELS if p in asked and p != "timeline")
    theme = args.get("theme", "dark")
    if theme not in THEMES:
        raise BadParam(f"theme: {theme!r} is not one of {', '.join(THEMES)}")
    for flag in ("compact", "live"):
        if args.get(flag, "0") not in ("0", "1", "true", "false"):
            raise BadParam(f"{flag}: {args[flag]!r} is not 1 or 0")
    compact = args.get("compact", "0")
    trace = args.get("trace")
    if trace is not None and embed:   # the full page fetches any same-origin ?trace=URL itself
        m = TRACE_PARAM.fullmatch(trace)
        if not m or example_path(m.group(1)) is None:
            raise BadParam(f"trace: {trace!r} is not a shipped example; choose from "
                           + (", ".join(f"examples/{n}.json" for n in example_names()) or "(none shipped)"))
        if "preset" in args:
            raise BadParam("give trace (a recording) or preset (live), not both")
    return {"embed": embed, "panels": panels, "theme": theme, "compact": compact in ("1", "true")}


def _page(embed):
    try:
        options = page_options(request.args, embed)
    except BadParam as e:
        return f"First Token: bad URL parameter. {e}\n", 400, {"Content-Type": "text/plain; charset=utf-8"}
    return render_template("index.html", **options)


@bp.get("/")
def index():
    return _page(embed=False)


@bp.get("/embed")
def embed():
    # The same page, compact, for iframes: the timeline and headline figures unless `panels` asks for more.
    # A lesson with a shipped recording: that, replayed for this reader (the live engine is everyone's).
    name, args = request.args.get("preset"), request.args
    if name and "trace" not in args and args.get("live", "0") in ("0", "false") and example_path(name):
        kept = {k: v for k, v in args.items() if k != "preset"}
        return redirect(url_for("pages.embed", trace=f"examples/{name}.json", **kept))
    return _page(embed=True)


@bp.get("/examples/<name>.json")
def example(name):
    path = example_path(name)
    if path is None:
        return jsonify({"error": {"message": f"no shipped example named {name!r}; there are: "
                                             f"{', '.join(example_names()) or 'none'}", "code": "not_found"}}), 404
    return send_file(path, mimetype="application/json", max_age=3600)


@bp.get("/static/plotly.min.js")
def plotly_js():
    return send_file(plotly_js_path(), mimetype="application/javascript", max_age=86400)


@bp.get("/healthz")
def healthz():
    state = current()
    if state.backend is None:
        return jsonify(state.progress), 503   # loading, or loading failed (status "error")
    body, status = state.backend.health()
    viewers = state.viewers
    body["viewers"] = {"open": viewers.open, "refused": viewers.refused, "max": current_app.config["MAX_VIEWERS"]}
    return jsonify(body), status
