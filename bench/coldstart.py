"""Cold start: seconds from launching `python app.py` to `/healthz` answering status ok."""
import json
import os
from pathlib import Path
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = Path(__file__).resolve().parents[1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_to_ready(cache_dir=None, timeout=600):
    """(seconds, healthz body) for one start; `cache_dir` overrides FIRST_TOKEN_CACHE."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["FIRST_TOKEN_CACHE"] = str(cache_dir)
    port = _free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {proc.returncode} before /healthz was ok")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    body = json.loads(r.read())
                if body.get("status") == "ok":
                    return time.perf_counter() - t0, body
            except OSError:          # not listening yet, or 503 while loading
                pass
            time.sleep(0.1)
        raise RuntimeError(f"/healthz not ok within {timeout} s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(first_start):
    """{"second_start_s", "first_start_s" or None}.

    With `first_start`, a fresh temporary weight cache makes the first start dequantise the
    GGUF (slow, ~a minute), and the second start then reads that cache. Without it, the
    user's cache is used; if it was empty that start was a first start, and it is reported so."""
    if first_start:
        with tempfile.TemporaryDirectory(prefix="first-token-cache-") as tmp:
            first, _ = start_to_ready(tmp)
            second, _ = start_to_ready(tmp)
        return {"first_start_s": first, "second_start_s": second}
    s, body = start_to_ready()
    if not body.get("weights_from_cache", True):
        return {"first_start_s": s, "second_start_s": start_to_ready()[0]}
    return {"first_start_s": None, "second_start_s": s}
