"""The classroom (its model: server/classroom.py) as the web layer sees it: the class this
app serves, who a request comes from (the presenter's cookie or bearer key, a viewer's code),
the addresses printed at start and shown on the page, the join QR code, and hello's
classroom fields for a page being opened. Its routes and request guards are server/join.py."""
import io
import socket
from urllib.parse import quote

from flask import current_app, request

from .classroom import PRESENTER_COOKIE, VIEWER_COOKIE, Role


def current():
    """The app's Classroom, or None outside classroom mode."""
    return current_app.extensions["first_token"].classroom


def is_presenter(room):
    """Whether this request carries the presenter's key: its cookie, or `Authorization: Bearer KEY`."""
    auth = request.headers.get("Authorization", "")
    bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return room.is_key(request.cookies.get(PRESENTER_COOKIE, ""), bearer)


def may_view(room):
    """Whether this request may open the page and its events (Classroom.may_view)."""
    return room.may_view(is_presenter(room), request.cookies.get(VIEWER_COOKIE, ""))


def connection_role():
    """(hello.role, hello.classroom, classroom) for a websocket being opened."""
    room = current()
    if room is None:
        return Role.SOLO, None, None
    info = {"join_url": join_url(room), "code_required": room.join_code is not None}
    if not is_presenter(room):
        return Role.VIEWER, info, room
    info.update(join_code=room.join_code, join_url_with_code=join_url(room, True), qr_svg=qr_svg(room),
                view_url=view_url(room), clients_url="/classroom/clients", limits=room.limits())
    return Role.PRESENTER, info, room


# ------------------------------------------------------------------ addresses
def join_url(room, with_code=False):
    url = f"{_root(room)}/join"
    if with_code and room.join_code:
        url += "?code=" + quote(room.join_code, safe="")
    return url


def view_url(room):
    """Where others watch with the view code (None without one)."""
    if room.view_code is None:
        return None
    return f"{_root(room)}/?view={quote(room.view_code, safe='')}"


def presenter_url(room):
    return f"{_root(room)}/?key={room.key}"


def _root(room):
    """Where others reach the app: the classroom's `base`, or the address this request came to."""
    return room.base or request.host_url.rstrip("/")


def banner(room):
    """What `python app.py --classroom` prints (`room.base` set: there is no request)."""
    lines = ["Classroom mode. Presenter (keep this private; open it on the projected machine):",
             f"  {presenter_url(room)}",
             f"Students join at: {join_url(room)}"]
    if room.join_code:
        lines.append(f"  join code: {room.join_code}  (or scan the QR code: {join_url(room, True)})")
    if room.view_code:
        lines.append(f"Others watch at: {view_url(room)}  "
                     f"(view code: {room.view_code}; without it the page and its events are refused)")
    return lines


def qr_svg(room):
    """The join URL (with the code) as a QR code: an SVG document made here, with no network."""
    import segno
    out = io.BytesIO()
    segno.make(join_url(room, True), error="m").save(
        out, kind="svg", border=2, omitsize=True, xmldecl=False, svgclass="qr", lineclass=None,
        dark="#000000", light="#ffffff")
    return out.getvalue().decode()


def lan_address():
    """This machine's address on the local network, found without sending anything: a UDP
    socket 'connected' to a private address only asks the kernel which interface would route
    there. Falls back to the hostname's address, then to loopback."""
    for probe in ("10.254.254.254", "192.168.254.254"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 1))
                addr = s.getsockname()[0]
            if not addr.startswith(("127.", "0.")):
                return addr
        except OSError:
            pass
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    return "127.0.0.1"


def base_url(host, port):
    """Where others reach the app: the LAN address when bound to every interface."""
    if host in ("0.0.0.0", "::", ""):
        host = lan_address()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}"
