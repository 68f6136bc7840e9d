"""Statistics as FX nodes: ``torchdebug.stats.stats_vector`` traced once per dtype and device, then
inlined after each dumped value, so inductor fuses the reductions into kernels of the graph.

The trace uses inductor's decompositions (the graph after our pass is lowered as is) and contains
only whole-tensor reductions, so one trace serves every shape. After inlining, the new nodes get
``meta["val"]`` from the graph's own fake mode (:func:`propagate_fake_values`): later inductor passes
and lowering read it.
"""

from __future__ import annotations

import functools

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from torchdebug.compile._dynamo_hooks import detect_fake_mode, unset_fake_temporarily
from torchdebug.compile._inductor_hooks import select_decomp_table
from torchdebug.stats import stats_vector

aten = torch.ops.aten

SAME_ELEMENTS = frozenset(
    {aten.view, aten.reshape, aten._unsafe_view, aten.permute, aten.t, aten.transpose, aten.squeeze,
     aten.unsqueeze, aten.alias, aten.clone, aten.detach}
)  # fmt: skip
"""Ops whose output holds exactly the elements of their first input: the statistics are reused."""


@functools.cache
def _template(dtype: torch.dtype, device: torch.device) -> tuple[torch.fx.GraphModule, dict[str, float]]:
    """The traced statistics graph and the values of its 0-d constants (the NaN meaning "no value")."""
    with unset_fake_temporarily():  # traced outside the compile's fake mode, constants are real
        example = torch.zeros(2, 2, dtype=dtype, device=device)
        gm = make_fx(stats_vector, decomposition_table=select_decomp_table(), tracing_mode="fake")(example)
        constants = {str(n.target): getattr(gm, str(n.target)).item() for n in gm.graph.find_nodes(op="get_attr")}
    return gm, constants


def insert_stats(graph: torch.fx.Graph, value: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """Insert the statistics of ``value`` (a 7-vector, float64) before ``before``; return its node."""
    fake = value.meta["val"]
    template, constants = _template(fake.dtype, fake.device)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    with graph.inserting_before(before):
        for node in template.graph.nodes:
            if node.op == "placeholder":
                env[node] = value
            elif node.op == "get_attr":  # 0-d constants (the NaN that means "no value")
                env[node] = graph.call_function(
                    aten.full.default, ([], constants[str(node.target)]), {"dtype": torch.float64, "device": fake.device}
                )
            elif node.op == "output":
                return env[node.args[0]]
            else:
                env[node] = graph.node_copy(node, lambda n: env[n])
    raise AssertionError("a traced graph always ends in an output node")


def propagate_fake_values(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Set ``meta["val"]`` of ``nodes`` (new, in graph order) by running them on fake values."""
    placeholders = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode(placeholders)
    if fake_mode is None:
        return
    with fake_mode:
        for node in nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
            node.meta["val"] = node.target(*args, **kwargs)  # type: ignore[operator]
