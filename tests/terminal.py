"""A stderr that says it is a terminal, for tests of progress bars."""

from __future__ import annotations

import io
import sys

import pytest

from torchdebug import progress


class Terminal(io.StringIO):
    """Keeps what was drawn; ``isatty()`` is true."""

    def isatty(self) -> bool:
        return True


def on_terminal(monkeypatch: pytest.MonkeyPatch) -> Terminal:
    """Make stderr a terminal for the rest of the test, bars drawn at once. Call it in the test
    body: pytest sets its own stderr between a fixture's setup and the test."""
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.delenv("RANK", raising=False)
    return screen
