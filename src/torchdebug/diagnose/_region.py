"""The smallest part of a graph that still shows a wrong node: the node alone, or a region ending at it.

A *region of depth d* ending at node ``n`` holds ``n`` and the nodes that feed it through at most
``d - 1`` edges (its ancestors up to ``d - 1`` hops away); every other value a region node reads
becomes a placeholder fed the value the failing run computed for it (:func:`region`). Depth 1 is
the node alone. The outputs are ``n``'s tensor results only, so the compiler is free to fuse the
region as it fused the program.

A node whose compiled value is wrong inside the program may be right alone: the bug needs a
neighbour (a kernel that fuses the node with the op before it, a buffer another kernel writes).
:func:`smallest_failing_region` then grows the region (depth 2, 4, 8, ... up to every ancestor),
and bisects between the last depth that passes and the first that fails, ``2 log2(depth)``
compiles at most. When no region fails, the bug needs a node that comes *after* it (a kernel that
reuses its buffer, an in-place write): the shortest failing prefix of the graph that holds the
node (every tensor it makes an output, as bisection's prefixes) is searched: prefixes ending 0, 1,
3, 7, ... nodes after it up to the whole graph, then bisection.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchdebug.diagnose._finding import NodeFinding

log = logging.getLogger("torchdebug.diagnose._region")

OPS = ("call_function", "call_method", "call_module")
"""The node kinds that compute something (Dynamo graphs hold all three, AOT graphs only the first)."""

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _constant(value: Any) -> bool:
    """Whether ``value`` can be written into a graph as a literal argument."""
    if isinstance(value, (list, tuple)):
        return all(_constant(v) for v in value)
    return isinstance(value, _CONSTANTS)


def _tensor_valued(node: torch.fx.Node) -> bool:
    value = node.meta.get("example_value", node.meta.get("val"))
    return isinstance(value, torch.Tensor)


def prefix(gm: torch.fx.GraphModule, count: int) -> torch.fx.GraphModule:
    """The placeholders and first ``count`` op nodes of ``gm``, returning every tensor they make."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    ops = 0
    for node in gm.graph.nodes:
        if node.op == "output" or (node.op in OPS and ops == count):
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
        ops += node.op in OPS
    outputs = [env[n] for n in env if n.op in OPS and _tensor_valued(n)]
    graph.output(tuple(outputs))
    return torch.fx.GraphModule(gm, graph)


def ancestors_within(node: torch.fx.Node, depth: int) -> set[torch.fx.Node]:
    """``node`` and the op nodes at most ``depth - 1`` edges upstream of it."""
    members, frontier = {node}, {node}
    for _ in range(depth - 1):
        frontier = {a for n in frontier for a in n.all_input_nodes if a.op in OPS} - members
        if not frontier:
            break
        members |= frontier
    return members


def cone_depth(node: torch.fx.Node) -> int:
    """The depth of the smallest region that holds every op node ``node`` depends on."""
    depth, frontier, seen = 1, {node}, {node}
    while True:
        frontier = {a for n in frontier for a in n.all_input_nodes if a.op in OPS} - seen
        if not frontier:
            return depth
        seen |= frontier
        depth += 1


def _results(graph: torch.fx.Graph, copied: torch.fx.Node, original: torch.fx.Node) -> None:
    """Make ``copied``'s tensor results the graph's outputs (each one of a multi-output op's)."""
    results = original.meta.get("val", original.meta.get("example_value"))
    if isinstance(results, (tuple, list)):
        outputs = []
        for index, result in enumerate(results):
            if isinstance(result, torch.Tensor):
                outputs.append(graph.call_function(operator.getitem, (copied, index)))
                outputs[-1].meta["val"] = result
        graph.output(tuple(outputs))
    else:
        graph.output((copied,))


