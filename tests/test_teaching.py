"""The teaching layer in real Chromium on the in-process tiny engine (`live`): presets change
the engine as they say (read from the page's own event stream), the guided tour applies them
and spots the page's parts, presenter mode and its shortcuts, the measure sheet and the
side-by-side comparison."""
import pytest

from test_browser import Page


class TeachPage(Page):
    """A page with the teaching helpers."""

    def fmt(self, seconds):
        """A duration as the page writes it (FT.fmtS)."""
        return self.js("v => FT.fmtS(v)", seconds)
