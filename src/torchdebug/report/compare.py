"""The HTML report of a comparison: summary, first divergence, error plot, module tree and table.

The plot is drawn here as SVG: error (log scale) against execution order, one dot per compared
row, coloured by verdict, with the phases of the first rank shaded and the first divergence and
first non-finite op marked and linked to their table rows. The rows and the plot's dots reach the
page packed (:mod:`torchdebug.report.packed`: a string table and typed columns, gzip'd, about
10–40 bytes a row instead of 600–700 as markup), so a page of 268k rows stays near 10 MB and
opens in seconds. ``compare.js`` unpacks them and draws the dots, the module tree, the filters
(phase, rank, verdict, text, module) and a paged, sortable table; it writes every name with
``textContent``, never as markup.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Protocol

import numpy as np

from torchdebug.report import render
from torchdebug.report.packed import Column, pack

__all__ = ["PAGE_ROWS", "render_compare"]


class Row(Protocol):
    """What the page reads of a compared row (``torchdebug.compare.Row``; :func:`_columns` reads its
    other fields by name). The report layer sits below compare: results are passed down to it."""

    rank: int
    step: int
    phase: str
    name: str
    matched: bool
    difference: float | None
    verdict: str


class Result(Protocol):
    """What the page reads of a ``torchdebug.compare.CompareResult``."""

    rows: list[Any]
    problems: list[str]
    heading: str
    ranks: list[int]
    first_divergence: Any
    first_nonfinite: Any

    def sides(self) -> Any: ...
    def counts(self, rank: int | None = None) -> dict[str, int]: ...
    def rank_rows(self, rank: int) -> list[Any]: ...
    def describe(self, row: Any) -> dict[str, Any]: ...


_WIDTH, _HEIGHT = 1000, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 26, 44  # margins: room for the axes' labels
_LOG_FLOOR = -12.0  # differences below 1e-12 (and exact zeros) sit on the bottom line
_MAX_POINTS = 20000  # beyond this, passing rows are thinned out (every non-passing row stays)
_MAX_BANDS = 24  # more phase changes than this (many steps): no shading
STRUCTURE_ROWS = 500
"""Structure differences the page lists (the JSON output holds them all)."""
PAGE_ROWS = 100
"""Rows the table shows at once (a page; every row is a few clicks away through filters and links)."""
COLORS = {
    "pass": "#3b8b3b",
    "warning": "#d08a00",
    "undecided": "#7b1fa2",
    "error": "#c62828",
    "incomparable": "#4f7391",
    "unmatched": "#888888",
}
"""Verdict colours, shared by the plot, the table and the module tree."""


def _nice_step(span: float, count: int) -> int:
    """A round step (1, 2 or 5 times a power of ten) giving about ``count`` ticks over ``span``."""
    raw = max(span / count, 1.0)
    power = 10 ** math.floor(math.log10(raw))
    return int(next(f * power for f in (1, 2, 5, 10) if f * power >= raw))


def _positions(rows: Sequence[Row]) -> list[int]:
    """Each row's place (from 1) in its rank's execution order: ranks share the x axis."""
    seen: dict[int, int] = {}
    positions = []
    for row in rows:
        positions.append(seen.get(row.rank, 0) + 1)
        seen[row.rank] = positions[-1]
    return positions


def _plotted(rows: Sequence[Row]) -> list[int]:
    """Indexes of the rows drawn: matched, with a difference that is not NaN (an infinite one sits on
    the top line); passing rows thinned out past :data:`_MAX_POINTS`."""
    drawn = [i for i, row in enumerate(rows) if row.matched and row.difference is not None and not math.isnan(row.difference)]
    if len(drawn) <= _MAX_POINTS:
        return drawn
    loud = [i for i in drawn if rows[i].verdict != "pass"]
    quiet = [i for i in drawn if rows[i].verdict == "pass"]
    stride = math.ceil(len(quiet) / max(_MAX_POINTS - len(loud), 1))
    return sorted(loud + quiet[::stride])


def _bands(rows: Sequence[Row], positions: list[int], x: Any) -> list[dict[str, Any]]:
    """Shaded spans of the first rank's phases (``step 1 backward`` when there are several steps)."""
    first_rank = min((row.rank for row in rows), default=0)
    spans: list[list[Any]] = []
    for row, position in zip(rows, positions):
        if row.rank != first_rank:
            continue
        if spans and spans[-1][0] == (row.step, row.phase):
            spans[-1][2] = position
        else:
            spans.append([(row.step, row.phase), position, position])
    if len(spans) > _MAX_BANDS:
        return []
    steps = len({step for (step, _), _, _ in spans})
    return [
        {
            "x": x(start - 0.5),
            "width": max(x(end + 0.5) - x(start - 0.5), 1.0),
            "shade": index % 2 == 0,
            "label": f"step {step} {phase}" if steps > 1 else phase,
        }
        for index, ((step, phase), start, end) in enumerate(spans)
    ]


def _log_difference(difference: float) -> float:
    """log10 of a difference, from :data:`_LOG_FLOOR` (exact zeros) up to 12 (an infinite one)."""
    return max(_LOG_FLOOR, min(math.log10(difference), 12.0)) if difference > 0 else _LOG_FLOOR


_MARKS = {"divergence": "first divergence", "nonfinite": "first non-finite"}


