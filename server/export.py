"""One self-contained HTML file that replays a trace, for articles:

    python app.py export trace.json -o page.html [--theme light]

The file is the page itself (templates/index.html, rendered as the app serves it) in replay
mode: its stylesheet, its scripts, plotly.js from the installed package and the trace are
inlined, so it replays from file:// with no server and no network. The page shows a `preset`
event's explanation and a link-free attribution line from `hello` (static/core/ft-replay.js).

The page's ES modules cannot be inlined as they stand (a module is imported by URL, and a page
opened from file:// may not load module scripts from files), so the import map the template
renders maps each module's specifier (`ft/util`, ...) to a `data:text/javascript;base64,` URL
of that module's text instead of its /static URL (server/pages.py); the modules import each
other by those specifiers only, never by relative path, so they resolve the same either way.
The trace is a JSON block (`<script type="application/json" id="ft-trace">`) that
static/core/ft-replay.js reads.

Inlining is safe by construction: the trace is JSON with every `<` written `\\u003c`; the
modules are base64 (no `<` at all) in an import map that is JSON with `<` escaped the same way;
and in plotly.js and the stylesheet `</script`, `</style` and `<!--` are written with `\\x3C` /
`\\3C ` escapes (the same text to JavaScript and CSS), so nothing inlined can end its element early.
"""
import base64
import json
from pathlib import Path
import re
import sys

from flask import render_template

from engine.settings import finite_number

from . import create_app, pages

SCRIPT = re.compile(r'<script src="([^"]+)"></script>')
STYLESHEET = re.compile(r'<link rel="stylesheet" href="([^"]+)">')


class TraceError(ValueError):
    """The file is not a trace (the message says why)."""


def check(trace):
    """Raise TraceError unless `trace` has a trace's shape: a JSON array, `hello` first, every
    item an object with a `type` and a finite time `t` (docs/events.schema.json has the rest)."""
    if not isinstance(trace, list):
        raise TraceError("a trace is a JSON array of events")
    if not trace or not isinstance(trace[0], dict) or trace[0].get("type") != "hello":
        raise TraceError("a trace starts with a hello event")
    for i, ev in enumerate(trace):
        t = ev.get("t") if isinstance(ev, dict) else None
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str) or not finite_number(t):
            raise TraceError(f"event {i} has no type and time")
    return trace


def read_trace(path):
    """The JSON in `path` (`render` checks that it is a trace); TraceError (or OSError) says
    what is wrong."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise TraceError(f"not JSON: {e}") from None


def _script(text):
    return text.replace("</script", "\\x3C/script").replace("</SCRIPT", "\\x3C/SCRIPT").replace("<!--", "\\x3C!--")


def _style(text):
    return text.replace("</style", "\\3C /style").replace("<!--", "\\3C !--")


def _static(url):
    """The file behind one of the page's own /static URLs."""
    if url == "/static/plotly.min.js":
        return pages.plotly_js_path()
    # JOB/NAME only: one folder down (static/ is in folders by job), and never out of static/.
    parts = url.removeprefix("/static/").split("/")
    path = pages.STATIC.joinpath(*parts)
    if not url.startswith("/static/") or len(parts) != 2 or ".." in parts or not path.is_file():
        raise RuntimeError(f"the page refers to {url}, which is not one of its static files")
    return path


def _module_url(path):
    """A module's text as a data: URL (the import map's value for it in the exported page);
    `path` is the module's file under static/."""
    text = (pages.STATIC / path).read_text(encoding="utf-8")
    return "data:text/javascript;base64," + base64.b64encode(text.encode("utf-8")).decode("ascii")


def render(trace, name, theme="dark"):
    """The HTML text: the full page in replay mode with everything inlined."""
    check(trace)
    app = create_app({"TESTING": True})
    with app.test_request_context("/"):
        html = render_template("index.html", import_map=pages.import_map(_module_url),
                               **pages.page_options({"theme": theme}, embed=False))
    data = json.dumps({"name": name, "events": trace}, separators=(",", ":")).replace("<", "\\u003c")
    boot = f'<script type="application/json" id="ft-trace">{data}</script>\n'
    html = html.replace("<title>First Token</title>", "<title>First Token replay</title>", 1)
    html = STYLESHEET.sub(lambda m: f"<style>\n{_style(_static(m.group(1)).read_text(encoding='utf-8'))}</style>", html)
    first = SCRIPT.search(html)
    if first is None:
        raise RuntimeError("the page has no scripts to inline")
    html = html[:first.start()] + boot + html[first.start():]
    return SCRIPT.sub(lambda m: f"<script>\n{_script(_static(m.group(1)).read_text(encoding='utf-8'))}\n</script>", html)


def export(trace_path, out_path, theme="dark"):
    """Write the replay page for the trace in `trace_path` to `out_path`; its size in bytes."""
    trace = read_trace(trace_path)
    text = render(trace, Path(trace_path).stem, theme)
    Path(out_path).write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def add_arguments(p):
    """`app.py export`'s flags (app.py makes the subcommand)."""
    p.add_argument("trace", help="a trace file (JSON), e.g. from `app.py record` or the page's Save trace")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--theme", choices=pages.THEMES, default="dark")


def run(args):
    """`app.py export`: write the page; `args.usage_error` reports a file that is not a trace."""
    try:
        size = export(args.trace, args.output, args.theme)
    except TraceError as e:
        args.usage_error(f"{args.trace}: not a First Token trace: {e}")
    except OSError as e:
        args.usage_error(f"{e.filename or args.trace}: {e.strerror}")
    print(f"wrote {args.output}: {size} bytes", file=sys.stderr)
