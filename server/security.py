"""Who may drive the app from a browser, and who may frame its pages.

A browser sends `Origin` with every websocket handshake and every cross-site POST, and any web
page a visitor has open can make both: without this check, a stray script in another tab could
open /ws and start the load generator, or post to /v1. So the websocket and every
state-changing request (any method but GET/HEAD/OPTIONS) are refused (403) when they carry an
`Origin` that is neither the app's own origin (scheme, host and port: the scheme it is served
by, the host and port of the `Host` header; `https://` on an http server is another origin) nor in
the allow-list (`--allow-origin`, config key ALLOWED_ORIGINS; behind a TLS proxy, the proxy's
https origin). Requests without `Origin` are not from a web
page's script (curl, the openai client, server-side code) and pass.

DNS rebinding: a page on evil.example can point that name at 127.0.0.1 after it loads, and its
requests then reach an app on loopback with `Host: evil.example` and a matching `Origin`, which
the check above takes for the app's own pages. So when the app listens on loopback only (any
loopback address, 127.0.0.0/8 and ::1, or a name that resolves only to them: `is_loopback`;
app.py sets ALLOWED_HOSTS then), every request must name a loopback host (a loopback address,
`localhost`, the address bound) or one given with `--allow-host` (a reverse proxy's public
name), or it gets 403. Bound to other interfaces the app is reachable by whatever names the
network gives it, and no host list applies.

Every response says `X-Content-Type-Options: nosniff`: a browser takes its type as given (a
trace or a JSON error is never sniffed into a script or a page); and `Referrer-Policy:
no-referrer`: a link followed from a page sends no address of it on (a presenter's carries its key).

Every page's `Content-Security-Policy` is a second line against injection (`page_policy`): scripts
run only from this origin, or inline with this response's nonce (the page's import map and the one
line that boots its modules); so a `<script>` or an `onerror=` that ever reached the DOM would not
run. No plugins (`object-src 'none'`), no `<base>` (`base-uri 'none'`). An exported page
(server/export.py) is a file with no headers: its inlined scripts carry a nonce nothing checks.

Framing (`Content-Security-Policy: frame-ancestors`): /embed is made for iframes on other
sites (articles, course pages), so any origin may frame it by default, and an article opened
from disk too: CSP's `*` matches network schemes only, so a `file://` page's frame stayed blank
(the reason only in its console) until `file:` was added to the list. `--frame-ancestors`
(config key FRAME_ANCESTORS) narrows that to a list of origins, `file:` among them if wanted. Every other page is framed
only by this origin ('self', plus X-Frame-Options for old browsers). An /embed page's own
websocket is same-origin (the frame's document comes from this app), so framing it grants the
framing site nothing: that site's scripts cannot reach into the frame or the websocket.
"""
import ipaddress
import secrets
import socket
from urllib.parse import urlsplit

from flask import current_app, g, request

from .errors import ApiError

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(text):
    """`scheme://host[:port]`, lower-cased, default port dropped; ValueError if `text` is not one."""
    parts = urlsplit(text.strip().lower())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{text!r} is not an origin like https://example.org or http://host:8080")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} has an invalid port") from None
    return f"{parts.scheme}://{_host_port(parts.scheme, parts.hostname, port)}"


def _host_port(scheme, host, port):
    host = f"[{host}]" if ":" in host else host   # IPv6 literals keep their brackets
    port = None if port == DEFAULT_PORTS.get(scheme) else port
    return host if port is None else f"{host}:{port}"


def _same_origin(origin, scheme, host_header):
    """Whether `origin` is this app's own: the scheme it is served by (`scheme`: http, or https
    where the WSGI server says so) and the host and port the browser asked for (its `Host`
    header). Behind a TLS proxy the app is served by http and its pages' origin is https: give
    that origin with --allow-origin."""
    try:
        parts = urlsplit(origin.lower())
        want = urlsplit("//" + host_header.lower())
        return parts.scheme == scheme and bool(parts.hostname) and parts.hostname == want.hostname and \
            (parts.port or DEFAULT_PORTS.get(scheme)) == (want.port or DEFAULT_PORTS.get(scheme))
    except ValueError:   # a malformed port in either
        return False


def origin_allowed(origin, scheme, host_header, allowed):
    if origin is None:
        return True
    if _same_origin(origin, scheme, host_header or ""):
        return True
    try:
        return normalize_origin(origin) in allowed
    except ValueError:   # "null" (sandboxed frames, file://) and garbage
        return False


def _guarded():
    return request.method not in SAFE_METHODS or request.path == "/ws"


def check_origin():
    """before_request: refuse a cross-origin websocket (before the upgrade, so it can send
    nothing) or state-changing request with 403."""
    if not _guarded():
        return None
    origin = request.headers.get("Origin")
    if origin_allowed(origin, request.scheme, request.host, _allowed()):
        return None
    message = (f"origin {origin!r} is not allowed here: only this app's own pages and the origins given "
               "with --allow-origin may use its websocket and API from a browser")
    raise ApiError(403, message, code="origin_not_allowed")


def _allowed():
    return current_app.config["ALLOWED_ORIGINS_NORMALIZED"]


