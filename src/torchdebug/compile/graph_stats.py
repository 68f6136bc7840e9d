"""Statistics as FX nodes, inserted after each dumped value so inductor fuses them into one loop.

The numbers are those of ``torchdebug.stats.stats_vector`` (a float64 7-vector in ``STAT_KEYS``
order; NaN in the first four means "no value"), written for inductor's code generators. For a
floating value ``x`` inductor reads ``x`` once and keeps seven accumulators, all vectorised:

- ``nan = x != x``: the NaN mask (``isnan`` is computed element by element in inductor's C++ code,
  which made it the most expensive part of the statistics);
- counts of NaN, ``+inf`` and ``-inf``: ``int32`` sums (``int64`` above 2**31 elements);
- ``min`` / ``max`` of ``x`` with NaN replaced by ``+inf`` / ``-inf``;
- ``sum`` of ``x`` with NaN replaced by 0, accumulated in float32 (float64 for float64 values);
- the sum of squares in float64 (the squares may overflow float32).

Then, on 0-d values: ``valid = numel - nan`` (``numel`` from the shape, or one more count when
the shape is symbolic), ``mean = sum / valid``, ``norm = sqrt(sum of squares)``, and NaN where
``valid == 0``. Integer and bool values are taken in float64 with zero counts; complex values by
their magnitudes. After insertion the new nodes get ``meta["val"]`` from the graph's own fake mode
(:func:`propagate_fake_values`): later inductor passes and lowering read it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

from torchdebug._torch.dynamo import detect_fake_mode

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
    """Appends aten nodes before one point of a graph."""

    def __init__(self, graph: torch.fx.Graph, device: torch.device) -> None:
        self.graph, self.device = graph, device

    def __call__(self, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.graph.call_function(op, args, kwargs)

    def constant(self, value: float) -> torch.fx.Node:
        return self(aten.full.default, [], value, dtype=torch.float64, device=self.device)

    def f64(self, node: torch.fx.Node) -> torch.fx.Node:
        return self(torch.ops.prims.convert_element_type.default, node, torch.float64)

    def count(self, mask: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        return self.f64(self(aten.sum.default, mask, dtype=dtype))


def insert_stats(graph: torch.fx.Graph, value: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """Insert the statistics of ``value`` (a 7-vector, float64) before ``before``; return its node."""
    fake = value.meta["val"]
    numel = fake.numel()
    static = isinstance(numel, int)
    b = _Builder(graph, fake.device)
    with graph.inserting_before(before):
        if static and numel == 0:
            entries = [b.constant(math.nan)] * 4 + [b.constant(0.0)] * 3
        elif fake.is_floating_point() or fake.is_complex():
            x = b(aten.abs.default, value) if fake.is_complex() else value
            entries = _floating(b, x, fake.dtype in (torch.float64, torch.complex128), numel if static else None)
        else:
            entries = _integer_stats(b, value)
        return b(aten.cat.default, [b(aten.view.default, e, [1]) for e in entries])


def _floating(b: _Builder, x: torch.fx.Node, double: bool, numel: int | None) -> list[torch.fx.Node]:
    """Seven 0-d float64 nodes for a floating value (``double``: float64 or complex128);
    ``numel`` is ``None`` when symbolic."""
    count_dtype = torch.int32 if numel is not None and numel <= _INT32_COUNT_LIMIT else torch.int64
    nan = b(aten.ne.Tensor, x, x)
    counts = [
        b.count(nan, count_dtype),
        b.count(b(aten.eq.Scalar, x, math.inf), count_dtype),
        b.count(b(aten.eq.Scalar, x, -math.inf), count_dtype),
    ]
    low = b.f64(b(aten.amin.default, b(aten.where.self, nan, b.constant(math.inf), x)))
    high = b.f64(b(aten.amax.default, b(aten.where.self, nan, b.constant(-math.inf), x)))
    zeroed = b(aten.where.self, nan, b.constant(0.0), x)
    total = b.f64(b(aten.sum.default, zeroed, dtype=torch.float64 if double else torch.float32))
    wide = b.f64(zeroed)
    norm = b(aten.sqrt.default, b(aten.sum.default, b(aten.mul.Tensor, wide, wide)))
    if numel is not None:
        valid = b(aten.sub.Tensor, b.constant(float(numel)), counts[0])
    else:
        valid = b.count(b(aten.logical_not.default, nan), torch.int64)
    has = b(aten.gt.Scalar, valid, 0)
    mean = b(aten.div.Tensor, total, b(aten.clamp_min.default, valid, 1.0))
    none = b.constant(math.nan)
    return [*(b(aten.where.self, has, v, none) for v in (low, high, mean, norm)), *counts]


def _integer_stats(b: _Builder, x: torch.fx.Node) -> list[torch.fx.Node]:
    """Seven 0-d float64 nodes for a non-empty integer or bool value (no NaN or Inf possible)."""
    wide = b.f64(x)
    zero = b.constant(0.0)
    norm = b(aten.sqrt.default, b(aten.sum.default, b(aten.mul.Tensor, wide, wide)))
    return [b(aten.amin.default, wide), b(aten.amax.default, wide), b(aten.mean.default, wide), norm, zero, zero, zero]


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
