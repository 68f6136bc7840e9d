"""The HTML report of a comparison: summary, first divergence with its stack, table, error plot."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torchdebug.report import render

if TYPE_CHECKING:
    from torchdebug.compare.result import CompareResult
    from torchdebug.compare.rows import Row

__all__ = ["render_compare"]

_PLOT_WIDTH, _PLOT_HEIGHT = 900, 260
_LOG_FLOOR = -12.0  # errors below 1e-12 (and exact zeros) sit on the bottom line
_MAX_POINTS = 20000
_COLORS = {"pass": "#3b8b3b", "warning": "#d08a00", "error": "#c62828", "unmatched": "#888888"}


def _plot(rows: list[Row]) -> dict[str, Any]:
    """SVG coordinates of error (log scale) against execution order, coloured by verdict."""
    points = [row for row in rows if row.error is not None and row.matched][:_MAX_POINTS]
    logs = [max(_LOG_FLOOR, math.log10(row.error)) if row.error > 0 else _LOG_FLOOR for row in points]
    top = max([0.0, *logs])
    top = math.ceil(top)
    span = top - _LOG_FLOOR or 1.0
    count = max(len(points) - 1, 1)
    dots = [
        {
            "x": round(10 + index * (_PLOT_WIDTH - 20) / count, 1),
            "y": round(10 + (top - value) * (_PLOT_HEIGHT - 30) / span, 1),
            "color": _COLORS.get(row.verdict, "#888888"),
            "title": f"{row.name}: error {row.error:.3g} ({row.verdict})",
        }
        for index, (row, value) in enumerate(zip(points, logs))
    ]
    ticks = [
        {"y": round(10 + (top - exponent) * (_PLOT_HEIGHT - 30) / span, 1), "label": f"1e{int(exponent)}"}
        for exponent in range(int(top), int(_LOG_FLOOR) - 1, -2)
    ]
    return {"width": _PLOT_WIDTH, "height": _PLOT_HEIGHT, "dots": dots, "ticks": ticks, "colors": _COLORS}


def render_compare(result: CompareResult) -> str:
    """The complete HTML page for ``result`` (a string; the caller writes it)."""
    first, nonfinite = result.first_divergence, result.first_nonfinite
    return render(
        "compare.html.j2",
        title=result.heading,
        sides=result.sides(),
        ranks=[{"rank": rank, "counts": result.counts(rank), "rows": len(result.rank_rows(rank))} for rank in result.ranks],
        counts=result.counts(),
        first=result.describe(first) if first else None,
        nonfinite=result.describe(nonfinite) if nonfinite else None,
        problems=result.problems,
        rows=result.rows,
        plot=_plot(result.rows),
    )
