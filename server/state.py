"""The app's live objects, in `app.extensions["first_token"]` (plain configuration values stay
in `app.config`): loading progress until the backend exists, then the backend; its metrics;
the classroom (--classroom); the open pages."""
import threading

from flask import current_app

from engine.backend import Mode

from .errors import ApiError
from .metrics import EngineMetrics


class Viewers:
    """How many pages have the websocket open (or a place reserved for their upgrade), and how
    many were refused (server/live.py). A place is taken and counted in one step (`reserve`),
    so a burst of handshakes cannot pass the bound together."""

    def __init__(self):
        self._lock = threading.Lock()
        self.open = 0
        self.refused = 0

    def reserve(self, bound, exempt=False):
        """Take a place: True, counted in `open`; False (counted as refused) when `bound` are
        open, unless `exempt` (the classroom's presenter)."""
        with self._lock:
            if self.open >= bound and not exempt:
                self.refused += 1
                return False
            self.open += 1
            return True

    def release(self):
        with self._lock:
            self.open -= 1


class State:
    def __init__(self, classroom=None):
        self.backend = None
        self.classroom = classroom    # a server.classroom.Classroom in classroom mode, else None
        self.metrics = None       # EngineMetrics, for a backend with a model of its own
        self.progress = {"status": "loading", "message": "starting", "progress": 0.0}
        self.error = None         # why loading failed
        self.ready = threading.Event()
        self.viewers = Viewers()

    def set_progress(self, message, frac):
        self.progress = {"status": "loading", "message": message, "progress": round(frac, 3)}

    def set_error(self, message):
        self.error = message
        self.progress = {"status": "error", "message": message, "progress": self.progress["progress"]}

    def set_backend(self, backend):
        if backend.mode is Mode.ENGINE:
            self.metrics = EngineMetrics.attach(backend)
        self.backend = backend
        self.ready.set()


def current():
    """The app's State (inside a request)."""
    return current_app.extensions["first_token"]


def model_backend(observed_ok=False):
    """The backend serving a model here (the API and the classroom's asks need one), or ApiError:
    still loading, failed to load, or observe mode (no model of its own), unless `observed_ok`:
    a classroom's students ask the observed server."""
    state = current()
    backend = state.backend
    if backend is None:
        if state.error:
            raise ApiError(503, f"the model failed to load: {state.error}", code="load_failed")
        raise ApiError(503, f"the model is loading ({state.progress['message']})", code="loading")
    if backend.mode is Mode.OBSERVE and not observed_ok:
        raise ApiError(404, f"this page has no model of its own: it observes {backend.hello().target}; "
                            "send requests there", code="observe_mode")
    return backend
