"""Find the Dynamo-graph node that makes a backend fail, by bisecting over graph prefixes.

Works for any backend, opaque ones included (a backend that rewrites the Dynamo graph, one that
fails to compile or at run time): the program's Dynamo graphs are recorded with their real inputs
(:class:`DynamoRecorder`, the ladder's ``eager`` stage),
then prefix ``k`` (the first ``k`` op nodes, every tensor they produce an output, so nothing is
dead) is compiled with the backend and judged like a stage (forward and backward, against fp64).
The smallest failing prefix ends at the culprit; ``log2(nodes)`` compiles per graph. The culprit
alone, fed the values eager computed for its inputs, becomes the repro when it fails on its own;
otherwise the failing prefix does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchdebug._torch import dynamo as _dynamo
from torchdebug.diagnose._accuracy import DEFAULT_TOLERANCE
from torchdebug.diagnose._finding import NodeFinding, node_finding
from torchdebug.diagnose._program import Program, first_line
from torchdebug.diagnose._region import OPS, prefix, region
from torchdebug.diagnose._stages import Stage, StageResult, climb, references

log = logging.getLogger("torchdebug.diagnose._bisect")


@dataclass(slots=True)
class DynamoGraph:
    """A graph Dynamo handed the backend, and the values it was first called with."""

    gm: torch.fx.GraphModule
    inputs: list[Any] | None = None
    recompile_reason: str | None = None
    """Why Dynamo recompiled the frame this graph comes from (``None`` on a first compile)."""


class DynamoRecorder:
    """A ``torch.compile`` backend that runs Dynamo's graphs as they are (the ``eager`` backend) and
    keeps each one, with the values of its first call, in ``graphs`` (in the order they ran)."""

    def __init__(self) -> None:
        self.graphs: list[DynamoGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        entry = DynamoGraph(gm, recompile_reason=_dynamo.recompile_reason())
        self.graphs.append(entry)

        def run(*args: Any) -> Any:
            if entry.inputs is None:
                entry.inputs = [_leaf(a) for a in args]
            return gm.forward(*args)

        return run


def _leaf(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().clone().requires_grad_(value.requires_grad)


def op_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op in OPS]


def _values(gm: torch.fx.GraphModule, inputs: list[Any]) -> dict[str, Any]:
    """Every node's eager value (detached), by node name."""
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            values[n.name] = result.detach().clone() if isinstance(result, torch.Tensor) else result
            return result

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


class Bisector:
    """Judges graph prefixes under one stage, like the ladder judges the whole program."""

    def __init__(self, stage: Stage, train: bool, tolerance: float = DEFAULT_TOLERANCE) -> None:
        self.stage, self.train, self.tolerance, self.compiles = stage, train, tolerance, 0

    def check_graph(self, gm: torch.fx.GraphModule, inputs: list[Any], train: bool) -> StageResult:
        self.compiles += 1
        program = Program(gm, inputs, train=train)
        return climb(program, [self.stage], references(program), self.tolerance)[-1]

    def locate(self, graphs: list[DynamoGraph], label: str = "dynamo graph") -> NodeFinding | None:
        """The first node, in the first graph that fails, whose prefix fails."""
        for index, graph in enumerate(graphs):
            nodes = op_nodes(graph.gm)
            if graph.inputs is None or not nodes:
                continue
            # forward only first: cheaper to compile, and enough for most failures
            for train in dict.fromkeys((False, self.train)):
                if self.check_graph(prefix(graph.gm, len(nodes)), graph.inputs, train).failed:
                    low, high = 1, len(nodes)
                    while low < high:
                        middle = (low + high) // 2
                        if self.check_graph(prefix(graph.gm, middle), graph.inputs, train).failed:
                            high = middle
                        else:
                            low = middle + 1
                    return self._finding(graph, nodes[low - 1], low, f"{label} {index}", train)
        return None

    def _finding(self, graph: DynamoGraph, node: torch.fx.Node, count: int, name: str, train: bool) -> NodeFinding:
        assert graph.inputs is not None
        values = _values(graph.gm, graph.inputs)
        cut = region(graph.gm, node, values)
        result = self.check_graph(cut[0], list(cut[1].values()), train) if cut is not None else None
        scope = "the node alone"
        if cut is not None and result is not None and result.failed:
            alone, inputs = cut
        else:  # the node needs its context: the repro keeps the prefix
            placeholders = graph.gm.graph.find_nodes(op="placeholder")
            alone, inputs = prefix(graph.gm, count), {p.name: v for p, v in zip(placeholders, graph.inputs)}
            result = self.check_graph(alone, list(inputs.values()), train)
            scope = f"the failing prefix of {name} (its first {count} nodes)"
        if result.run.error is not None:
            detail = f"{type(result.run.error).__name__}: {first_line(result.run.error)}"
            failed = None
        else:
            failed = next((c for c in result.checks if not c.passed), None)
            detail = f"{failed.name} {failed.describe()}" if failed else "fails only inside the whole graph"
        phase = "backward" if failed is not None and failed.name.startswith("grad.") else "forward"
        return node_finding(
            node,
            name,
            "forward",
            detail,
            phase,
            check=failed,
            inputs=inputs,
            subgraph=alone,
            train=train,
            scope=scope,
            reproduced=result.failed,
        )
