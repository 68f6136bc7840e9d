"""The two custom ops that carry values out of a compiled graph to the dump.

- ``torchdebug::dump_graph(Tensor stats, Tensor[] tensors, int sink) -> ()``: once per graph run,
  the statistics of every dumped value as one float64 vector of ``7 * N`` values (computed inside the graph,
  fused by inductor) and, for tensor dumps, the dumped tensors themselves. It ends the run.
- ``torchdebug::dump_point(Tensor[] tensors, int sink, int point) -> ()``: tensors at one point of
  the graph (the watcher: after a node ran).

An extern call needs its inputs in memory, so inductor materialises the nodes whose tensors are
passed even where it would have fused them; nodes not passed keep their fusion. Both ops return
nothing and are registered as side-effectful (``torch.fx.node.has_side_effect``), so neither FX
dead-code elimination nor inductor's scheduler drops them. ``sink`` is the key of a callback
registered with :func:`register_sink`; compiled code holds only that integer. Both are tagged
``cudagraph_unsafe``: inductor keeps the graph parts holding them out of CUDA graphs, so the
values are read from regular buffers, never from static ones a later replay overwrites.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.fx
from torch import Tensor


class Sink(Protocol):
    """What a compiled graph reports to."""

    def on_graph(self, stats: Tensor, tensors: list[Tensor]) -> None: ...

    def on_point(self, point: int, tensors: list[Tensor]) -> None: ...


_SINKS: dict[int, Sink] = {}
_NEXT = itertools.count()
_TAGS: tuple[Any, ...] = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


def register_sink(sink: Sink) -> int:
    """Register ``sink`` and return the key compiled graphs pass to the ops."""
    key = next(_NEXT)
    _SINKS[key] = sink
    return key


def unregister_sink(key: int) -> None:
    _SINKS.pop(key, None)


@torch.library.custom_op("torchdebug::dump_graph", mutates_args=(), tags=_TAGS)
def dump_graph(stats: Tensor, tensors: list[Tensor], sink: int) -> None:
    """Deliver one graph run's statistics and tensors to sink ``sink`` (a no-op once it is gone)."""
    target = _SINKS.get(sink)
    if target is not None:
        target.on_graph(stats, tensors)


@dump_graph.register_fake
def _dump_graph_fake(stats: Tensor, tensors: list[Tensor], sink: int) -> None:
    return None


@torch.library.custom_op("torchdebug::dump_point", mutates_args=(), tags=_TAGS)
def dump_point(tensors: list[Tensor], sink: int, point: int) -> None:
    """Deliver the tensors of dump point ``point`` to sink ``sink``."""
    target = _SINKS.get(sink)
    if target is not None:
        target.on_point(point, tensors)


@dump_point.register_fake
def _dump_point_fake(tensors: list[Tensor], sink: int, point: int) -> None:
    return None


DUMP_GRAPH: Callable[..., Any] = torch.ops.torchdebug.dump_graph.default
DUMP_POINT: Callable[..., Any] = torch.ops.torchdebug.dump_point.default
for _op in (DUMP_GRAPH, DUMP_POINT):
    torch.fx.node.has_side_effect(_op)
