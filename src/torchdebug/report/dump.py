"""The HTML page of an eager dump: per rank, an overview worth opening on a clean dump, and the
first NaN/Inf with every slot that holds one when there is one.

The overview is aggregated from the records in one pass (:func:`overview`), so its size follows the
number of modules, not of records (a dump may hold millions): records and op calls per phase; the
slots with the largest magnitudes (``max(|min|, |max|)``, one slot per distinct tensor: an op's
output, the next op's input and views of it, which hold the same statistics, count once); and per module its
records, op calls, largest magnitude in forward and backward, largest L2 norm and NaN/Inf slots,
with an inline SVG plot of those magnitudes along the modules. The slot table of NaN/Inf stops at
:data:`MAX_OVERFLOW_ROWS`.

Rendered from plain data the caller gathered (``torchdebug report DUMP``: one dict per rank), so
this layer reads nothing above it; every name reaches the page escaped.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Any

from torchdebug.records import PHASES, Record
from torchdebug.report import render
from torchdebug.stats import COUNTS, NONFINITE_KEYS, VALUE_KEYS

__all__ = ["MAX_OVERFLOW_ROWS", "overflow_rows", "overview", "render_dump"]

LARGEST = 12
"""Slots listed under "largest magnitudes"."""
MAX_MODULES = 2000
"""Modules in the table and the plot at most (in order of first use); the rest are counted."""
MAX_OVERFLOW_ROWS = 1000
"""NaN/Inf slots listed at most (a NaN spreads to everything after it); the rest are counted."""

_WIDTH, _HEIGHT = 1000, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 14, 40
_SERIES = ("forward", "backward", "optimizer")
_SIGNED = VALUE_KEYS
COLORS = {"forward": "#1f77b4", "backward": "#d9730d", "optimizer": "#2e7d32"}
"""Phase colours of the plot and its legend."""


_FLOATING = ("float", "bfloat", "complex")
"""dtypes whose magnitudes mean something (not token ids, indices or masks)."""


def _nonfinite(stats: dict[str, Any]) -> bool:
    return any(map(stats.get, NONFINITE_KEYS))


class _Tally:
    """What the page shows of one module in one phase, gathered record by record (an op call
    belongs to one module and one phase, so calls add up over modules and over phases)."""

    __slots__ = ("records", "calls", "stats", "tensors", "nonfinite", "largest", "largest_slot", "norm", "norm_slot")

    def __init__(self) -> None:
        self.records = self.stats = self.tensors = self.nonfinite = 0
        self.calls: set[tuple[int, int]] = set()
        self.largest: float | None = None
        self.largest_slot = ""
        self.norm: float | None = None
        self.norm_slot = ""


def _module_row(name: str, tallies: dict[str, _Tally]) -> dict[str, Any]:
    norms = [(t.norm, t.norm_slot) for t in tallies.values() if t.norm is not None]
    norm = max(norms, key=lambda item: item[0]) if norms else None
    return {
        "module": name,
        "records": sum(t.records for t in tallies.values()),
        "calls": sum(len(t.calls) for t in tallies.values()),
        "phases": {phase: t.records for phase, t in tallies.items()},
        "largest": {phase: {"value": t.largest, "slot": t.largest_slot} for phase, t in tallies.items() if t.largest is not None},
        "norm": {"value": norm[0], "slot": norm[1]} if norm else None,
        "nonfinite": sum(t.nonfinite for t in tallies.values()),
    }


def _phase_row(name: str, tallies: list[_Tally]) -> dict[str, Any]:
    largest = [t.largest for t in tallies if t.largest is not None]
    return {
        "phase": name,
        "records": sum(t.records for t in tallies),
        "calls": sum(len(t.calls) for t in tallies),
        "stats": sum(t.stats for t in tallies),
        "tensors": sum(t.tensors for t in tallies),
        "nonfinite": sum(t.nonfinite for t in tallies),
        "largest": max(largest) if largest else None,
    }


def _slot(record: Record, magnitude: float) -> dict[str, Any]:
    stats = record.stats or {}
    return {
        "name": record.name,
        "step": record.step,
        "phase": record.phase,
        "module": record.module,
        "dtype": record.dtype,
        "shape": record.shape,
        "min": stats.get("min"),
        "max": stats.get("max"),
        "norm": stats.get("norm"),
        "counts": [(a.label or a.field, stats.get(a.field)) for a in COUNTS],
        "magnitude": magnitude,
        "source": record.source,
    }


def overview(records: Iterable[Record], largest: int = LARGEST) -> dict[str, Any]:
    """The aggregates the page shows for one rank, from one pass over its records.

    ``steps`` (sorted), ``phases`` (rows: ``phase``, ``records``, ``calls``, ``stats``,
    ``tensors``, ``nonfinite``, ``largest``), ``largest`` (the ``largest`` slots by finite
    magnitude, biggest first; floating dtypes only: an integer tensor's magnitude is a token id or
    an index), ``modules`` (rows in order of first use: ``module``, ``records``, ``calls``,
    ``phases`` (records per phase), ``largest`` (per phase: ``value`` and ``slot``), ``norm``
    (``value`` and ``slot``), ``nonfinite``) and ``more_modules`` (how many are left out past
    :data:`MAX_MODULES`).

    The loop runs once per record (a million in a big dump), so it stays flat: one tally per module
    and phase, dtypes classified once.
    """
    steps: set[int] = set()
    modules: dict[str, dict[str, _Tally]] = {}
    floating: dict[str | None, bool] = {}
    heap: list[tuple[float, int, tuple[Any, ...], Record]] = []  # the largest slots, smallest on top
    kept: set[tuple[Any, ...]] = set()  # signatures of the tensors in the heap
    for order, record in enumerate(records):
        step = record.step
        steps.add(step)
        tallies = modules.get(record.module)
        if tallies is None:
            tallies = modules[record.module] = {}
        tally = tallies.get(record.phase)
        if tally is None:
            tally = tallies[record.phase] = _Tally()
        tally.records += 1
        tally.calls.add((step, record.seq))
        if record.tensor:
            tally.tensors += 1
        stats = record.stats
        if not stats:
            continue
        tally.stats += 1
        if _nonfinite(stats):
            tally.nonfinite += 1
        dtype = record.dtype
        scaled = floating.get(dtype)
        if scaled is None:
            scaled = floating[dtype] = dtype is not None and dtype.startswith(_FLOATING)
        if not scaled:
            continue
        norm = stats.get("norm")
        if norm is not None and (tally.norm is None or norm > tally.norm):
            tally.norm, tally.norm_slot = float(norm), record.name
        low, high = stats.get("min"), stats.get("max")
        if low is None or high is None:  # an empty or all-NaN tensor
            continue
        magnitude = float(max(abs(low), abs(high)))
        if tally.largest is None or magnitude > tally.largest:
            tally.largest, tally.largest_slot = magnitude, record.name
        if magnitude == math.inf or (len(heap) == largest and magnitude <= heap[0][0]):
            continue  # Infs are listed with the NaNs
        # the same values seen again: an output, then the next op's input, or a view of it
        signature = (step, dtype, math.prod(record.shape or ()), *(stats.get(k) for k in _SIGNED))
        if signature in kept:
            continue
        kept.add(signature)
        entry = (magnitude, -order, signature, record)
        if len(heap) < largest:
            heapq.heappush(heap, entry)
        else:
            kept.discard(heapq.heappushpop(heap, entry)[2])
    by_phase: dict[str, list[_Tally]] = {}
    for tallies in modules.values():
        for phase, tally in tallies.items():
            by_phase.setdefault(phase, []).append(tally)
    names = list(modules)
    return {
        "steps": sorted(steps),
        "phases": [_phase_row(phase, by_phase[phase]) for phase in sorted(by_phase, key=_phase_order)],
        "largest": [_slot(record, magnitude) for magnitude, _, _, record in sorted(heap, reverse=True)],
        "modules": [_module_row(name, modules[name]) for name in names[:MAX_MODULES]],
        "more_modules": max(len(names) - MAX_MODULES, 0),
    }


def _phase_order(phase: str) -> tuple[int, str]:
    return (PHASES.index(phase) if phase in PHASES else len(PHASES), phase)


def overflow_rows(records: Iterable[Record], limit: int = MAX_OVERFLOW_ROWS) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` slots whose statistics count a NaN or an Inf, and how many more there are."""
    rows: list[dict[str, Any]] = []
    more = 0
    for r in records:
        if not r.stats or not _nonfinite(r.stats):
            continue
        if len(rows) == limit:
            more += 1
            continue
        rows.append(
            {
                "name": r.name,
                "phase": r.phase,
                "module": r.module,
                "source": r.source,
                "dtype": r.dtype,
                "shape": r.shape,
                "nan": r.stats.get("nan") or 0,
                "inf": (r.stats.get("posinf") or 0) + (r.stats.get("neginf") or 0),
            }
        )
    return rows, more


