"""What the app serves from: loading progress until the backend exists, then the backend."""
import threading

from flask import current_app

from .metrics import EngineMetrics


class Viewers:
    """How many pages have the websocket open, and how many were refused (server/live.py)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.open = 0
        self.refused = 0

    def change(self, n):
        with self._lock:
            self.open += n

    def refuse(self):
        with self._lock:
            self.refused += 1


class State:
    def __init__(self):
        self.backend = None
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
        if backend.api_model is not None:
            self.metrics = EngineMetrics.attach(backend)
        self.backend = backend
        self.ready.set()


def current():
    """The app's State (inside a request)."""
    return current_app.extensions["first_token"]
