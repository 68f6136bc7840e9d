"""The overflow scene: keep only the calls whose outputs hold NaN or Inf, and name the first one.

Statistics rows (``torchdebug.stats`` order: min, max, mean, norm, nan, posinf, neginf) of every
output are computed inside the compiled graph; a call overflows when any output row counts a NaN or
an Inf. Graph order is a valid execution order and a NaN flows only downstream, so the first
overflowing call of the first graph that ran in a step is where the step's non-finite values begin,
forward or backward (``torch.autograd.detect_anomaly`` under compile only names
``CompiledFunctionBackward``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from torchdebug.capture.graph_plan import GraphPlan

log = logging.getLogger("torchdebug.capture.overflow")

_NONFINITE = slice(4, 7)


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


def overflowing_calls(plan: GraphPlan, rows: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the plan's calls with a NaN or Inf in an output, in graph order."""
    found = []
    for index, call in enumerate(plan.calls):
        for slot in call.slots:
            if slot.io == "output" and slot.stat is not None and any(rows[slot.stat][_NONFINITE]):
                found.append(index)
                break
    return found


def nonfinite_counts(plan: GraphPlan, index: int, rows: Sequence[Sequence[float]]) -> tuple[int, int]:
    """``(NaN count, Inf count)`` over the outputs of one call."""
    nan = inf = 0
    for slot in plan.calls[index].slots:
        if slot.io == "output" and slot.stat is not None:
            row = rows[slot.stat]
            nan += int(row[4])
            inf += int(row[5]) + int(row[6])
    return nan, inf


def report(overflow: Overflow) -> None:
    log.warning("first NaN/Inf of %s", overflow)
