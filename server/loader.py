"""Loading the model in the background while the app already serves /healthz and the page.

Any failure (a bad model file, out of memory while allocating the KV cache, ...) is caught
here and reported: /healthz answers 503 with the reason and pages get a fatal `error`.
"""
import gc
import sys
import threading

from engine.model import kernels

from . import bench_results


def start(args, state):
    """Load the model and start the engine on a thread of its own."""
    threading.Thread(target=_load, args=(args, state), name="loader", daemon=True).start()


def driver(args, progress):
    """The model from the command line's flags, loaded, and an engine driver on it, started
    (the server's backend; `app.py record` uses the same). With --disaggregate, a DisaggBackend:
    a prefill and a decode engine process, each loading the model itself."""
    from engine import Engine, EngineConfig, EngineDriver
    from engine.model import loading
    if getattr(args, "disaggregate", False):
        return disaggregated(args, progress)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    # the blocks alone where the engine can read them (no fp32 copy unless the weights setting asks)
    bundle = loading.load(args.model, device=args.device, dtype=args.dtype, progress=progress, dense=False)
    config = EngineConfig(slots=args.slots, kv_tokens=args.kv_tokens, block_size=args.block_size,
                          release_model_weights=True,
                          max_context=args.max_context)
    bench = bench_results.load(bundle.name, bundle.device, bundle.dtype_name)

    def reload():   # the same model again, from the on-disk cache the first load filled (a cold start)
        return loading.load(args.model, device=args.device, dtype=args.dtype, dense=False)
    return EngineDriver(Engine(bundle, config, bench=bench), loader=reload).start()


def disaggregated(args, progress):
    """The two engine processes of --disaggregate (engine/disagg/), on the CPU, each with
    --disagg-threads model threads, started."""
    import functools
    from engine import EngineConfig
    from engine.model import loading
    from engine.disagg.backend import DisaggBackend
    progress("starting the prefill and the decode instance (each loads the model)", 0.1)
    config = EngineConfig(slots=args.slots, kv_tokens=args.kv_tokens, block_size=args.block_size,
                          release_model_weights=True, max_context=args.max_context)
    factory = functools.partial(loading.load, args.model, device="cpu", dtype=args.dtype, dense=False)
    backend = DisaggBackend(factory, config, threads=args.disagg_threads)
    progress("both instances ready", 1.0)
    return backend.start()


def _load(args, state):
    bar = ProgressBar()

    def progress(message, frac):
        state.set_progress(message, frac)
        bar.show(message, frac)
    try:
        backend = driver(args, progress)
    except Exception as e:  # noqa: BLE001 -- whatever it was, say so instead of "loading" forever
        state.set_error(f"{type(e).__name__}: {e}")
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
        return
    # Everything loaded so far (torch, transformers, the model's modules: a few hundred thousand
    # objects) lives as long as the process: out of the collector's sight, so a full collection
    # later walks only what serving creates, not all of that (a pause every page would feel).
    gc.collect()
    gc.freeze()
    state.set_backend(backend)
    if getattr(args, "disaggregate", False):
        pids = ", ".join(f"{i['name']} pid {i['pid']} ({i['threads']} threads)" for i in backend.hello().instances)
        print(f"\nready: {backend.api_model}, disaggregated: {pids}", flush=True)
        return
    bundle = backend.engine.bundle
    w, fmt = backend.engine.hello().weights, backend.settings.now.scheduling.weights
    print(f"\nready: {bundle.name} on {bundle.device} ({bundle.load_s:.1f} s"
          f"{', config and tokenizer from cache' if bundle.from_cache else ''}); weights read: "
          f"{fmt} ({w['formats'][fmt]['decode_bytes'] / 1e6:.0f} MB a decode step)",
          flush=True)
    if bundle.device == "cpu":
        print(kernels.describe(), flush=True)


class ProgressBar:
    def show(self, message, frac):
        width = 30
        fill = int(frac * width)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% {message:<50}")
        sys.stderr.flush()