def region(
    gm: torch.fx.GraphModule, node: torch.fx.Node, values: dict[str, Any], depth: int = 1
) -> tuple[torch.fx.GraphModule, dict[str, Any]] | None:
    """The region of ``depth`` ending at ``node`` (see the module docstring) and its inputs by
    placeholder name; ``None`` when a value it reads is neither a tensor in ``values`` nor a literal.
    A region node that reads a multi-output op (a ``getitem``) takes that op in with it."""
    members = ancestors_within(node, depth)
    for _ in range(len(gm.graph.nodes)):  # grow until every outside value can be fed in
        pulled = {
            arg
            for n in members
            for arg in n.all_input_nodes
            if arg not in members and arg.op in OPS and isinstance(values.get(arg.name), (tuple, list))
        }
        if not pulled:
            break
        members |= pulled
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    inputs: dict[str, Any] = {}
    missing: list[str] = []

    def outside(arg: torch.fx.Node) -> Any:
        if arg in env:
            return env[arg]
        value = values.get(arg.name)
        if isinstance(value, torch.Tensor):
            inputs[arg.name] = value
            env[arg] = graph.placeholder(arg.name)
            env[arg].meta.update(arg.meta)
            return env[arg]
        if arg.name not in values or not _constant(value):
            missing.append(arg.name)
        return value

    for original in gm.graph.nodes:
        if original in members:
            env[original] = graph.node_copy(original, outside)
    if missing:
        log.info("no region of depth %d at %s: no value for %s", depth, node.name, ", ".join(missing))
        return None
    _results(graph, env[node], node)
    return torch.fx.GraphModule(gm, graph), inputs


@dataclass(slots=True)
class Culprit:
    """A wrong node in the graph it came from, with every value the failing run gave that graph's nodes."""

    gm: torch.fx.GraphModule
    node: torch.fx.Node
    values: dict[str, Any]
    phase: str
    """``forward``, ``backward`` or ``inference``: how inductor compiled the graph."""


@dataclass(slots=True)
class Region:
    """A failing (or, when none fails, the last tried) graph for the repro, and how it was cut."""

    gm: torch.fx.GraphModule
    inputs: dict[str, Any]
    depth: int | None
    """The region's depth; ``None`` for the whole graph up to the node."""
    fails: bool
    result: Any = None
    """The check of that graph (a ``StageResult``)."""
    whole: bool = False
    """Whether it is the node's whole graph (``depth`` is ``None``)."""

    @property
    def nodes(self) -> int:
        return sum(n.op in OPS and n.target is not operator.getitem for n in self.gm.graph.nodes)

    def describe(self, node: str) -> str:
        """``the node alone``, ``a region of 3 nodes ending at div_33``, ``the graph up to div_33``."""
        if self.depth == 1:
            return "the node alone"
        if self.whole:
            return f"the whole graph {node} is in ({self.nodes} nodes, every value an output)"
        if self.depth is None:
            return f"the graph's first {self.nodes} nodes, {node} among them (every value an output)"
        return f"a region of {self.nodes} nodes ending at {node}"


def smallest_failing_region(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    values: dict[str, Any],
    judge: Callable[[torch.fx.GraphModule, list[Any]], Any],
    larger: Callable[[int], tuple[torch.fx.GraphModule, dict[str, Any]] | None] | None = None,
) -> Region | None:
    """The smallest region ending at ``node`` that ``judge`` fails (``judge(gm, inputs)`` returns a
    result with a ``failed`` property; see the module docstring for the search). When none fails,
    the shortest failing prefix of the graph that holds the node (``larger(count)``: its first
    ``count`` op nodes, every tensor an output); when the whole graph passes too, the node alone
    comes back with ``fails=False``. ``None`` when not even the node alone can be cut out."""
    tried: dict[int, Region] = {}

    def attempt(depth: int) -> Region | None:
        if depth not in tried:
            cut = region(gm, node, values, depth)
            if cut is None:
                return None
            result = judge(cut[0], list(cut[1].values()))
            tried[depth] = Region(cut[0], cut[1], depth, result.failed, result)
            log.info("region of depth %d at %s: %s", depth, node.name, "fails" if result.failed else "passes")
        return tried[depth]

    alone = attempt(1)
    if alone is None or alone.fails:
        return alone
    deepest, passing, failing = cone_depth(node), 1, None
    depth = 2
    while failing is None and passing < deepest:
        depth = min(depth, deepest)
        tried_region = attempt(depth)
        if tried_region is not None and tried_region.fails:
            failing = depth
        else:
            passing = depth
            depth *= 2
    if failing is None:
        return _smallest_failing_prefix(gm, node, judge, larger) or alone
    while failing - passing > 1:
        middle = (passing + failing) // 2
        tried_region = attempt(middle)
        if tried_region is not None and tried_region.fails:
            failing = middle
        else:
            passing = middle
    return tried[failing]


