"""The HTML page of a ``TORCH_COMPILE_DEBUG`` run: models, graph breaks, recompiles, pass pipelines.

Rendered from what :func:`torchdebug.compile._debug_report.collect` read from the run's folder,
passed down as plain data (models, phases and pass steps with their diffs); inline CSS only.
"""

from __future__ import annotations

from typing import Any

from torchdebug.report import render

__all__ = ["render_compile"]


def render_compile(
    *, folder: str, models: list[Any], graph_breaks: list[dict[str, Any]], recompiles: list[dict[str, Any]], max_diff: int
) -> str:
    """The complete HTML page (a string; the caller writes it)."""
    return render(
        "compile.html.j2", folder=folder, models=models, graph_breaks=graph_breaks, recompiles=recompiles, max_diff=max_diff
    )