def _plot(modules: list[dict[str, Any]]) -> dict[str, Any] | None:
    """SVG coordinates of the largest magnitude per module and phase (log scale), modules along x
    in order of first use; zeros sit on the bottom line, Infs on the top one. ``None`` when no
    module has a magnitude."""
    values = [row["largest"][p]["value"] for row in modules for p in _SERIES if p in row["largest"]]
    finite = [v for v in values if 0 < v < math.inf]
    if not values:
        return None
    low = math.floor(math.log10(min(finite))) if finite else 0
    high = math.ceil(math.log10(max(finite))) if finite else 1
    if high <= low:
        high = low + 1
    has_inf = any(v == math.inf for v in values)
    top = high + (1 if has_inf else 0)  # a band above the finite values for Infs
    count = len(modules)

    def x(index: int) -> float:
        return round(_LEFT + (index + 0.5) * (_WIDTH - _LEFT - _RIGHT) / count, 1)

    def y(value: float) -> float:
        level = top if value == math.inf else (math.log10(value) if value > 0 else low)
        return round(_TOP + (top - level) * (_HEIGHT - _TOP - _BOTTOM) / (top - low), 1)

    decades = max(1, math.ceil((high - low) / 8))
    dots = []
    for index, row in enumerate(modules):
        for phase in _SERIES:
            best = row["largest"].get(phase)
            if best is not None:
                title = f"{row['module']} ({phase}): largest |x| {best['value']:.4g} in {best['slot']}"
                dots.append({"x": x(index), "y": y(best["value"]), "phase": phase, "title": title})
    ticks = [{"y": y(10.0**e), "label": f"1e{e}"} for e in range(low, high + 1, decades)]
    if has_inf:
        ticks.append({"y": y(math.inf), "label": "inf"})
    return {
        "width": _WIDTH,
        "height": _HEIGHT,
        "left": _LEFT,
        "right": _WIDTH - _RIGHT,
        "top": _TOP,
        "bottom": _HEIGHT - _BOTTOM,
        "dots": dots,
        "y_ticks": ticks,
        "first": modules[0]["module"],
        "last": modules[-1]["module"],
    }


def render_dump(*, path: str, ranks: list[dict[str, Any]]) -> str:
    """The complete HTML page (a string; the caller writes it).

    Each rank: ``rank``, ``task``, ``complete``, ``write_fault`` (one line on a dump truncated by a
    failed write, or ``None``), ``records`` (count), ``first`` (the first NaN/Inf
    described in one line, or ``None``), ``overflows`` and ``more_overflows`` (from
    :func:`overflow_rows`), ``damaged`` (rows with ``file``, ``reason``, ``records``: tensor
    files that cannot be read) and ``overview`` (from :func:`overview`); for a flight recorder's
    window also ``monitor`` (its event) and ``timeline`` (from
    :func:`torchdebug.report.timeline.timeline`).
    """
    blank = {"monitor": None, "timeline": None, "write_fault": None}
    shown = [{**blank, **rank, "plot": _plot(rank["overview"]["modules"])} for rank in ranks]
    return render(
        "dump.html.j2", title=f"torchdebug dump {path}", path=path, ranks=shown, colors=COLORS, phases=_SERIES, inf=math.inf
    )
