"""Moved: the watcher scene is :mod:`torchdebug.graph_dump.scenes._watcher`. ``find_overwrites`` and
``Overwrite`` still import from here, with a ``FutureWarning``."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("Overwrite", "find_overwrites")


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"torchdebug.capture.watcher.{name} moved to torchdebug.graph_dump.{name}; the old name will be removed",
        FutureWarning,
        stacklevel=2,
    )
    from torchdebug.graph_dump.scenes import _watcher as watcher

    return getattr(watcher, name)
