"""An inductor backend that hands back the value of every node its generated code computed.

For each AOT graph (forward, backward or inference) inductor compiles, this backend keeps a copy of
the graph as inductor received it (before its post-grad passes: the reference program) and adds one
pass at the end of inductor's ``post_grad_custom_post_pass`` slot, after any pass the user set
there. That pass passes every tensor node of the graph to ``torchdebug::dump_graph``
(:mod:`torchdebug.graph_dump._runtime`, the op the graph-mode data dump uses): an extern call needs
its inputs in memory, so inductor stores each node's value even where it fuses the node into a
C++/Triton kernel, and the value is what that kernel computed. The first run's values are kept.

Caching: the pass sits in inductor's config for the whole compile and run (``active()``). Inside
``inner_compile`` its ``uuid()`` is the sink key of the graph being compiled, which
:func:`~torchdebug.graph_dump.register_sink` derives from the graph's code, its phase and
how many identical graphs this process instrumented before. So inductor's FX graph cache can serve
the instrumented code to a later process: a hit is only possible for the same key, and the cached
code reports to the sink registered under that key now, with the node names it carries as the
op's ``labels``. Outside ``inner_compile`` (AOT autograd's cache lookup) ``uuid()`` is ``None``:
a hit there would skip ``inner_compile``, where the sink is registered, so that cache steps aside.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchdebug._torch.inductor import CustomGraphPass, compile_fx, compile_fx_inner, config_patched, custom_pass_patch
from torchdebug.graph_dump import DUMP_GRAPH, propagate_fake_values, register_sink, unregister_sink


@dataclass(slots=True)
class AotGraph:
    """One AOT graph inductor compiled: the reference copy and the values the compiled code made."""

    model: str
    """``model__N``: the N-th Dynamo graph of the run."""
    phase: str
    """``forward``, ``backward`` or ``inference``."""
    original: torch.fx.GraphModule
    values: dict[str, torch.Tensor] | None = None
    """Node name -> the value the compiled code computed in its first run."""

    @property
    def label(self) -> str:
        return f"{self.model} {self.phase}"


class _Collector:
    """The sink of one graph: keeps the values of its first run."""

    def __init__(self, entry: AotGraph) -> None:
        self.entry = entry

    def on_graph(self, stats: list[torch.Tensor], tensors: list[torch.Tensor], labels: list[str]) -> None:
        if self.entry.values is None:
            self.entry.values = {name: t.detach().clone() for name, t in zip(labels, tensors)}

    def on_point(self, point: int, tensors: list[torch.Tensor]) -> None:
        return None


_current: contextvars.ContextVar[int | None] = contextvars.ContextVar("torchdebug_diagnose_sink", default=None)
"""The sink key of the AOT graph ``inner_compile`` is compiling now."""


class _Materialize(CustomGraphPass):
    """Pass every tensor node to ``dump_graph`` before the output (see the module docstring)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        sink = _current.get()
        if sink is None:
            return  # a compile that is not ours (the pass is in the config while we run)
        nodes = [
            n for n in graph.nodes if n.op in ("placeholder", "call_function") and isinstance(n.meta.get("val"), torch.Tensor)
        ]
        labels = ",".join(n.name for n in nodes)  # FX node names never hold a comma
        with graph.inserting_before(graph.find_nodes(op="output")[0]):
            dump = graph.call_function(DUMP_GRAPH, ([], nodes, sink, labels))
        propagate_fake_values(graph, [dump])

    def uuid(self) -> tuple[str, str, int] | None:
        """The sink key of the graph being compiled (see the module docstring), else ``None``."""
        sink = _current.get()
        return None if sink is None else ("torchdebug.diagnose.materialize", _CODE_ID, sink)


_CODE_ID = hashlib.sha256(
    (inspect.getsource(_Materialize) + inspect.getsource(inspect.getmodule(register_sink))).encode()
).hexdigest()[:16]
"""Changes with this pass and with the dump ops, so a cache never serves code they no longer match."""


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


def _identity(phase: str, graph: torch.fx.GraphModule, inputs: Any) -> str:
    """What an AOT graph is, for its sink key: phase, code and the kinds of its inputs."""
    kinds = [f"{x.dtype}{list(x.shape)}{list(x.stride())}" if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs]
    return f"diagnose/{phase}/{kinds}\n{graph.code}"


class InstrumentedInductor:
    """A ``torch.compile`` backend: inductor, with every node's value collected into ``graphs``."""

    def __init__(self) -> None:
        self.graphs: list[AotGraph] = []
        self._sinks: list[int] = []
        self._models = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        model = f"model__{self._models}"
        self._models += 1

        def inner_compile(graph: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
            phase = "backward" if kwargs.get("is_backward") else "inference" if kwargs.get("is_inference") else "forward"
            entry = AotGraph(model, phase, _copy(graph))
            self.graphs.append(entry)
            sink = register_sink(_Collector(entry), _identity(phase, graph, inputs))
            self._sinks.append(sink)
            token = _current.set(sink)
            try:
                return compile_fx_inner(graph, inputs, **kwargs)
            finally:
                _current.reset(token)

        return compile_fx(gm, example_inputs, inner_compile=inner_compile)

    @contextlib.contextmanager
    def active(self) -> Iterator[InstrumentedInductor]:
        """Our pass in inductor's config while compiling and running; the sinks are dropped on exit."""
        try:
            with config_patched(custom_pass_patch("post_grad_custom_post_pass", _Materialize(), first=False)):
                yield self
        finally:
            for sink in self._sinks:
                unregister_sink(sink)
            self._sinks.clear()
