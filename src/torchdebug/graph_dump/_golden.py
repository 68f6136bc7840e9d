"""``dump_stage="original"``: the values of a graph as plain eager ATen calls compute them.

The compile pass keeps a copy of the graph as it was before the backend's passes and makes the
compiled graph hand over its inputs when it starts; :func:`interpret` then runs that copy with
``torch.fx.Interpreter`` on those inputs and keeps the values of the nodes the plan dumps. Compared
with a ``dump_stage="optimized"`` dump of the same step, it separates errors of inductor's code
generation (values differ) from errors already in the graph (values agree).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from torchdebug.graph_dump._plan import GraphPlan


class _Keeper(torch.fx.Interpreter):
    """Runs a graph, keeping the values of the named nodes."""

    def __init__(self, gm: torch.fx.GraphModule, wanted: set[str]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.wanted = wanted
        self.kept: dict[str, Any] = {}

    def run_node(self, node: torch.fx.Node) -> Any:
        value = super().run_node(node)
        if node.name in self.wanted:
            self.kept[node.name] = value.detach().clone() if isinstance(value, torch.Tensor) else value
        return value


def interpret(plan: GraphPlan, tensors: list[torch.Tensor], sizes: list[int] = ()) -> dict[str, Any]:
    """Values of the nodes feeding the plan's slots, computed by interpreting ``plan.golden`` on the
    graph's inputs: its tensors (a copy of those it writes in place: the compiled graph runs next
    on the same inputs) and, compiled with dynamic shapes, the values of its symbolic-int inputs
    (in the order of ``plan.golden_inputs``)."""
    assert plan.golden is not None, "interpret() needs a plan made with dump_stage='original'"
    wanted = {slot.source_node for call in plan.calls for slot in call.slots if slot.source_node}
    keeper = _Keeper(plan.golden, wanted)
    inputs: list[Any] = list(tensors)
    if plan.golden_inputs:
        handed = iter(tensors)
        given = {"tensor": handed, "written": handed, "size": iter(sizes)}
        inputs = [next(given[kind], None) if kind in given else None for kind in plan.golden_inputs]
        inputs = [value.clone() if kind == "written" else value for kind, value in zip(plan.golden_inputs, inputs)]
    with torch.no_grad():
        keeper.run(*inputs)
    return keeper.kept
