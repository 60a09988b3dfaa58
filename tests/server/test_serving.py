"""The production server (gunicorn with server/serving.py's worker) under idle and slow
connections, on loopback: a thousand open pages and two hundred slowloris connections must
not starve /healthz, a student's ask or the presenter (issue 25)."""
import re
import selectors
import socket
import statistics
import threading
import time

import pytest
import requests

from bench.launch import App, free_port
from helpers import ARTIFACTS, wait_until
from server import serving

HANDSHAKE = ("GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n")


# ------------------------------------------------------------------ a request's arrival
@pytest.mark.parametrize("buf, missing", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n", None),                                   # head still arriving
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0),
    (b"POST /v1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", 3),                   # body still arriving
    (b"POST /v1 HTTP/1.1\r\ncontent-length:5 \r\n\r\nabcde", 0),
    (b"POST /v1 HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (serving.MAX_BODY + 1), 0),     # so does a huge one
])
def test_a_request_is_whole_once_its_head_and_small_body_arrived(buf, missing):
    need = serving.wanted(bytearray(buf))
    assert need == (None if missing is None else len(buf) + missing)


CHUNKED = b"POST /v1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
BIG = b"%x\r\n" % (serving.MAX_BODY + 10) + b"a" * (serving.MAX_BODY + 1)


@pytest.mark.parametrize("body, whole", [
    (b"5\r\nab", None),                                        # a chunk still arriving
    (b"5\r\nabcde\r\n", None),                                 # no last chunk yet
    (b"5\r\nabcde\r\n0\r\n", None),                            # the last chunk's empty line to come
    (b"5\r\nabcde\r\n3;ext=1\r\nfgh\r\n0\r\n\r\n", -1),         # whole (a chunk extension too)
    (b"0\r\nX-Trailer: 1\r\n\r\n", -1),                         # whole, with a trailer
    (b"0\r\n\r\nGET / HTTP/1.1\r\n", 5),                         # a pipelined request after it
    (b"zz\r\nabc", 0),                                          # malformed: handed over, the parser's 400 now
    (BIG, 0),                                                  # over the bound: handed over, the app's 413 now
])
def test_a_chunked_body_arrives_before_a_thread_reads_it(body, whole):
    """`whole`: bytes of the body that make the request (-1: all of them), None: still arriving.
    Past MAX_BODY or malformed it is handed over as it stands, so no thread waits on the client."""
    need = serving.wanted(bytearray(CHUNKED + body))
    if whole is None:
        assert need is None
    else:
        assert need == len(CHUNKED) + (len(body) if whole == -1 else whole)


# ------------------------------------------------------------------ a thousand pages, 200 slowloris
def handshake(port, extra=""):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(HANDSHAKE.format(port=port, extra=extra).encode())
    return sock


def reply_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("latin-1")


