"""The overflow scene: keep only the calls that make a NaN or an Inf, and name the first one.

The statistics of every input and output are taken as the compiled graph runs (inside it, or by the
host as soon as the value exists), and each call is judged by :mod:`torchdebug.nonfinite` in graph
order: an *origin* makes a NaN/Inf from inputs that did not hold it, an *entry* passes on a NaN that
no call of the step made (the graph's inputs held it); a ``-inf`` attention mask, and every call
that writes or passes on an infinity it was given, is neither. Graph order is a valid execution
order and a NaN flows only downstream, so the first origin of the first graph that ran in a step is
where the step's non-finite values begin, forward or backward (``torch.autograd.detect_anomaly``
under compile only names ``CompiledFunctionBackward``). The scene file asks for it with
``"dump_debug": "on"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchdebug.graph_dump._plan import GraphPlan, Rows
from torchdebug.graph_dump.scenes._base import GraphWriter, Scene
from torchdebug.nonfinite import ENTRY, ORIGIN, OriginTracker, tensor_flags, value_flags

if TYPE_CHECKING:
    import torch
    import torch.fx

    from torchdebug.graph_dump._run import GraphRun

log = logging.getLogger("torchdebug.graph_dump.scenes._overflow")


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


def origins(plan: GraphPlan, rows: Rows, tracker: OriginTracker) -> list[int]:
    """Indices of the plan's calls that are origins or entries of NaN/Inf, in graph order;
    ``tracker`` carries the step's state across its graphs."""
    found = []
    for index, call in enumerate(plan.calls):
        inputs = outputs = 0
        for slot in call.slots:
            if slot.kind == "value":
                inputs |= value_flags(slot.value) if slot.io == "input" else 0
            elif slot.stat is not None:
                flags = tensor_flags(rows[slot.stat], slot.meta["dtype"] if slot.meta else None)
                if slot.io == "output":
                    outputs |= flags
                else:
                    inputs |= flags
        if tracker.judge(inputs, outputs) in (ORIGIN, ENTRY):
            found.append(index)
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


def log_overflow(overflow: Overflow) -> None:
    log.warning("first NaN/Inf of %s", overflow)


class OverflowScene(Scene):
    """Every node's statistics; records only for the calls that make a NaN/Inf, chosen once a
    run's statistics arrived; the first of each step in :attr:`findings` and the log."""

    name = "overflow"

    def __init__(self) -> None:
        self._found: list[Overflow] = []
        self._origins, self._origin_step = OriginTracker(), 0

    @property
    def findings(self) -> list[Overflow]:
        return self._found

    @classmethod
    def from_file(cls, dump: Mapping[str, Any]) -> OverflowScene:
        return cls()

    def selector(self, graph: torch.fx.Graph, model: str, nodes: frozenset[str]) -> Callable[[torch.fx.Node], bool]:
        return lambda node: True

    def on_graph(self, capture: GraphWriter, run: GraphRun, stats: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        if run.plan.golden is not None:  # the interpreter's values are not judged: every call is written
            capture.write(run, range(len(run.plan.calls)), capture.stage_rows(run, stats, None), tensors)
            return
        capture.stage_rows(run, stats, lambda rows: self._record(capture, run, rows))

    def _record(self, capture: GraphWriter, run: GraphRun, rows: Rows) -> None:
        """Once a run's statistics arrived (in run order): record the calls that make a NaN/Inf."""
        if self._origin_step != run.step:
            self._origins, self._origin_step = OriginTracker(), run.step
        calls = origins(run.plan, rows, self._origins)
        if calls and not (self.findings and self.findings[-1].step == run.step):
            self._note(capture, run, calls[0], rows)
        capture.write(run, calls, rows, [])

    def _note(self, capture: GraphWriter, run: GraphRun, index: int, rows: Rows) -> None:
        call = run.plan.calls[index]
        nan, inf = nonfinite_counts(run.plan, index, rows)
        found = Overflow(
            step=run.step,
            name=capture.call_name(run, call),
            node=call.node,
            graph=f"{run.plan.model}/{run.plan.phase}",
            source=call.source.source if call.source else None,
            nan=nan,
            inf=inf,
        )
        self._found.append(found)
        log_overflow(found)
