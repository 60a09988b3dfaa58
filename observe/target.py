"""The observed server as a client reaches it: its address (checked once, from the command
line), where its /metrics is, and its API key, sent as `Authorization: Bearer` on every
request and never published or printed."""
import http.client
import json
import urllib.parse

from server import inputs
from server.errors import ApiError

PROBE_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 600.0    # a streamed request silent this long is given up as an error
MAX_GET_BYTES = 4 << 20   # of a /v1/models, /metrics, /slots or version answer


def parse_target(text):
    """The base URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1), or ValueError."""
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"--observe needs an http(s) URL such as http://127.0.0.1:8000/v1, not {text!r}")
    if u.query or u.fragment:
        raise ValueError(f"--observe URL must not have a query or fragment: {text!r}")
    try:
        u.port
    except ValueError:
        raise ValueError(f"--observe URL has a bad port: {text!r}") from None
    return text.rstrip("/")


class Target:
    def __init__(self, base_url, api_key=None, metrics_url=None):
        self.base_url = parse_target(base_url)
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}   # never published
        u = urllib.parse.urlsplit(self.base_url)
        self._where = (u.scheme == "https", u.hostname, u.port)
        self._path = u.path
        # Where /metrics is: the server's root unless told (a server that serves it on a port of its own).
        m = urllib.parse.urlsplit(parse_target(metrics_url)) if metrics_url else None
        self._metrics = ((m.scheme == "https", m.hostname, m.port), m.path or "/metrics") if m else None

    def connection(self, timeout=READ_TIMEOUT_S, where=None):
        https, host, port = where or self._where
        cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
        return cls(host, port, timeout=timeout)

    def post(self, conn, path, body):
        """POST `body` to the API's `path` (e.g. /completions) on `conn`, asking for a stream; the response."""
        conn.request("POST", self._path + path, body=json.dumps(body),
                     headers={**self._auth, "Content-Type": "application/json", "Accept": "text/event-stream"})
        return conn.getresponse()

    def get(self, path):
        """GET a path of the server: (status, body). `/metrics` and the like are served at its
        root; /metrics where --observe-metrics says, when given."""
        where = None
        if path == "/metrics" and self._metrics:
            where, path = self._metrics
        conn = self.connection(PROBE_TIMEOUT_S, where)
        try:
            conn.request("GET", path, headers=self._auth)
            resp = conn.getresponse()
            return resp.status, resp.read(MAX_GET_BYTES)   # a server gone wrong cannot fill memory
        finally:
            conn.close()

    def first_model(self):
        """The first entry of the API's /v1/models, as the server sent it; None when it did not answer one."""
        try:
            status, raw = self.get(self._path + "/models")
            return inputs.loads(raw)["data"][0] if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError, ApiError):
            return None


def error_message(raw):
    """The message of an OpenAI-shaped error body, else the start of the body."""
    try:
        return str(inputs.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError, ApiError):
        return raw[:200].decode(errors="replace")
