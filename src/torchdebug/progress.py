"""Progress bars for long work: compare, replay, diagnose's stage ladder, convert, writing tensor files.

Every caller goes through :func:`bar` or :func:`track`, so one place decides whether a bar shows:
on stderr, only when stderr is a terminal, only on process 0 of a distributed job (other ranks
would draw over it), never after :func:`set_enabled` ``(False)`` (the CLI's ``--quiet``), and only
once the work has lasted :data:`DELAY` seconds, so quick work prints nothing. Bars vanish when the
work ends, leaving the terminal to the results. tqdm draws them; it is imported on the first bar
shown, never by ``import torchdebug``. :class:`LogHandler` prints log lines above a running bar.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

__all__ = ["DELAY", "Bar", "LogHandler", "bar", "enabled", "set_enabled", "track"]

DELAY = 1.0
"""Seconds of work before its bar appears."""

_T = TypeVar("_T")
_enabled = True


class Bar(Protocol):
    """What callers use of a bar (tqdm's names)."""

    def update(self, n: float = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...


class _Silent:
    """The bar when bars are off: does nothing."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass


def set_enabled(enabled: bool) -> bool:
    """Show bars (the default, on a terminal) or never show them in this process (``--quiet``);
    returns the previous setting, to restore it."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def enabled() -> bool:
    """Whether a bar would show now: not turned off, stderr is a terminal, and this is process 0."""
    if not _enabled or not sys.stderr.isatty():
        return False
    from torchdebug.dist import rank_and_world_size  # loads torch.distributed: only once a bar may show

    return rank_and_world_size()[0] == 0


@contextmanager
def bar(total: float | None, desc: str, unit: str = "it") -> Iterator[Bar]:
    """A bar over ``total`` units (``None``: unknown), advanced with ``bar.update(n)``; ``unit="B"``
    counts bytes (shown as kB, MB, ...). tqdm's bar is thread-safe: worker threads may update it."""
    if not enabled():
        yield _Silent()
        return
    from tqdm import tqdm

    with tqdm(
        total=total,
        desc=f"torchdebug: {desc}",
        unit=unit,
        unit_scale=unit == "B",
        delay=DELAY,
        leave=False,
        dynamic_ncols=True,
        file=sys.stderr,
    ) as shown:
        yield shown


def track(items: Iterable[_T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[_T]:
    """``items``, one by one, with a bar advancing as each is consumed (``total`` defaults to
    ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]  # it has __len__ (checked above)
    with bar(total, desc, unit) as shown:
        for item in items:
            yield item
            shown.update(1)


class LogHandler(logging.StreamHandler):
    """Log lines to stderr, printed above a running bar instead of through it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if "tqdm" not in sys.modules or not enabled():
            super().emit(record)
            return
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # a logging handler must never raise into the code that logs
            self.handleError(record)
