"""`python app.py` as users start it: in a subprocess on a free loopback port, waited on until
/healthz answers ok. Used by the benchmarks (cold start, page frame rate) and by the tests
that need the real app in its own process (browser, observe mode, restarts).

Every bench runs the bundled model unless FIRST_TOKEN_BENCH_MODEL names another (`bench_model`):
a model directory or .gguf (passed to app.py as --model and loaded in process), or
`module:function` returning a model bundle (in-process benches only). The smoke test
(tests/engine/test_bench.py) runs each bench's smallest configuration on the tiny model so.
"""
import json
import os
from pathlib import Path
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = Path(__file__).resolve().parents[1]
# Debian's Chromium, as the page benchmark and the browser tests drive it (playwright cannot
# download a browser here).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


MODEL_ENV = "FIRST_TOKEN_BENCH_MODEL"


def bench_model():
    """The model the benches run instead of the bundled one (FIRST_TOKEN_BENCH_MODEL), or None."""
    return os.environ.get(MODEL_ENV) or None


def load_bundle(**kw):
    """The benches' model bundle, loaded in this process (`engine.model.loading.load` keywords)."""
    import importlib
    from engine.model import loading
    spec = bench_model()
    if spec and ":" in spec and not Path(spec).exists():
        module, _, fn = spec.partition(":")
        return getattr(importlib.import_module(module), fn)()
    return loading.load(spec, **kw)


def bench_tokenizer():
    """The tokenizer of the model the benches' app serves (its cache directory for the bundled GGUF)."""
    from transformers import AutoTokenizer
    from engine.model import loading
    spec = bench_model()
    return AutoTokenizer.from_pretrained(spec or loading._gguf_cache_dir(loading.default_model_path()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(url, timeout=2):
    """(HTTP status, body) of /healthz; (None, None) while nothing listens."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except OSError:   # its body did not come in time (a busy machine, a loading app): the status did
            return e.code, None
    except OSError:
        return None, None


class App:
    """One `python app.py` process. `port`: a fixed one (a restarted server pages reconnect to);
    `log`: a file for its output (default: discarded); `env`: extra environment variables."""

    def __init__(self, *args, port=None, log=None, env=None, timeout=180):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        self.log = log
        out = open(log, "w") if log else subprocess.DEVNULL
        self.started = time.perf_counter()
        if bench_model() and not {"--model", "--observe"} & set(args):
            args = ("--model", bench_model(), *args)
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *args],
                                     stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **(env or {})})
        if log:
            out.close()
        self.ready_s, self.health = self._wait(timeout)

    def _wait(self, timeout):
        while time.perf_counter() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}; see {self.log or 'its output'}")
            status, body = healthz(self.url)
            if status == 200 and body.get("status") == "ok":
                return time.perf_counter() - self.started, body
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"app.py not ready in {timeout} s; see {self.log or 'its output'}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
