"""The custom ops that carry values out of a compiled graph to the dump.

``torchdebug::dump_graph`` (once per graph run: the statistics and the dumped tensors),
``torchdebug::host_stats`` (statistics of CPU values, taken on the host as the graph reaches them) and
``torchdebug::dump_point`` (tensors at one point of the graph). Compiled code holds only the integer
key of a sink registered here (:func:`register_sink`), so code from inductor's FX graph cache reports
to the sink this process registered. What the graph hands over, and why the ops are side-effectful
and ``cudagraph_unsafe``: docs/architecture.md, "The graph dump".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Optional, Protocol

import torch
import torch.fx
from torch import Tensor

from torchdebug.graph_dump._plan import ACCUMULATORS
from torchdebug.stats import COLUMNS, IDENTITY, as_real, cpu_sums

_NAN = COLUMNS.index("nan")


class Sink(Protocol):
    """What a compiled graph reports to. ``sizes`` is passed (by keyword) only by graphs that hand
    over symbolic sizes, so a sink of graphs with none may leave it out."""

    def on_graph(self, stats: list[Tensor], tensors: list[Tensor], labels: list[str], *, sizes: list[int] = ...) -> None: ...

    def on_point(self, point: int, tensors: list[Tensor], *, sizes: list[int] = ...) -> None: ...


_Sizes = Optional[list[int]]  # noqa: UP045 (torch.library reads `SymInt[]?` from the typing form)

_SINKS: dict[int, Sink] = {}
_ISSUED: dict[str, int] = {}
"""Per identity: how many keys this process derived from it (keys are never handed out twice)."""
_USED: set[int] = set()
# cudagraph_unsafe: inductor keeps the graph parts holding the ops out of CUDA graphs, so the values are
# read from regular buffers, never from static ones a later replay overwrites.
_TAGS: tuple[Any, ...] = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


def _key(identity: str, index: int) -> int:
    digest = hashlib.sha256(f"{identity}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # a non-negative int64, as the op's schema takes


def register_sink(sink: Sink, identity: str) -> int:
    """Register ``sink`` and return the key compiled graphs pass to the ops.

    The key is a hash of ``identity`` (what the instrumented graph is, e.g. its code and phase) and
    of how many keys this process already derived from that identity. So it is the same in every
    process that instruments the same graphs in the same order, which lets a caller put the key into
    inductor's FX graph cache key (its pass's ``uuid()``): a cache hit then returns code that
    reports to the sink registered now, never to another one. Within a process a key is never
    handed out twice, so two live sinks never share one, and code compiled for a sink that is gone
    delivers nowhere.
    """
    index = _ISSUED.get(identity, 0)
    key = _key(identity, index)
    while key in _USED:  # a 63-bit hash collision: move on, deterministically
        index += 1
        key = _key(identity, index)
    _ISSUED[identity] = index + 1
    _USED.add(key)
    _SINKS[key] = sink
    return key


def unregister_sink(key: int) -> None:
    """Stop delivering to ``key`` (its key is not reused)."""
    _SINKS.pop(key, None)


@torch.library.custom_op("torchdebug::dump_graph", mutates_args=(), tags=_TAGS)
def dump_graph(stats: list[Tensor], tensors: list[Tensor], sink: int, labels: str = "", sizes: _Sizes = None) -> None:
    """Deliver one graph run's statistics and tensors (and symbolic sizes) to sink ``sink`` (a
    no-op once it is gone); it ends the run.

    ``stats``: the accumulators computed inside the graph (0-d tensors, fused by inductor into the
    loops that compute the values) and the ``host_stats`` results, as they are, on their own devices,
    so a graph that mixes devices needs no copy or concatenation in the graph (the capture joins them
    per device and dtype). ``tensors``: for tensor dumps, the dumped tensors; ``labels`` optionally
    names them (comma-separated), so compiled code says what it hands over. ``sizes``: in a graph
    compiled with dynamic shapes, the values of its symbolic sizes (``s27``), which compiled code
    passes as the host ints it computes its loops' bounds with (from the inputs' sizes, never a
    device read); the sink evaluates each slot's shape and stride from them. Registered as
    side-effectful, so neither FX dead-code elimination nor inductor's scheduler drops it."""
    target = _SINKS.get(sink)
    if target is None:
        return
    names = labels.split(",") if labels else []
    if sizes:
        target.on_graph(stats, tensors, names, sizes=sizes)
    else:
        target.on_graph(stats, tensors, names)


@dump_graph.register_fake
def _dump_graph_fake(stats: list[Tensor], tensors: list[Tensor], sink: int, labels: str = "", sizes: _Sizes = None) -> None:
    return None


@torch.library.custom_op("torchdebug::host_stats", mutates_args=(), tags=_TAGS)
def host_stats(tensors: list[Tensor]) -> Tensor:
    """The ``ACCUMULATORS`` of each tensor, one after the other (CPU tensors in one native pass each),
    taken on the host when the graph reaches the call, as float64 values: the layout of the
    accumulators the graph computes itself. A plain function of its inputs: the graph feeds its
    result into ``dump_graph``'s ``stats``, so it always runs before it."""
    values: list[float] = []
    for tensor in tensors:
        if tensor.numel() == 0:
            values += (*IDENTITY, 0)
            continue
        sums = cpu_sums(as_real(tensor.detach()))
        values += (*sums, tensor.numel() - sums[_NAN])
    return torch.tensor(values, dtype=torch.float64)


@host_stats.register_fake
def _host_stats_fake(tensors: list[Tensor]) -> Tensor:
    return torch.empty(len(ACCUMULATORS) * len(tensors), dtype=torch.float64)


@torch.library.custom_op("torchdebug::dump_point", mutates_args=(), tags=_TAGS)
def dump_point(tensors: list[Tensor], sink: int, point: int, sizes: _Sizes = None) -> None:
    """Deliver the tensors (and symbolic sizes) of dump point ``point`` to sink ``sink``: the
    watcher's, after a node ran; ``point=-1``, the graph's inputs, with its symbolic-int inputs in
    ``sizes``, for ``dump_stage="original"``. Side-effectful, as ``dump_graph`` is."""
    target = _SINKS.get(sink)
    if target is None:
        return
    if sizes:
        target.on_point(point, tensors, sizes=sizes)
    else:
        target.on_point(point, tensors)


@dump_point.register_fake
def _dump_point_fake(tensors: list[Tensor], sink: int, point: int, sizes: _Sizes = None) -> None:
    return None


DUMP_GRAPH: Callable[..., Any] = torch.ops.torchdebug.dump_graph.default
DUMP_POINT: Callable[..., Any] = torch.ops.torchdebug.dump_point.default
HOST_STATS: Callable[..., Any] = torch.ops.torchdebug.host_stats.default
for _op in (DUMP_GRAPH, DUMP_POINT):
    torch.fx.node.has_side_effect(_op)
