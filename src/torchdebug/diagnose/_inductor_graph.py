"""Compile a graph inductor received (or a piece of one) as inductor compiled it, and judge one node.

Node by node names a node of an AOT graph: forward, backward or inference, as AOT autograd handed
it to inductor. Giving a piece of that graph to ``torch.compile`` would trace it again through
Dynamo and AOT autograd (functionalisation, decompositions, a forward/backward split), which can
change it enough to hide the bug (a backward graph's scatter into a zero buffer, say). PyTorch's
after-AOT minifier instead retraces the graph with ``make_fx`` (the same ATen ops) and calls
inductor's ``compile_fx_inner`` on it, flagged backward or inference as the original was; so do
:func:`judge` and the repro (:mod:`~torchdebug.diagnose._repro`).

Only the named node's results are judged (:func:`~torchdebug.diagnose._accuracy.check`: compiled
against the graph interpreted in float64, eager's error as the budget); the float64 side widens
dtype arguments too (``full(..., dtype=torch.float32)``), as node by node does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from torchdebug._torch.inductor import compile_fx_inner
from torchdebug.diagnose._accuracy import DEFAULT_TOLERANCE, check
from torchdebug.diagnose._nodes import tree_map, upcast
from torchdebug.diagnose._program import first_line


@dataclass(slots=True)
class Verdict:
    """Whether the compiled graph gets the node wrong (or raises), and how."""

    failed: bool
    detail: str = ""


class _Widened(torch.fx.Interpreter):
    """Interprets a graph with every floating tensor and dtype argument widened to float64."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return target(*tree_map(upcast, args), **tree_map(upcast, kwargs))


def compile_like_inductor(gm: torch.fx.GraphModule, inputs: list[Any], phase: str) -> Callable[..., list[Any]]:
    """``gm`` retraced with ``make_fx`` and compiled by ``compile_fx_inner`` as a ``phase`` graph
    (``forward``, ``backward`` or ``inference``); call it with the inputs as arguments."""
    traced = make_fx(gm)(*inputs)
    compiled = compile_fx_inner(traced, list(inputs), is_backward=phase == "backward", is_inference=phase == "inference")
    return lambda *args: list(compiled(list(args)))


def judged_outputs(gm: torch.fx.GraphModule, node: str) -> list[int]:
    """The indices of ``gm``'s outputs that are ``node``'s results (its own, or a ``getitem`` of it)."""
    outputs = gm.graph.find_nodes(op="output")[0].args[0]
    return [
        index
        for index, out in enumerate(outputs)
        if isinstance(out, torch.fx.Node)
        and (out.name == node or (out.target is operator.getitem and getattr(out.args[0], "name", None) == node))
    ]


def _clones(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def judge(gm: torch.fx.GraphModule, inputs: list[Any], node: str, phase: str, tolerance: float = DEFAULT_TOLERANCE) -> Verdict:
    """Compile ``gm`` as inductor compiled the ``phase`` graph it was cut from, run it on ``inputs``
    and judge ``node``'s results against float64."""
    with torch.no_grad():
        eager = list(gm(*_clones(inputs)))
        wide = list(_Widened(gm).run(*[upcast(x) for x in inputs]))
        try:
            got = compile_like_inductor(gm, _clones(inputs), phase)(*_clones(inputs))
        except Exception as error:  # noqa: BLE001 - an error of the compiled graph is a finding
            return Verdict(True, f"{type(error).__name__}: {first_line(error)}")
    for index in judged_outputs(gm, node):
        verdict = check(node, wide[index], eager[index], got[index], tolerance)
        if not verdict.passed:
            return Verdict(True, verdict.describe())
    return Verdict(False)
