"""Serving beyond loopback: gunicorn's threaded worker, changed so that idle and slow
connections cost nothing scarce.

gunicorn's gthread worker gives a connection one of its pool's threads from its first byte
until its request is answered. So 130 connections trickling their headers a byte at a time
(slowloris), or 130 open pages, held all 128 threads and /healthz timed out (issue 25).
Here:

- A request reaches a thread only once it has wholly arrived: its head (up to MAX_HEAD bytes)
  and a body of up to MAX_BODY are read by the worker's own event loop, which holds no thread
  while it waits. A request that has not arrived ARRIVE_S seconds after its first chance (the
  connection accepted, or a kept-alive one becoming readable) is answered 408 and closed; a
  head too large 431. At most PER_ADDRESS connections from one network address may be
  arriving at once; beyond that a new one is answered 503 and closed.
- An open page (a websocket) does hold a thread for its life: the /ws view (server/live.py) blocks,
  and the engine thread must stay a real OS thread, which rules out monkey-patched green
  threads. So the pool has a thread for each of `--max-viewers` pages plus SPARE_THREADS for
  everything else (API streams, students' asks, pages, /healthz), and server/live.py refuses
  a page beyond `--max-viewers` (the presenter's never) with 503 before its upgrade.

A chunked body is read the same way, to its last chunk. A body over MAX_BODY is handed over
once MAX_BODY of it is here (or, declared by Content-Length, after its head): the app
refuses it with 413 without waiting for the rest.
"""
from collections import Counter, deque
import errno
from functools import partial
import re
import resource
import selectors
import time

from gunicorn.workers.gthread import TConn, ThreadWorker

from .openai_api import MAX_BODY_BYTES

ARRIVE_S = 10.0            # from a connection's first chance to its request wholly arrived
MAX_HEAD = 16 * 1024       # bytes of request line and headers
MAX_BODY = MAX_BODY_BYTES     # bodies up to the API's limit are read before a thread is given
PER_ADDRESS = 256          # connections arriving at once from one address
SPARE_THREADS = 256        # pool threads beyond one per open page
CONNECTIONS = 8000         # open connections in all (each is a file descriptor)

_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*(\d+)[ \t]*$", re.I | re.M)
_CHUNKED = re.compile(rb"^transfer-encoding[ \t]*:", re.I | re.M)


def wanted(buf):
    """How many bytes of `buf` make a whole request; None while it is still arriving."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end])
    if _CHUNKED.search(head):
        return _chunked_end(buf, end + 4)
    length = _LENGTH.search(head)
    body = int(length.group(1)) if length else 0
    return end + 4 + (body if body <= MAX_BODY else 0)


def _chunked_end(buf, at):
    """Where a chunked body starting at `at` ends (its last chunk and trailers arrived); None
    while it is arriving. Past MAX_BODY, or malformed, it is handed over where it stands: the
    app refuses a body too large with 413, the parser a malformed one with 400, from bytes
    already here, so neither holds a thread waiting for a slow client."""
    while len(buf) - at <= MAX_BODY:
        line = buf.find(b"\r\n", at)
        if line < 0:
            return None
        try:
            size = int(bytes(buf[at:line]).split(b";")[0], 16)
        except ValueError:
            return at
        if size == 0:                            # the last chunk, then trailers up to an empty line
            rest = line + 2
            if len(buf) < rest + 2:
                return None
            if buf[rest:rest + 2] == b"\r\n":
                return rest + 2
            trailers = buf.find(b"\r\n\r\n", rest)
            return None if trailers < 0 else trailers + 4
        at = line + 2 + size + 2
        if at > len(buf):
            return None
    return at


def _refuse(sock, status, reason):
    """A short plain-text answer, sent without waiting (the socket is non-blocking), then closed."""
    text = reason.encode()
    try:
        sock.send(b"HTTP/1.1 %s\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (status.encode(), len(text), text))
    except OSError:
        pass


class GuardedWorker(ThreadWorker):
    """gthread, with a request's arrival waited for by the event loop (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arriving = deque()        # connections whose request is arriving, oldest deadline first
        self.per_address = Counter()   # of arriving connections

    def init_process(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = CONNECTIONS + 256 if hard == resource.RLIM_INFINITY else min(hard, CONNECTIONS + 256)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        super().init_process()

    def accept(self, listener):
        try:
            client, addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        self._arrive(TConn(self.cfg, client, addr, listener.getsockname()))

    def _arrive(self, conn):
        address = conn.client[0] if isinstance(conn.client, tuple) else str(conn.client)
        if self.per_address[address] >= PER_ADDRESS:
            conn.sock.setblocking(False)
            _refuse(conn.sock, "503 Service Unavailable",
                    f"too many connections from {address} are still sending their request")
            self._drop(conn)
            return
        self.per_address[address] += 1
        conn.address, conn.received = address, bytearray()
        conn.deadline = time.monotonic() + ARRIVE_S
        conn.sock.setblocking(False)
        self.arriving.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _leave_arriving(self, conn):
        self.poller.unregister(conn.sock)
        self.arriving.remove(conn)
        self.per_address[conn.address] -= 1
        if not self.per_address[conn.address]:
            del self.per_address[conn.address]

    def _drop(self, conn):
        self.nr_conns -= 1
        conn.close()

    def _on_readable(self, conn, _sock):
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:                       # the client went away before its request was whole
            self._leave_arriving(conn)
            self._drop(conn)
            return
        conn.received += data
        need = wanted(conn.received)
        if need is None and len(conn.received) > MAX_HEAD:
            self._leave_arriving(conn)
            _refuse(conn.sock, "431 Request Header Fields Too Large", "the request's head is too large")
            self._drop(conn)
        elif need is not None and len(conn.received) >= need:
            self._leave_arriving(conn)
            self.enqueue_req(conn)

    def on_client_socket_readable(self, conn, client):
        """A kept-alive connection's next request: waited for like a new one's."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._arrive(conn)

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.arriving and self.arriving[0].deadline <= now:
            conn = self.arriving[0]
            self._leave_arriving(conn)
            _refuse(conn.sock, "408 Request Timeout", f"the request did not arrive within {ARRIVE_S:g} s")
            self._drop(conn)

    def handle(self, conn):
        """In a pool thread: the request has arrived; give its bytes to the parser first."""
        received = getattr(conn, "received", None)
        if received:
            conn.received = None
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(bytes(received))
            conn.data_ready = True
        return super().handle(conn)
