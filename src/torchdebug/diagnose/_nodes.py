"""Node by node: the compiled value of every node against an fp64 recomputation of the same node.

For each AOT graph in execution order, the graph inductor received (before its post-grad passes, so a
wrong rewrite is caught as a wrong kernel is) is interpreted from the compiled values of its inputs in
float64 and in the program's dtypes; each node the compiled code materialised is judged with
:func:`torchdebug.diagnose._accuracy.check`, and the first that fails is the culprit. Nodes that
cannot be recomputed (random ops, ops that raise, values not kept) take their compiled value on both
sides, unjudged. The method and its limits: docs/diagnose.md, "How it works".
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.fx

from torchdebug._torch.dispatch import OpOverload
from torchdebug.diagnose import _attention as attention
from torchdebug.diagnose._accuracy import DEFAULT_TOLERANCE, Check, check
from torchdebug.diagnose._finding import NodeFinding, node_finding
from torchdebug.diagnose._instrument import AotGraph
from torchdebug.diagnose._program import first_line
from torchdebug.diagnose._region import Culprit, region
from torchdebug.records import allocates

log = logging.getLogger("torchdebug.diagnose._nodes")

_WIDER = {torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64}
_WIDER_COMPLEX = {torch.complex64: torch.complex128, torch.complex32: torch.complex128}
_RANDOM_PRIMS = {"inductor_random", "inductor_seeds", "inductor_seed", "inductor_lookup_seed"}


def _is_random(node: torch.fx.Node) -> bool:
    name = attention.op_name(node.target)
    return name in _RANDOM_PRIMS or attention.is_random(node.target, node.args, dict(node.kwargs))


def upcast(value: Any) -> Any:
    """A floating tensor or dtype widened to float64 (complex to complex128); anything else as it is."""
    if isinstance(value, torch.Tensor) and (value.dtype in _WIDER or value.dtype in _WIDER_COMPLEX):
        return value.detach().to(_WIDER.get(value.dtype) or _WIDER_COMPLEX[value.dtype])
    if isinstance(value, torch.dtype):
        return _WIDER.get(value) or _WIDER_COMPLEX.get(value) or value
    return value


def tree_map(fn: Any, value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(tree_map(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: tree_map(fn, v) for k, v in value.items()}
    return fn(value)


def execution_order(graphs: list[AotGraph]) -> list[AotGraph]:
    """Forward and inference graphs in compile order, then backward graphs in compile order
    (a backward graph compiles when it first runs, so compile order is run order)."""
    return [g for g in graphs if g.phase != "backward"] + [g for g in graphs if g.phase == "backward"]


@dataclass(slots=True)
class Unjudged:
    """Nodes the comparison could not judge, by reason, for the report's notes."""

    random: list[str] = field(default_factory=list)
    """Random nodes: their compiled values feed both sides."""
    failed: dict[str, str] = field(default_factory=dict)
    """Node -> why it could not be recomputed (its compiled value fed both sides)."""
    unknown: list[str] = field(default_factory=list)
    """Nodes with neither a recomputation nor a compiled value."""
    downstream: int = 0
    """Nodes computed from an unknown node, which took their compiled values unjudged."""
    unread: list[str] = field(default_factory=list)
    """Graphs that never ran, so none of their nodes was judged."""

    def notes(self) -> list[str]:
        """One line per reason, naming a few nodes."""
        lines = []
        if self.random:
            lines.append(
                f"node by node, {_few(self.random)} draw random numbers: the compiled values are used on both sides, "
                "so they are not judged themselves (the nodes after them are)"
            )
        if self.failed:
            shown = "; ".join(f"{name}: {why}" for name, why in list(self.failed.items())[:3])
            lines.append(f"node by node, {len(self.failed)} node(s) could not be recomputed and were not judged ({shown})")
        if self.unknown:
            lines.append(
                f"node by node, {_few(self.unknown)} could neither be recomputed nor read from the compiled code; "
                f"{self.downstream} node(s) computed from them were not judged"
            )
        if self.unread:
            lines.append(f"node by node, {_few(self.unread)} never ran, so their nodes were not judged")
        return lines


