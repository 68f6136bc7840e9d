"""Node by node: the compiled value of every node against an fp64 recomputation of the same node.

For each AOT graph in execution order (forward graphs, then backward graphs), the graph inductor
received is interpreted twice from the compiled values of its inputs: once in float64 (floating
tensors and float dtype arguments upcast) and once in the program's dtypes, as eager would run it.
Each node the compiled code materialised is judged with :func:`torchdebug.diagnose.accuracy.check`
(compiled against fp64, eager's error as the budget); the first node that fails is the culprit.
Random nodes take the compiled value on both sides (a recomputation would draw other numbers).

Because the reference is the graph *before* inductor's post-grad passes, a wrong rewrite by a pass
is caught at the first node whose value it changed, as is a wrong kernel.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from torchdebug.diagnose.accuracy import DEFAULT_TOLERANCE, check
from torchdebug.diagnose.bisect import single_node
from torchdebug.diagnose.finding import NodeFinding, node_finding
from torchdebug.diagnose.instrument import AotGraph

log = logging.getLogger("torchdebug.diagnose.nodes")

_LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)
_RANDOM_PRIMS = {"inductor_random", "inductor_seeds", "inductor_seed", "inductor_lookup_seed"}


def _is_random(node: torch.fx.Node) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    name = getattr(getattr(target, "_overloadpacket", None), "__name__", "")
    return torch.Tag.nondeterministic_seeded in tags or name in _RANDOM_PRIMS


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOW_PRECISION:
        return value.detach().to(torch.float64)
    if isinstance(value, torch.dtype) and value in _LOW_PRECISION:
        return torch.float64
    return value


def _tree_map(fn: Any, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: _tree_map(fn, v) for k, v in value.items()}
    return fn(value)


def execution_order(graphs: list[AotGraph]) -> list[AotGraph]:
    """Forward and inference graphs in compile order, then backward graphs in compile order
    (a backward graph compiles when it first runs, so compile order is run order)."""
    return [g for g in graphs if g.phase != "backward"] + [g for g in graphs if g.phase == "backward"]


def first_bad_node(graphs: list[AotGraph], tol: float = DEFAULT_TOLERANCE) -> NodeFinding | None:
    """The first node, over ``graphs`` in execution order, whose compiled value fails the check."""
    for entry in execution_order(graphs):
        if entry.values is None:
            log.warning("%s never ran, so its nodes were not checked", entry.label)
            continue
        found = _first_in_graph(entry, tol)
        if found is not None:
            return found
    return None


def _first_in_graph(entry: AotGraph, tol: float) -> NodeFinding | None:
    compiled = entry.values or {}
    wide: dict[torch.fx.Node, Any] = {}
    eager: dict[torch.fx.Node, Any] = {}
    gm = entry.original
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        if node.op == "placeholder" or (node.op == "call_function" and _is_random(node)):
            if node.name not in compiled:
                if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
                    log.warning("%s: input %s was not materialised; its nodes are not checked", entry.label, node.name)
                    return None
                continue
            value = compiled[node.name].clone()
        elif node.op == "get_attr":
            value = getattr(gm, str(node.target))
        else:
            value = None
        if value is not None:
            wide[node], eager[node] = _upcast(value), value
            continue
        if node.op != "call_function":
            continue
        args64 = _tree_map(_upcast, torch.fx.node.map_arg((node.args, node.kwargs), wide.__getitem__))
        args = torch.fx.node.map_arg((node.args, node.kwargs), eager.__getitem__)
        wide[node] = node.target(*args64[0], **args64[1])  # type: ignore[operator]
        eager[node] = node.target(*args[0], **args[1])  # type: ignore[operator]
        result = compiled.get(node.name)
        if not isinstance(result, torch.Tensor) or not isinstance(wide[node], torch.Tensor):
            continue
        verdict = check(node.name, wide[node], eager[node], result, tol)
        if not verdict.passed:
            return _finding(entry, node, verdict, {n.name: v for n, v in eager.items()})
    return None


def _finding(entry: AotGraph, node: torch.fx.Node, verdict: Any, values: dict[str, Any]) -> NodeFinding:
    inputs = {**values, **(entry.values or {})}  # the compiled value of each input where there is one
    alone, alone_inputs = single_node(entry.original, node, inputs)
    return node_finding(
        node,
        entry.label,
        entry.phase,
        f"output {verdict.describe()}",
        check=verdict,
        inputs=alone_inputs,
        subgraph=alone,
        train=False,  # the node alone, forward: a backward node is an ordinary op of the backward graph
    )