def _plot(rows: Sequence[Row], marks: dict[str, int | None]) -> dict[str, Any]:
    """SVG coordinates: dots (columns: row index, x, y), axes with ticks, phase bands, and the rows at
    the indexes ``marks`` gives for each of :data:`_MARKS` (``None``: not marked)."""
    positions = _positions(rows)
    last = max(positions, default=1)
    plotted = _plotted(rows)
    logs = {i: _log_difference(difference) for i in plotted if (difference := rows[i].difference) is not None}
    top = float(math.ceil(max([0.0, *logs.values()])))
    span = top - _LOG_FLOOR

    def x(position: float) -> float:
        return round(_LEFT + (position - 0.5) * (_WIDTH - _LEFT - _RIGHT) / last, 1)

    def y(value: float) -> float:
        return round(_TOP + (top - value) * (_HEIGHT - _TOP - _BOTTOM) / span, 1)

    decades = 1 if span <= 8 else 2
    step = _nice_step(last, 8)
    marked = [
        {"kind": kind, "label": label, "row": index + 1, "x": x(positions[index])}
        for kind, label in _MARKS.items()
        if (index := marks.get(kind)) is not None
    ]
    return {
        "width": _WIDTH,
        "height": _HEIGHT,
        "left": _LEFT,
        "right": _WIDTH - _RIGHT,
        "top": _TOP,
        "bottom": _HEIGHT - _BOTTOM,
        "dots": {  # packed with the rows: compare.js draws them
            "row": np.array(plotted, dtype=np.int64),
            "x": np.array([x(positions[i]) for i in plotted], dtype=np.float64),
            "y": np.array([y(logs[i]) for i in plotted], dtype=np.float64),
        },
        "y_ticks": [{"y": y(e), "label": f"1e{int(e)}"} for e in range(int(top), int(_LOG_FLOOR) - 1, -decades)],
        "x_ticks": [{"x": x(p), "label": str(p)} for p in dict.fromkeys([1, *range(step, last + 1, step)])],
        "bands": _bands(rows, positions, x),
        "marks": marked,
        "thinned": len(plotted) < sum(1 for row in rows if row.matched and row.difference is not None),
    }


_FLOATS = ("difference", "tolerance")
_METRICS = ("cosine", "max_abs_err", "rel_l2", "max_ulp")
"""The float columns of the table (metrics from ``row.metrics``), in the order of ``absent``'s bits."""


def _columns(rows: Sequence[Any]) -> dict[str, Column]:
    """The table's columns for :func:`~torchdebug.report.packed.pack`: a string column per text the
    table shows or filters on, integers, floats (NaN for ``None``) and ``absent``, whose bit ``k``
    says the ``k``-th float column is ``None`` (an empty cell, where NaN shows ``nan``)."""

    def field(name: str) -> list[Any]:
        return list(map(attrgetter(name), rows))

    floats = [field(name) for name in _FLOATS] + [[row.metrics.get(name) for row in rows] for name in _METRICS]
    absent = np.zeros(len(rows), dtype=np.uint8)
    for bit, values in enumerate(floats):
        absent |= np.fromiter((value is None for value in values), dtype=np.uint8, count=len(rows)) << bit
    return {
        **{name: field(name) for name in ("verdict", "attribution", "match", "phase", "module", "op", "io", "arg", "message")},
        "dtype_a": [dtype or "" for dtype in field("dtype_a")],
        "dtype_b": [dtype or "" for dtype in field("dtype_b")],
        "shape": [str(row.shape_a if row.shape_a is not None else (row.shape_b or "")) for row in rows],
        "source": [source or "" for source in field("source")],
        **{name: np.array(field(name), dtype=np.int64) for name in ("rank", "step", "call")},
        **{name: np.array(values, dtype=np.float64) for name, values in zip(_FLOATS + _METRICS, floats)},
        "absent": absent,
    }


def render_compare(result: Result, verdicts: Sequence[str]) -> str:
    """The complete HTML page for ``result`` (a string; the caller writes it); ``verdicts`` in the
    order the page lists them."""
    first, nonfinite = result.first_divergence, result.first_nonfinite
    structure = getattr(result, "structure_differences", [])  # its structure differences (``StructureBlock``), if it has any
    index = {id(row): i for i, row in enumerate(result.rows)}
    marks = {"divergence": index[id(first)] if first else None, "nonfinite": index[id(nonfinite)] if nonfinite else None}
    plot = _plot(result.rows, marks)
    return render(
        "compare.html.j2",
        title=result.heading,
        sides=result.sides(),
        ranks=[{"rank": rank, "counts": result.counts(rank), "rows": len(result.rank_rows(rank))} for rank in result.ranks],
        counts=result.counts(),
        verdicts=verdicts,
        colors=COLORS,
        first={**result.describe(first), "index": index[id(first)] + 1} if first else None,
        nonfinite={**result.describe(nonfinite), "index": index[id(nonfinite)] + 1} if nonfinite else None,
        problems=result.problems,
        structure=[block.to_dict() for block in structure[:STRUCTURE_ROWS]],
        structure_total=len(structure),
        rows=len(result.rows),
        page_rows=PAGE_ROWS,
        phases=list(dict.fromkeys(row.phase for row in result.rows)),
        plot=plot,
        packed=pack({"rows": _columns(result.rows), "dots": plot.pop("dots")}),
    )