def host_name(host_header):
    """The host name of a `Host` header, lower-cased, without port or IPv6 brackets ("" if none)."""
    try:
        return urlsplit("//" + (host_header or "")).hostname or ""
    except ValueError:   # a malformed port
        return ""


LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def _loopback_ip(text):
    try:
        return ipaddress.ip_address(text.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def is_loopback(host):
    """Whether binding `host` (an address or a name) listens on this machine only: a loopback
    address (127.0.0.0/8, ::1), or a name every address of which is one (resolved here; a name
    that does not resolve is not loopback). "" and the wildcards are not."""
    host = (host or "").strip()
    if _loopback_ip(host):
        return True
    if not host or host in ("0.0.0.0", "::"):
        return False
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False   # an address, not loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(_loopback_ip(info[4][0]) for info in infos)


def loopback_hosts(bound, extra=()):
    """ALLOWED_HOSTS for an app bound to the loopback `bound`: the loopback names, the address or
    name bound, and `extra` (--allow-host). Any loopback address is answered too (check_host)."""
    return (*LOOPBACK_NAMES, "127.0.0.1", "::1", bound, *extra)


def check_host():
    """before_request: with ALLOWED_HOSTS set (a loopback bind), refuse any other `Host` (403):
    the names in it and loopback addresses pass."""
    hosts = current_app.config["ALLOWED_HOSTS"]
    if hosts is None:
        return None
    name = host_name(request.host)
    if name in hosts or _loopback_ip(name):
        return None
    message = (f"host {name or request.host!r} is not one this app answers to: it listens on this machine "
               "only, and other names could be DNS rebinding; behind a proxy, start it with --allow-host NAME")
    raise ApiError(403, message, code="host_not_allowed")


FILE = "file:"   # the scheme-source for pages opened from disk, which "*" does not match


def parse_frame_ancestors(text):
    """`--frame-ancestors`: "*" (any origin, and pages opened from disk) or origins separated by
    spaces, `file:` among them for pages opened from disk, as the CSP source list for /embed (this
    origin is always added); ValueError names a bad entry."""
    parts = text.split()
    if not parts:
        raise ValueError("give * or at least one origin like https://example.org")
    if parts == ["*"]:
        return f"* {FILE}"
    if "*" in parts:
        raise ValueError("* already allows every origin and file: pages: give it alone")
    origins = [p for p in parts if p.lower() != FILE]
    return " ".join(["'self'"] + sorted({normalize_origin(p) for p in origins}) + ([FILE] if len(origins) < len(parts) else []))


def csp_nonce():
    """This response's nonce for the page's own inline scripts (its import map and the line that
    boots its modules: `nonce="{{ csp_nonce() }}"` in the templates), made once per request."""
    if "csp_nonce" not in g:
        g.csp_nonce = secrets.token_urlsafe(18)
    return g.csp_nonce


def page_policy(frame_ancestors):
    """A page's Content-Security-Policy: scripts from this origin and the inline ones this response
    rendered with its nonce, nothing else (an injected `<script>`, `onerror=` or `javascript:` URL
    does not run); no plugins; no `<base>` to re-point its relative URLs; framed by
    `frame_ancestors`. 'unsafe-eval' because plotly's WebGL charts (regl) compile their drawing
    code with `new Function`: without it the steps chart says "WebGL is not supported"; it lets the
    page's own scripts evaluate strings, not an injected element or handler run."""
    nonce = g.get("csp_nonce")
    scripts = "'self' 'unsafe-eval'" + (f" 'nonce-{nonce}'" if nonce else "")
    return f"script-src {scripts}; object-src 'none'; base-uri 'none'; frame-ancestors {frame_ancestors}"


def page_headers(response):
    """after_request: a page's CSP (`page_policy`); /embed may be framed by FRAME_ANCESTORS (any
    origin by default), every other page by this origin only."""
    if response.mimetype != "text/html":
        return response
    if request.path == "/embed":
        response.headers["Content-Security-Policy"] = page_policy(current_app.config["FRAME_ANCESTORS"])
    else:
        response.headers["Content-Security-Policy"] = page_policy("'self'")
        response.headers["X-Frame-Options"] = "SAMEORIGIN"   # for browsers without frame-ancestors
    return response


def every_response(response):
    """after_request: the declared content type is the only one (no sniffing), and no address of
    this app is sent on as a Referer (a presenter's page address carries its key), on every response."""
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def init_app(app):
    """Normalise the configured allow-list and frame ancestors once (ValueError names a bad
    entry) and install the checks."""
    origins = app.config.get("ALLOWED_ORIGINS") or ()
    app.config["ALLOWED_ORIGINS_NORMALIZED"] = frozenset(normalize_origin(o) for o in origins)
    app.config["FRAME_ANCESTORS"] = parse_frame_ancestors(app.config.get("FRAME_ANCESTORS") or "*")
    hosts = app.config.get("ALLOWED_HOSTS")
    app.config["ALLOWED_HOSTS"] = None if hosts is None else frozenset(h.strip("[]").lower() for h in hosts)
    app.before_request(check_host)
    app.before_request(check_origin)
    app.after_request(page_headers)
    app.after_request(every_response)
    app.context_processor(lambda: {"csp_nonce": csp_nonce})