def _few(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    return ", ".join(unique[:4]) + (f" and {len(unique) - 4} more" if len(unique) > 4 else "")


def first_bad_node(
    graphs: list[AotGraph], tolerance: float = DEFAULT_TOLERANCE, notes: list[str] | None = None
) -> NodeFinding | None:
    """The first node, over ``graphs`` in execution order, whose compiled value fails the check.
    What could not be judged, and why, is appended to ``notes``."""
    unjudged = Unjudged()
    found = None
    for entry in execution_order(graphs):
        if entry.values is None:
            log.warning("%s never ran, so its nodes were not checked", entry.label)
            unjudged.unread.append(entry.label)
            continue
        found = _GraphCheck(entry, tolerance, unjudged).first_bad()
        if found is not None:
            break
    if notes is not None:
        notes.extend(unjudged.notes())
    return found


_MISSING = object()


class _GraphCheck:
    """One AOT graph interpreted in float64 (``wide``) and in the program's dtypes (``eager``)."""

    def __init__(self, entry: AotGraph, tolerance: float, unjudged: Unjudged) -> None:
        self.entry, self.tolerance, self.unjudged = entry, tolerance, unjudged
        self.compiled = entry.values or {}
        self.wide: dict[torch.fx.Node, Any] = {}
        self.eager: dict[torch.fx.Node, Any] = {}
        self.unknown: set[torch.fx.Node] = set()
        self.unchecked: dict[torch.fx.Node, set[int]] = {}
        """Multi-output node -> the indices of its results that are not compared (SDPA bookkeeping)."""

    def first_bad(self) -> NodeFinding | None:
        gm = self.entry.original
        for node in gm.graph.nodes:
            if node.op == "output":
                break
            if node.op == "get_attr":
                self._set(node, getattr(gm, str(node.target)))
            elif node.op == "placeholder":
                self._take(node, "unknown")
            elif node.op == "call_function":
                verdict = self._call(node)
                if verdict is not None:
                    return self._finding(node, verdict)
        return None

    def _set(self, node: torch.fx.Node, value: Any, wide: Any = _MISSING) -> None:
        self.eager[node] = value
        self.wide[node] = tree_map(upcast, value) if wide is _MISSING else wide

    def _compiled_value(self, node: torch.fx.Node) -> Any:
        """The compiled value of ``node``: its own tensor, or for a multi-output node the tuple of
        what its ``getitem`` readers got (``None`` where no reader was kept); else ``None``."""
        value = self.compiled.get(node.name)
        if isinstance(value, torch.Tensor):
            return value.clone()
        meta = node.meta.get("val")
        if not isinstance(meta, (tuple, list)):
            return None
        parts: list[Any] = [None] * len(meta)
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int) and user.name in self.compiled:
                parts[user.args[1]] = self.compiled[user.name].clone()
        return tuple(parts) if any(p is not None for p in parts) else None

    def _take(self, node: torch.fx.Node, reason: str, why: str = "") -> None:
        """Use the compiled value of ``node`` on both sides, unjudged; else mark it unknown."""
        value = self._compiled_value(node)
        downstream = any(arg in self.unknown for arg in node.all_input_nodes)
        if value is None:
            self.unknown.add(node)
            if not downstream:
                self.unjudged.unknown.append(f"{self.entry.label}:{node.name}")
            return
        self._set(node, value)
        if downstream:
            self.unjudged.downstream += 1
        elif reason == "random":
            self.unjudged.random.append(f"{node.name} ({node.target})")
        elif reason == "failed":
            self.unjudged.failed[f"{self.entry.label}:{node.name}"] = why

    def _call(self, node: torch.fx.Node) -> Check | None:
        """Recompute ``node`` on both sides (or take its compiled value); its verdict when it fails."""
        if any(arg in self.unknown for arg in node.all_input_nodes):
            self._take(node, "unknown")
            return None
        if _is_random(node):
            self._take(node, "random")
            return None
        op = cast("Callable[..., Any]", node.target)  # a call_function node's target: its op
        try:
            eager_args, eager_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), self.eager.__getitem__)
            wide_args, wide_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), self.wide.__getitem__)
            wide_args, wide_kwargs = tree_map(upcast, wide_args), tree_map(upcast, wide_kwargs)
            eager = op(*eager_args, **eager_kwargs)
            if isinstance(op, OpOverload) and attention.is_attention(op):  # is_attention holds of OpOverloads only
                wide, compared = attention.reference(op, wide_args, wide_kwargs, eager)
                self.unchecked[node] = set(range(len(wide))) - compared
            else:
                wide = op(*wide_args, **wide_kwargs)
        except Exception as error:  # noqa: BLE001 - an op that cannot be recomputed is reported, not raised
            self._take(node, "failed", f"{type(error).__name__}: {first_line(error)}")
            return None
        if isinstance(node.meta.get("val"), torch.Tensor) and not isinstance(eager, torch.Tensor):
            self._take(node, "unknown")  # a getitem of a value the compiled code kept only in part
            return None
        self._set(node, eager, wide)
        result = self.compiled.get(node.name)
        if not isinstance(result, torch.Tensor) or not isinstance(wide, torch.Tensor) or self._bookkeeping(node):
            return None
        if allocates(attention.op_name(node.target)):
            # An uninitialised allocation (empty_like, ...): recomputed, since the next op reads the
            # buffer, but never judged: its values are whatever the memory held.
            return None
        verdict = check(node.name, wide, eager, result, self.tolerance)
        return None if verdict.passed else verdict

    def _bookkeeping(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` reads a result of a multi-output op that is not compared."""
        if node.target is not operator.getitem or not isinstance(node.args[0], torch.fx.Node):
            return False
        return node.args[1] in self.unchecked.get(node.args[0], ())

    def _finding(self, node: torch.fx.Node, verdict: Check) -> NodeFinding:
        """The finding for a failing node; a failing ``getitem`` names the multi-output op it reads."""
        detail = f"output {verdict.describe()}"
        source = node.args[0] if node.target is operator.getitem else None
        if isinstance(source, torch.fx.Node) and source.op == "call_function":
            detail = f"output {node.args[1]} ({node.name}) {verdict.describe()}"
            node = source
        values = {n.name: v for n, v in self.eager.items()}
        inputs = {**values, **self.compiled}  # the compiled value of each input where there is one
        alone, alone_inputs = region(self.entry.original, node, inputs) or (None, {})
        return node_finding(
            node,
            self.entry.label,
            self.entry.phase,
            detail,
            check=verdict,
            inputs=alone_inputs,
            subgraph=alone,
            train=False,  # the node alone, forward: a backward node is an ordinary op of the backward graph
            context=Culprit(self.entry.original, node, inputs, self.entry.phase),
            compile_as=self.entry.phase,
        )
