"""A cold start on demand: the model loaded again from disk while the engine runs,
as a restarted server would (the page's "Reload model" control, the `cold-start` preset).

It runs on the engine thread (the driver's `ReloadModel` command), so nothing is computed while
it loads: requests that arrive meanwhile wait in the inbox and are admitted after, and the
part of their wait that overlapped the load is their TTFT's `load` stage (engine/timing/recorder.py),
not "queue". The new weights get a new runner (its prepacked copies are made again); the KV
store and every block stay as they were, so requests already running carry on (the weights
are the same values, read again), and so do the kernels set up for each forward shape so far:
they live in the process, not the runner, so no shape is new again (engine/model/runner.py
`SHAPES`). `model_load` says when it started and ended, and /healthz and /metrics report the
last load's time.
"""
from ..events import ModelLoad
from .runner import Runner


def run(engine, load):
    """Load the model again with `load()` (a function returning a model bundle) and swap it
    in; the `model_load` event. Raises what the load raises (the driver reports it)."""
    start = engine.clock.now()
    bundle = load()
    if bundle.model.config.to_dict() != engine.bundle.model.config.to_dict():
        raise ValueError("the reloaded model's shapes differ from the running one's")
    engine.bundle = bundle
    engine.runner = Runner(bundle.model, engine.store, bundle.quant)
    engine.runner.formats.use(engine.settings.now.scheduling.weights)
    engine.runner.formats.int8 = engine.settings.now.scheduling.activations == "int8"
    if engine.config.release_model_weights:
        engine.runner.release_model_weights()
    end = engine.clock.now()
    engine.timing.model_loaded(start, end)
    return [ModelLoad(t=end, start=start, end=end, seconds=end - start, from_cache=bundle.from_cache,
                      reason="reload")]
