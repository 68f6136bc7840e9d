"""Statistics as FX nodes, inserted after each dumped value so inductor fuses them into one loop.

For each dumped value the graph computes only the accumulators of the statistics schema
(``torchdebug.graph_dump._plan.ACCUMULATORS``), each a 0-d tensor that inductor reads the value once
for, in the loop that computes it; mean, norm and "no value" are worked out on the host
(``stats_from_sums``). Which values and why: docs/architecture.md, "The graph dump"; each
accumulator's form: :func:`_floating`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from torchdebug._torch.dynamo import detect_fake_mode
from torchdebug.graph_dump._plan import ACCUMULATORS
from torchdebug.stats import COUNTS

aten = torch.ops.aten

SAME_ELEMENTS = frozenset(
    {
        aten.view,
        aten.reshape,
        aten._unsafe_view,
        aten.permute,
        aten.t,
        aten.transpose,
        aten.squeeze,
        aten.unsqueeze,
        aten.alias,
        aten.clone,
        aten.detach,
    }
)
"""Ops whose output holds exactly the elements of their first input: the statistics are reused."""

_INT32_COUNT_LIMIT = 2**31 - 1


class _Builder:
    """Appends aten nodes at the graph's insertion point."""

    def __init__(self, graph: torch.fx.Graph, device: torch.device) -> None:
        self.graph, self.device = graph, device

    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.graph.call_function(op, args, kwargs)

    def constant(self, value: float) -> torch.fx.Node:
        return self(aten.full.default, [], value, dtype=torch.float64, device=self.device)

    def f64(self, node: torch.fx.Node) -> torch.fx.Node:
        return self(torch.ops.prims.convert_element_type.default, node, torch.float64)

    def squares(self, node: torch.fx.Node) -> torch.fx.Node:
        return self(aten.sum.default, self(aten.mul.Tensor, node, node))

    def count(self, node: torch.fx.Node, equals: float, dtype: torch.dtype) -> torch.fx.Node:
        """How many elements of ``node`` equal ``equals`` (not NaN: the NaN count reuses the mask)."""
        return self(aten.sum.default, self(aten.eq.Scalar, node, equals), dtype=dtype)


def _count_dtype(numel: int | None) -> torch.dtype:
    """int32 counts where the element count is known to fit, else int64 (a symbolic size may grow)."""
    return torch.int32 if numel is not None and numel <= _INT32_COUNT_LIMIT else torch.int64


def insert_stats(
    graph: torch.fx.Graph, value: torch.fx.Node, before: torch.fx.Node, *, count_valid: bool = False
) -> list[tuple[int, torch.fx.Node]]:
    """Insert the accumulators of ``value`` before ``before``: ``(index into ACCUMULATORS, 0-d
    node)`` pairs; none for an empty value. ``count_valid``: also count the non-NaN values (the
    host cannot work out the element count: a symbolic size it cannot evaluate; otherwise the graph
    hands over its symbolic sizes). Integer and bool values are taken in float64 (min, max, sum, sum
    of squares, and the counts a finite value can have: ``Accumulator.nonfinite`` False); complex
    values by their magnitudes."""
    fake = value.meta["val"]
    numel = fake.numel()
    static = isinstance(numel, int)
    if static and numel == 0:
        return []
    b = _Builder(graph, fake.device)
    with graph.inserting_before(before):
        if fake.is_floating_point() or fake.is_complex():
            x = b(aten.abs.default, value) if fake.is_complex() else value
            found = _floating(b, x, fake.dtype in (torch.float64, torch.complex128), numel if static else None, count_valid)
        else:
            wide = b.f64(value)
            found = {"min": b(aten.amin.default, wide), "max": b(aten.amax.default, wide), "sum": b(aten.sum.default, wide)}
            found["squares"] = b.squares(wide)
            count_dtype = _count_dtype(numel if static else None)
            found.update((a.name, b.count(value, a.equals, count_dtype)) for a in COUNTS if not a.nonfinite)
            if count_valid:
                found["valid"] = b(aten.sum.default, b(aten.eq.Tensor, value, value), dtype=torch.int64)
    return [(ACCUMULATORS.index(name), node) for name, node in found.items()]


def _floating(b: _Builder, x: torch.fx.Node, double: bool, numel: int | None, count_valid: bool) -> dict[str, torch.fx.Node]:
    """The accumulators of a floating value (``double``: float64 or complex128); ``numel`` is
    ``None`` when symbolic (its counts are then ``int64``: the size may grow).

    - ``nan = x != x``: the NaN mask (``isnan`` is computed element by element in inductor's C++ code,
      which made it the most expensive part of the statistics);
    - the schema's counts (``torchdebug.stats._schema.COUNTS``: NaN from the mask, the others
      ``x == constant``): ``int32`` sums (``int64`` above 2**31 elements);
    - ``min`` / ``max`` of ``x`` with NaN replaced by ``+inf`` / ``-inf``, in ``x``'s dtype;
    - ``sum`` of ``x`` with NaN replaced by 0, accumulated in float32 (float64 for float64 values);
    - the sum of squares in float64 (the squares may overflow float32);
    - only with ``count_valid``, the count of non-NaN values (``int64``).

    Mean, norm and "no value" are left to the host: done in the graph, those few scalar operations
    per value were as much generated code as the loops themselves, and about half the compile time
    of an every-node dump."""
    count_dtype = _count_dtype(numel)
    nan = b(aten.ne.Tensor, x, x)
    zeroed = b(aten.where.self, nan, b.constant(0.0), x)
    found = {
        "min": b(aten.amin.default, b(aten.where.self, nan, b.constant(math.inf), x)),
        "max": b(aten.amax.default, b(aten.where.self, nan, b.constant(-math.inf), x)),
        "sum": b(aten.sum.default, zeroed, dtype=torch.float64 if double else torch.float32),
        "squares": b.squares(b.f64(zeroed)),
    }
    for a in COUNTS:
        found[a.name] = b(aten.sum.default, nan, dtype=count_dtype) if math.isnan(a.equals) else b.count(x, a.equals, count_dtype)
    if count_valid:
        found["valid"] = b(aten.sum.default, b(aten.logical_not.default, nan), dtype=torch.int64)
    return found


def propagate_fake_values(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """Set ``meta["val"]`` of ``nodes`` (new, in graph order) by running them on the graph's own fake
    values: later inductor passes and lowering read it."""
    placeholders = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode(placeholders)
    if fake_mode is None:
        return
    with fake_mode:
        for node in nodes:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
            node.meta["val"] = node.target(*args, **kwargs)  # type: ignore[operator]  # the inserted call_function nodes: an op
