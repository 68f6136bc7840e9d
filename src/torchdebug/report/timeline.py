"""The flight recorder's window on the dump page: per-module norms over the steps, the trigger marked.

A window dump (:mod:`torchdebug.monitor._window`) holds the module outputs, gradients and parameters
of the last steps before a trigger. People look at a spike before they read numbers, so the page
draws, for each rank:

- a line plot of the loss and the total gradient norm per step (log scale), the trigger's step marked;
- a heat map with one row per module and one column per step: each cell is the module's output L2
  norm at that step against the module's median over the window (log ratio, blue below, red above,
  black for NaN/Inf). Rows are the trigger's module first, then the modules that move most; at most
  :data:`MAX_ROWS` of them;
- the same map of each module's gradient norm (its own parameters' gradients together), where a
  gradient-norm spike shows which module's gradients jumped, and the one per-module picture of a
  model whose modules ran inside compiled code (only the model's output is watched there).

Built from the records in one pass; the sizes follow modules × steps, never records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from torchdebug.records import LOSS_OP, Record, module_of

MAX_ROWS = 64
"""Modules in the heat map at most."""

_CELL_W, _CELL_H, _LABEL_W = 18, 12, 260
_PLOT_W, _PLOT_H, _PLOT_PAD = 900, 180, 40


def _color(ratio: float | None) -> str:
    """A cell's fill: log2 of the norm over the module's median, clipped to [-4, 4] (blue to red)."""
    if ratio is None:
        return "#000"
    if ratio <= 0:
        return "#eee"
    level = max(-4.0, min(4.0, math.log2(ratio))) / 4
    if level >= 0:
        return f"rgb(255,{round(255 * (1 - level))},{round(255 * (1 - level))})"
    return f"rgb({round(255 * (1 + level))},{round(255 * (1 + level))},255)"


def _cell_text(norms: dict[int, float | None], step: int) -> str:
    if step not in norms:
        return "not seen"
    return "NaN/Inf" if norms[step] is None else f"norm {norms[step]:.4g}"


def timeline(records: Iterable[Record], event: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the page draws of one rank's window (see the module docstring), or ``None`` without steps."""
    outputs: dict[str, dict[int, float | None]] = {}
    losses: dict[int, float | None] = {}
    grad_squares: dict[str, dict[int, float]] = {}
    """Per module and step: the sum of its parameters' squared gradient norms (inf: NaN/Inf in one)."""
    for r in records:
        stats = r.stats
        if not stats:
            continue
        broken = bool(stats.get("nan") or stats.get("posinf") or stats.get("neginf"))
        norm = None if broken else stats.get("norm")
        if r.op == LOSS_OP:
            losses[r.step] = None if broken else stats.get("mean")
        elif r.phase == "forward" and r.io == "output":
            outputs.setdefault(r.module, {}).setdefault(r.step, norm)  # its first output (``0``, or a dict's first key)
        elif r.io == "parameter_grad":
            squares = grad_squares.setdefault(r.module, {})
            squares[r.step] = squares.get(r.step, 0.0) + (math.inf if norm is None else norm * norm)
    steps = sorted({s for series in (*outputs.values(), *grad_squares.values()) for s in series} | set(losses))
    if not steps:
        return None
    trigger = event.get("step") if event else None
    first_module = module_of(event["slot"]) if event and event.get("slot") else None
    gradients = {module: {s: _root(v) for s, v in series.items()} for module, series in grad_squares.items()}
    totals: dict[int, float] = {}
    for series in grad_squares.values():
        for s, v in series.items():
            totals[s] = totals.get(s, 0.0) + v
    return {
        "steps": steps,
        "trigger": trigger,
        "trigger_x": _LABEL_W + steps.index(trigger) * _CELL_W if trigger in steps else None,
        "outputs": _heat_map(outputs, steps, first_module),
        "gradients": _heat_map(gradients, steps, first_module),
        "cell_w": _CELL_W,
        "cell_h": _CELL_H,
        "label_w": _LABEL_W,
        "width": _LABEL_W + len(steps) * _CELL_W,
        "lines": _lines(steps, {"loss": losses, "gradient norm": {s: _root(v) for s, v in totals.items()}}, trigger),
    }


def _root(square: float) -> float | None:
    """The norm of a sum of squared norms (``None``: NaN/Inf)."""
    return math.sqrt(square) if math.isfinite(square) else None


def _heat_map(norms: dict[str, dict[int, float | None]], steps: list[int], first_module: str | None) -> dict[str, Any] | None:
    """Rows of one heat map (see the module docstring): each module's norm per step against its median."""
    if not norms:
        return None
    rows = []
    for module, series in norms.items():
        finite = [v for v in series.values() if v is not None and v > 0]
        median = statistics.median(finite) if finite else None
        ratios = {s: (None if v is None else (v / median if median else 0.0)) for s, v in series.items()}
        spread = max((abs(math.log2(r)) if r else 0.0) if r is not None else math.inf for r in ratios.values())
        rows.append({"module": module, "ratios": ratios, "norms": series, "spread": spread, "first": module == first_module})
    rows.sort(key=lambda row: (not row["first"], -row["spread"]))
    shown = rows[:MAX_ROWS]
    return {
        "labels": [{"y": index * _CELL_H, "module": row["module"], "first": row["first"]} for index, row in enumerate(shown)],
        "cells": [
            {
                "x": _LABEL_W + column * _CELL_W,
                "y": index * _CELL_H,
                "fill": _color(row["ratios"][step]) if step in row["ratios"] else "#fff",
                "title": f"{row['module']}, step {step}: {_cell_text(row['norms'], step)}",
            }
            for index, row in enumerate(shown)
            for column, step in enumerate(steps)
        ],
        "height": len(shown) * _CELL_H,
        "more": max(0, len(rows) - MAX_ROWS),
    }


def _lines(steps: list[int], series: dict[str, dict[int, float | None]], trigger: int | None) -> dict[str, Any] | None:
    """SVG polylines of each series over the steps, log scale; NaN/Inf points drawn on the top edge."""
    values = [v for points in series.values() for v in points.values() if v is not None and v > 0]
    if not values:
        return None
    low, high = math.log10(min(values)), math.log10(max(values))
    if high - low < 1e-9:
        low, high = low - 0.5, high + 0.5
    span = max(len(steps) - 1, 1)

    def x(step: int) -> float:
        return round(_PLOT_PAD + steps.index(step) * (_PLOT_W - 2 * _PLOT_PAD) / span, 1)

    def y(value: float | None) -> float:
        if value is None:
            return _PLOT_PAD / 2
        return round(_PLOT_H - _PLOT_PAD - (math.log10(value) - low) * (_PLOT_H - 2 * _PLOT_PAD) / (high - low), 1)

    lines = [
        {"name": name, "points": " ".join(f"{x(s)},{y(v)}" for s, v in sorted(points.items()) if v is None or v > 0)}
        for name, points in series.items()
        if points
    ]
    return {
        "width": _PLOT_W,
        "height": _PLOT_H,
        "lines": lines,
        "trigger_x": x(trigger) if trigger in steps else None,
        "low": f"{10**low:.3g}",
        "high": f"{10**high:.3g}",
        "first": steps[0],
        "last": steps[-1],
    }
