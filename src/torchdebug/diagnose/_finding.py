"""A localised culprit: the FX node where a stage first goes wrong, and where it came from in user code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from torchdebug.compile import graph_render
from torchdebug.diagnose._accuracy import Check
from torchdebug.graph_dump import graph_is_rooted, is_backward_node, module_of


@dataclass(slots=True)
class NodeFinding:
    """The first node of a graph that raises or loses accuracy."""

    graph: str
    """Which graph: ``dynamo graph 0`` or ``model__0 forward`` / ``model__0 backward``."""
    node: str
    target: str
    phase: str
    """``forward`` or ``backward``."""
    module: str
    """Eager module path (``layers.0.mlp.fc``), ``<root>`` or ``-``."""
    source: str | None
    """``file:line in function`` of the user code the node was traced from."""
    code: str | None
    detail: str
    """The error message, or how far the value is from fp64 and what eager allowed."""
    check: Check | None = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    """The node's input values as the failing stage computed them (for the repro)."""
    subgraph: torch.fx.GraphModule | None = field(default=None, repr=False)
    """The graph the repro runs: the node alone, or the failing prefix when the node alone passes."""
    train: bool = True
    """Whether the repro needs the backward pass to show the problem."""
    scope: str = "the node alone"
    """What ``subgraph`` holds: ``the node alone``, ``a region of 3 nodes ending at div_33``, ..."""
    reproduced: bool | None = None
    """Whether ``subgraph`` alone, compiled with the failing stage, shows the problem (``None``: not tried)."""
    compile_as: str | None = None
    """How the repro compiles ``subgraph``: ``None`` with ``torch.compile`` and the failing backend; a
    phase (``forward``, ``backward``, ``inference``) with inductor's ``compile_fx_inner``, as inductor
    compiled the AOT graph the node is in (:mod:`~torchdebug.diagnose._inductor_graph`)."""
    context: Any = field(default=None, repr=False)
    """Where the node sits, for cutting a larger region around it: a :class:`~torchdebug.diagnose._region.Culprit`."""

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"{self.phase} node {self.node} ({self.target}) in module {self.module}{where}: {self.detail}"


def node_finding(
    node: torch.fx.Node, graph: str, graph_phase: str, detail: str, phase: str | None = None, **extra: Any
) -> NodeFinding:
    """Describe ``node`` with its module path and source line from ``node.meta``; ``phase`` overrides
    the node's own (a Dynamo-graph node whose gradient is wrong)."""
    backward = is_backward_node(node, graph_phase)
    rooted = graph_is_rooted(node.graph)
    where = graph_render.source_location(node)
    return NodeFinding(
        graph=graph,
        node=node.name,
        target=graph_render.target_name(node),
        phase=phase or ("backward" if backward else "forward"),
        module=module_of(node, backward, rooted),
        source=f"{where['file']}:{where['line']} in {where['function']}" if where else None,
        code=where["code"] if where else None,
        detail=detail,
        **extra,
    )