class Crowd:
    """Open pages that read (and drop) everything they are sent, and slowloris connections that
    send a header line every second and never finish; a closed slowloris is opened again."""

    def __init__(self, port):
        self.port, self.sel, self.stop = port, selectors.DefaultSelector(), threading.Event()
        self.pages, self.slow, self.answers = [], [], []
        self.lock = threading.Lock()

    def open_pages(self, n, batch=50):
        for i in range(0, n, batch):
            socks = [handshake(self.port) for _ in range(min(batch, n - i))]
            for s in socks:
                head = reply_head(s)
                assert head.startswith("HTTP/1.1 101"), head[:200]
                s.setblocking(False)
                with self.lock:
                    self.sel.register(s, selectors.EVENT_READ, "page")
                    self.pages.append(s)

    def open_slow(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setblocking(False)
        with self.lock:
            self.sel.register(s, selectors.EVENT_READ, "slow")
            self.slow.append(s)

    def run(self):
        """The crowd's own thread: drain pages, trickle the slowloris headers, note their answers."""
        next_trickle = time.monotonic()
        while not self.stop.is_set():
            with self.lock:
                events = self.sel.select(timeout=0.1) if self.sel.get_map() else []
            for key, _ in events:
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if key.data == "slow" and data:
                    self.answers.append(data.split(b"\r\n", 1)[0].decode("latin-1"))
                if not data or key.data == "slow":
                    self._forget(key.fileobj, key.data)
                    if key.data == "slow":
                        self.open_slow()
            if time.monotonic() >= next_trickle:
                next_trickle += 1.0
                for s in list(self.slow):
                    try:
                        s.send(b"X-Slow: 1\r\n")
                    except OSError:
                        pass

    def _forget(self, sock, kind):
        with self.lock:
            self.sel.unregister(sock)
            (self.pages if kind == "page" else self.slow).remove(sock)
        sock.close()

    def close(self):
        self.stop.set()
        for s in self.pages + self.slow:
            s.close()


def timed_get(url):
    """A GET and how long it took (ms, printed, not judged). Starved would be a worker held by a
    slowloris connection until ARRIVE_S (10 s) ends it, or no answer at all: such a probe fails
    here, at half of ARRIVE_S (a liveness bound, ~1000x a quiet machine's answer)."""
    t0 = time.perf_counter()
    r = requests.get(url, timeout=serving.ARRIVE_S / 2)
    return r, (time.perf_counter() - t0) * 1000


@pytest.mark.slow
@pytest.mark.real_model   # the app it starts serves the bundled model
def test_a_thousand_open_pages_and_200_slowloris_starve_nobody():
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / f"server-{port}.log"
    app = App("--classroom", "--host", "127.0.0.1", "--server", "gunicorn", "--join-code", "owl",
              "--max-viewers", "1000", "--slots", "4", port=port, log=log)
    crowd = Crowd(port)
    try:
        key = re.search(r"\?key=(\S+)", log.read_text()).group(1)
        threading.Thread(target=crowd.run, daemon=True).start()
        for _ in range(200):
            crowd.open_slow()
        t0 = time.monotonic()
        crowd.open_pages(1000)
        opened_s = time.monotonic() - t0
        health = requests.get(app.url + "/healthz", timeout=5).json()
        assert health["viewers"]["open"] == 1000, health["viewers"]

        # one page more is refused with a reason; the presenter's never is
        refused = requests.get(app.url + "/ws", timeout=10, headers={
            "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_viewers"
        presenter = handshake(port, f"Cookie: ft_presenter={key}\r\n")
        assert reply_head(presenter).startswith("HTTP/1.1 101")

        # a student joins and asks while /healthz is timed
        student = requests.Session()
        assert student.post(app.url + "/join/session", json={"name": "Ada", "code": "owl"}, timeout=10).ok
        answer = {}

        def ask():
            with student.post(app.url + "/join/ask", json={"prompt": "Name a colour."}, stream=True,
                              timeout=60) as r:
                answer["status"] = r.status_code
                answer["lines"] = [line for line in r.iter_lines() if line]
        asking = threading.Thread(target=ask)
        asking.start()
        times = []
        for _ in range(100):
            r, ms = timed_get(app.url + "/healthz")
            assert r.status_code == 200
            times.append(ms)
            time.sleep(0.1)   # a probe's pace, as a deploy's would be
        asking.join(60)
        p99 = statistics.quantiles(times, n=100)[98]
        print(f"\n1000 pages opened in {opened_s:.1f} s; /healthz p50 {statistics.median(times):.0f} ms, "
              f"p99 {p99:.0f} ms, max {max(times):.0f} ms; slowloris answers {sorted(set(crowd.answers))}")
        # Not starved: every probe answered within timed_get's liveness bound. How fast each came
        # is this machine's business (p99 < 200 ms held on a quiet one, and failed a fresh-clone
        # run at 289 ms on its first call alone), so it is printed above, not judged.
        assert answer.get("status") == 200 and b'"finished"' in answer["lines"][-1], answer
        assert len(crowd.pages) == 1000 and len(crowd.slow) == 200   # none was dropped
        # the slowloris connections, older than ARRIVE_S by now, were answered 408 and closed
        assert "HTTP/1.1 408 Request Timeout" in crowd.answers
        presenter.close()
    finally:
        crowd.close()
        app.stop()


@pytest.mark.slow
@pytest.mark.real_model   # the app it starts serves the bundled model
def test_more_slow_connections_from_one_address_than_allowed_are_refused():
    """PER_ADDRESS arriving connections from one address; the next is answered 503 at once. A
    head over MAX_HEAD is 431; a body that stops short (sized or chunked) is 408 once ARRIVE_S
    has passed; a whole chunked body is answered."""
    app = App("--host", "127.0.0.1", "--server", "gunicorn", "--slots", "2", port=free_port())
    socks = []
    try:
        big = socket.create_connection(("127.0.0.1", app.port), timeout=10)
        big.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (serving.MAX_HEAD + 10))
        assert reply_head(big).startswith("HTTP/1.1 431")
        big.close()
        shorts = [b"Content-Length: 100\r\n\r\n{\"prompt\"",
                  b"Transfer-Encoding: chunked\r\n\r\n9\r\n{\"prompt\"\r\n"]   # no last chunk
        t0 = time.monotonic()
        for body in shorts:
            short = socket.create_connection(("127.0.0.1", app.port), timeout=serving.ARRIVE_S + 10)
            short.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + body)
            socks.append(short)
        for short in socks:
            assert reply_head(short).startswith("HTTP/1.1 408")
            # not before ARRIVE_S (a slower machine only answers later; a body waited on forever
            # fails at the socket's timeout)
            assert time.monotonic() - t0 > serving.ARRIVE_S - 1
            short.close()
        socks.clear()
        model = requests.get(app.url + "/v1/models", timeout=10).json()["data"][0]["id"].encode()
        whole = requests.post(app.url + "/v1/completions", timeout=60,   # a generator body is sent chunked
                              data=(part for part in (b'{"prompt": "Hi", "model": "%s", ' % model,
                                                      b'"max_tokens": 2}')),
                              headers={"Content-Type": "application/json"})
        assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 2
        for _ in range(serving.PER_ADDRESS):
            s = socket.create_connection(("127.0.0.1", app.port), timeout=10)
            s.sendall(b"GET / HTTP/1.1\r\n")
            socks.append(s)
        time.sleep(0.5)   # the worker has accepted them all (its count has no outside view to wait on)
        extra = socket.create_connection(("127.0.0.1", app.port), timeout=10)
        assert reply_head(extra).startswith("HTTP/1.1 503")
        extra.close()
        for s in socks:
            s.close()
        # the closed connections' places come back: this address is served again
        wait_until(lambda: requests.get(app.url + "/healthz", timeout=10).status_code == 200, 30,
                   "/healthz answered 200 after the connections closed")
    finally:
        for s in socks:
            s.close()
        app.stop()


def test_the_default_server_closes_a_socket_that_dribbles_its_headers(live):
    """`python app.py` as `make run` starts it (no --server: here in observe mode, watching the
    in-process app, so no model loads) closes a connection that sends a header line every 2 s and
    never ends its head (slowloris): answered 408 and closed once ARRIVE_S has passed, where
    Werkzeug's development server held it, and a thread, for as long as it dribbled. The deadline
    here only catches a hang: the verdict is that it was closed."""
    app = App("--observe", live.url + "/v1", port=free_port(), timeout=60)
    sock = socket.create_connection(("127.0.0.1", app.port), timeout=2)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        answer, closed, give_up = b"", False, time.monotonic() + serving.ARRIVE_S + 50
        while not closed and time.monotonic() < give_up:
            try:
                sock.sendall(b"X-Dribble: %d\r\n" % int(time.monotonic()))
                chunk = sock.recv(4096)     # waits up to the socket's 2 s timeout
                answer += chunk
                closed = not chunk
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "the server still holds a connection that never finished its head"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    finally:
        sock.close()
        app.stop()
