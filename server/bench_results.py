"""The committed `python -m bench` results, for the page's "measured on" tables.

They describe the machine named in their `machine` field, which may not be this one; the
live decode floor is measured at start (`hello.bandwidth`). Read here, by the web layer,
and handed to the engine so it carries them in `hello`: the engine never reads bench files.
"""
import json
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load(model, device, dtype):
    """bench/results-<device>.json when it was measured for this model, device and dtype; else None."""
    try:
        data = json.loads((BENCH_DIR / f"results-{device}.json").read_text())
    except (OSError, ValueError):
        return None
    if (data.get("model"), data.get("device"), data.get("dtype")) != (model, device, dtype):
        return None
    return data
