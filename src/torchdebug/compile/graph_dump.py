"""Renamed: :mod:`torchdebug.compile.graph_render` (the ``graph_dump`` package dumps op data inside
graphs). The old path still gives its names for one release, with a ``FutureWarning``."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    from torchdebug.compile import graph_render

    if not hasattr(graph_render, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"torchdebug.compile.graph_dump.{name} moved to torchdebug.compile.graph_render.{name}; the old path will be removed",
        FutureWarning,
        stacklevel=2,
    )
    return getattr(graph_render, name)
