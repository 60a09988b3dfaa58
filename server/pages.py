"""The page, its embeddable form, plotly.js from the installed package, and /healthz."""
from pathlib import Path

from flask import Blueprint, jsonify, render_template, send_file

from .state import current

ROOT = Path(__file__).resolve().parents[1]   # templates/ and static/ sit at the top level
bp = Blueprint("pages", __name__)


def plotly_js_path():
    import plotly
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@bp.get("/")
def index():
    return render_template("index.html", embed=False)


@bp.get("/embed")
def embed():
    # The same live page, compact: timeline and headline figures only, for iframes.
    return render_template("index.html", embed=True)


@bp.get("/static/plotly.min.js")
def plotly_js():
    return send_file(plotly_js_path(), mimetype="application/javascript", max_age=86400)


@bp.get("/healthz")
def healthz():
    state = current()
    if state.backend is None:
        return jsonify(state.progress), 503   # loading, or loading failed (status "error")
    body, status = state.backend.health()
    return jsonify(body), status