def _smallest_failing_prefix(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    judge: Callable[[torch.fx.GraphModule, list[Any]], Any],
    larger: Callable[[int], tuple[torch.fx.GraphModule, dict[str, Any]] | None] | None,
) -> Region | None:
    """The shortest prefix of the graph, at least up to ``node``, that fails: prefixes ending 0, 1,
    3, 7, ... nodes after ``node`` up to the whole graph until one fails, then bisection between
    the last that passed and it (a bug that needs a later kernel: a buffer it reuses, an in-place
    write). Short prefixes first: they compile fastest, and such a kernel is usually near."""
    if larger is None:
        return None
    tried: dict[int, Region | None] = {}
    total = sum(n.op in OPS for n in gm.graph.nodes)
    at = [n for n in gm.graph.nodes if n.op in OPS].index(node) + 1

    def attempt(count: int) -> Region | None:
        if count not in tried:
            cut = larger(count)
            result = judge(cut[0], list(cut[1].values())) if cut is not None else None
            tried[count] = None if cut is None or result is None else Region(cut[0], cut[1], None, result.failed, result)
            log.info("the first %d of %d nodes: %s", count, total, "fail" if tried[count] and tried[count].fails else "pass")
        found = tried[count]
        return found if found is not None and found.fails else None

    passing, failing, step = at - 1, None, 1
    while failing is None and passing < total:
        count = min(at - 1 + step, total)
        if attempt(count) is not None:
            failing = count
        else:
            passing, step = count, step * 2
    if failing is None:
        return None
    while failing - passing > 1:
        middle = (passing + failing) // 2
        if attempt(middle) is not None:
            failing = middle
        else:
            passing = middle
    found = tried[failing]
    if found is not None:
        found.whole = failing == total
    return found


def _larger(culprit: Culprit, count: int) -> tuple[torch.fx.GraphModule, dict[str, Any]] | None:
    """The first ``count`` op nodes of the culprit's graph, every tensor an output, fed the values
    its placeholders had."""
    placeholders = culprit.gm.graph.find_nodes(op="placeholder")
    if any(not isinstance(culprit.values.get(p.name), torch.Tensor) for p in placeholders):
        return None
    return prefix(culprit.gm, count), {p.name: culprit.values[p.name] for p in placeholders}


def reproduce(finding: NodeFinding, judge: Callable[[torch.fx.GraphModule, list[Any]], Any], notes: list[str]) -> None:
    """Make ``finding.subgraph`` the smallest graph around its node that ``judge`` fails
    (:func:`smallest_failing_region`), and say in ``finding.scope`` what it holds. When nothing
    smaller than the program fails, the node alone stays and a note says so."""
    culprit = finding.context
    if not isinstance(culprit, Culprit):
        return
    found = smallest_failing_region(culprit.gm, culprit.node, culprit.values, judge, lambda count: _larger(culprit, count))
    if found is None:
        notes.append(f"repro: {finding.node} could not be cut out of its graph (a value it reads was not kept)")
        return
    finding.subgraph, finding.inputs, finding.reproduced = found.gm, found.inputs, found.fails
    finding.scope = found.describe(finding.node)
    if not found.fails:
        notes.append(
            f"repro: {finding.node} is right when compiled alone, and so is every region ending at it and its whole "
            "graph: the problem needs the whole program, and repro.py (the node alone) does not show it"
        )
