"""What the web layer serves from: the `Backend` protocol, met by the engine's driver
(engine/driver.py) and by observe mode (observe/backend.py), so the page and the API serve
either; what only one of them has (a model of its own, for /v1 and /metrics) is asked of `mode`.
"""
from enum import StrEnum
from typing import Protocol

from .broadcast import Broadcaster
from .events import Clock, Hello
from .core.request import GenerateRequest, RequestHandle
from .settings import Live


class Mode(StrEnum):
    """Which backend serves the page; hello.mode and /healthz's `mode` carry its value."""
    ENGINE = "engine"      # this app's own model and engine
    OBSERVE = "observe"    # another OpenAI-compatible server, watched as a client


class Backend(Protocol):
    mode: Mode
    clock: Clock
    events: Broadcaster           # every event it publishes; pages subscribe here
    specs: dict                   # name -> settings.Setting: the controls it accepts
    settings: Live                # their current values: `now`, one immutable Settings (observe
                                  # mode's holds the engine's defaults beside the few it has)
    api_model: str | None         # the model /v1 serves here (Mode.ENGINE); None in observe mode
    max_context: int | None

    def hello(self) -> Hello: ...

    def health(self) -> tuple[dict, int]:
        """(/healthz body, HTTP status)."""

    def submit(self, request: GenerateRequest) -> RequestHandle:
        """Queue one request (engine/core/request.py); SettingError (nothing queued) names a field
        it cannot take. Observe mode takes the page's and a classroom student's fields only
        (prompt, chat, the request registry's, engine/core/fields.py, label, stream, source): the
        API, which sends the rest (messages, stop strings), needs a model of its own."""

    def cancel(self, rid: str) -> None: ...

    def clear_queue(self) -> None:
        """Cancel every waiting request (the classroom presenter's; observe mode: every request
        still waiting for its first chunk)."""

    def update_settings(self, changes: dict) -> dict:
        """Validate every change (SettingError, nothing applied, on any bad one), then apply."""

    def burst(self, n: int, seed: int | None = None) -> None:
        """`n` load-generator requests now; a `seed` makes their prompts repeatable."""

    def reset(self) -> None: ...

    def apply_preset(self, name: str, settings: dict | None = None) -> None:
        """Reset and set up a teaching preset (engine/teach/presets.py), `settings` over its own;
        SettingError (nothing changed) for an unknown name or a bad setting."""

    def measure(self) -> None:
        """Sweep decode cost (engine/timing/measure.py); the results arrive as `measure` events."""

    def reload(self) -> None:
        """Load the model again from its on-disk cache (a cold start, engine/model/reload.py; a
        `model_load` event follows); SettingError when it cannot be (observe mode)."""

    def shutdown(self) -> None: ...
