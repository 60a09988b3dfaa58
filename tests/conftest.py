"""Fixtures: the tiny random model (fast unit tests), the real bundled model, the real app."""
from collections import Counter
import os

import pytest

from engine.model import loading as model_mod
from helpers import LiveApp, engine_driver, start_app, tiny_bundle, tiny_quant_bundle


# The fixtures that bring Chromium or the real model mark every test using them (directly or through
# another fixture), so a new test cannot miss its marker; a test that starts the real app itself is
# marked where it is written.
MARKED_BY_FIXTURE = {"browser": "browser", "real": "real_model", "server": "real_model"}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in MARKED_BY_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
    # `make test` runs two processes that each take whole files (Makefile XDIST): the files with
    # the most slow and browser tests go first, so neither process is left alone with a long file
    # at the end. A stable sort: each file's tests keep their order.
    weight = Counter()
    for item in items:
        weight[item.path] += 30 if item.get_closest_marker("slow") else 8 if item.get_closest_marker("browser") else 1
    items.sort(key=lambda item: -weight[item.path])


def pytest_configure(config):
    config.addinivalue_line("markers", "driver(**keywords): the `driver` fixture's engine_driver keywords "
                                       "(tests/helpers.py) for a test or a module")
    # Under `make test` two test processes share two cores: torch's default of a thread per core in
    # each oversubscribes them, and OpenMP threads spinning on a taken core made real-model tests
    # ~10x slower than alone (a 2,048-position agreement check: 10 s alone, 102 s in the suite).
    # One model thread a process; a test that wants more sets it itself.
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        import torch
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")   # and the servers and benches a test starts


@pytest.fixture(scope="session")
def tiny():
    return tiny_bundle()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The tiny model saved as a model directory, for what takes a path: app.py's --model, the
    benches' FIRST_TOKEN_BENCH_MODEL."""
    d = tmp_path_factory.mktemp("tiny-model")
    b = tiny_bundle()
    b.model.save_pretrained(d)
    b.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def real():
    """The bundled SmolLM2-135M-Instruct (dequantised once, then loaded from the disk cache), on
    the CPU in fp32 unless FIRST_TOKEN_TEST_DEVICE / FIRST_TOKEN_TEST_DTYPE say otherwise
    (so the same tests can check a CUDA box in bfloat16 or float32)."""
    return model_mod.load(device=os.environ.get("FIRST_TOKEN_TEST_DEVICE", "cpu"),
                          dtype=os.environ.get("FIRST_TOKEN_TEST_DTYPE", "float32"))


@pytest.fixture
def driver(tiny, request):
    """An engine driver on the tiny model, shut down after the test: tests/helpers.py's
    `engine_driver` (4 slots, 4,096 KV tokens, a 512-token context, started), with the keywords
    of a `pytest.mark.driver(...)` on the test or its module."""
    marker = request.node.get_closest_marker("driver")
    d = engine_driver(tiny, **(marker.kwargs if marker else {}))
    yield d
    d.shutdown()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test."""
    from playwright.sync_api import sync_playwright
    from bench.launch import CHROMIUM, CHROMIUM_ARGS
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def server():
    """One shared app on the real model, in its own process as users start it, for the
    browser, observe-mode and end-to-end tests. Tests that change settings restore them."""
    # One model thread: on a 2-core machine the browser under test needs the other core, and
    # two model threads contending with it stall each other (docs/performance.md).
    app = start_app("--threads", "1")
    yield app
    app.stop()


def _live_app(bundle):
    """A fresh in-process app on `bundle` (4 slots) for one test."""
    from engine import EngineConfig
    app = LiveApp(bundle, EngineConfig(slots=4, kv_tokens=4096, max_context=512))
    yield app
    app.stop()


@pytest.fixture
def live(tiny):
    """The tiny model's app."""
    yield from _live_app(tiny)


@pytest.fixture(scope="module")
def quant():
    """The tiny model stored as Q4_1 blocks (tests/helpers.py tiny_quant_bundle)."""
    return tiny_quant_bundle()


@pytest.fixture
def qlive(quant):
    """The app on the tiny model with its blocks: both weights formats switchable."""
    yield from _live_app(quant)
