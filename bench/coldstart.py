"""Cold start: seconds from launching `python app.py` to `/healthz` answering status ok."""
import tempfile

from .launch import App

def start_to_ready(cache_dir=None, timeout=600):
    """(seconds, healthz body) for one start; `cache_dir` overrides FIRST_TOKEN_CACHE."""
    app = App(env=None if cache_dir is None else {"FIRST_TOKEN_CACHE": str(cache_dir)}, timeout=timeout)
    app.stop()
    return app.ready_s, app.health


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
