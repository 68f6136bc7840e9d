"""The overflow scene: keep only the calls whose outputs hold NaN or Inf, and name the first one.

The statistics of every output are taken as the compiled graph runs (inside it, or by the host as
soon as the value exists); a call overflows when any output's statistics count a NaN or an Inf.
Graph order is a valid execution order and a NaN flows only downstream, so the first
overflowing call of the first graph that ran in a step is where the step's non-finite values begin,
forward or backward (``torch.autograd.detect_anomaly`` under compile only names
``CompiledFunctionBackward``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchdebug.capture.graph_plan import GraphPlan

log = logging.getLogger("torchdebug.capture.overflow")

Rows = Sequence[dict[str, Any] | None]
"""Statistics dicts (``torchdebug.stats`` keys) by statistics row."""


@dataclass(frozen=True, slots=True)
class Overflow:
    """The first call of a step whose outputs hold NaN or Inf."""

    step: int
    name: str
    """Call name, ``backward/<root>/aten.mul.Tensor#3``."""
    node: str
    graph: str
    source: str | None
    nan: int
    inf: int

    def __str__(self) -> str:
        where = self.source or "no source line"
        return f"step {self.step}: {self.name} (node {self.node} in {self.graph}) at {where}: {self.nan} NaN, {self.inf} Inf"


def _nonfinite(stats: dict[str, Any] | None) -> tuple[int, int]:
    if stats is None:
        return 0, 0
    return stats["nan"], stats["posinf"] + stats["neginf"]


def overflowing_calls(plan: GraphPlan, rows: Rows) -> list[int]:
    """Indices of the plan's calls with a NaN or Inf in an output, in graph order."""
    found = []
    for index, call in enumerate(plan.calls):
        for slot in call.slots:
            if slot.io == "output" and slot.stat is not None and any(_nonfinite(rows[slot.stat])):
                found.append(index)
                break
    return found


def nonfinite_counts(plan: GraphPlan, index: int, rows: Rows) -> tuple[int, int]:
    """``(NaN count, Inf count)`` over the outputs of one call."""
    nan = inf = 0
    for slot in plan.calls[index].slots:
        if slot.io == "output" and slot.stat is not None:
            row_nan, row_inf = _nonfinite(rows[slot.stat])
            nan += row_nan
            inf += row_inf
    return nan, inf


def report(overflow: Overflow) -> None:
    log.warning("first NaN/Inf of %s", overflow)
