"""The ``data_dump`` pass: make a compiled graph report the inputs and outputs of selected nodes.

:class:`DataDumpPass` runs on each AOT graph of one Dynamo graph: the planner (``_planner.py``) decides
what is dumped and returns a :class:`Plan`, the capture registers the plan's run-time half and hands
back the sink key, and :func:`instrument` inserts the nodes (its docstring says what the graph holds
after). Nothing existing in the graph is changed. Where the pass runs and what the graph hands over:
docs/architecture.md, "The graph dump".
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from torchdebug._torch import guards
from torchdebug._torch.compiled_graphs import calls_around
from torchdebug.graph_dump import _node_names as node_names
from torchdebug.graph_dump._accumulators import insert_stats, propagate_fake_values
from torchdebug.graph_dump._capture import GraphCapture
from torchdebug.graph_dump._instances import compiled_frame
from torchdebug.graph_dump._plan import GraphPlan, StatTable
from torchdebug.graph_dump._planner import ModelContext, Plan, first_writes, plan_graph
from torchdebug.graph_dump._runtime import DUMP_GRAPH, DUMP_POINT, HOST_STATS
from torchdebug.graph_dump._settings import DumpSettings

aten = torch.ops.aten
log = logging.getLogger(__name__)


def _aot_phase(graph: torch.fx.Graph) -> str:
    """The AOT graph kind where no compile phase is open (``aot_eager`` runs the pipeline without
    one): a backward graph takes the output gradients, its ``tangents`` inputs."""
    backward = any(node.name.startswith("tangents") for node in graph.find_nodes(op="placeholder"))
    return "backward" if backward else "forward"


def _no_open_phase() -> str | None:
    return None


@functools.cache
def _warn_compiled_autograd() -> None:
    """Once a process: a backward traced by compiled autograd is dumped, but not as a backward."""
    log.warning(
        "torchdebug: this backward was traced by compiled autograd, which the graph dump does not follow: its records"
        " are phase forward in module '-', and compare pairs none of them with an eager backward"
        " (docs/graph_dump.md, 'Limits')"
    )


class DataDumpPass:
    """One instance per Dynamo graph; called by the pipeline on each of its AOT graphs."""

    def __init__(
        self,
        settings: DumpSettings,
        capture: GraphCapture,
        model: ModelContext,
        aot_phase: Callable[[], str | None] = _no_open_phase,
    ) -> None:
        self.settings, self.capture, self.model = settings, capture, model
        self.aot_phase = aot_phase
        """The AOT graph kind of the compile phase open now (``None`` where none is open: the
        graph's inputs tell)."""
        self._planned: GraphPlan | None = None
        """The plan of the AOT graph instrumented last, until :meth:`following` takes it."""

    def uuid(self) -> None:
        """No cache id: a cached graph would call sinks this process never registered."""
        return None

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        graph = gm.graph
        if guards.compiling_compiled_autograd():
            _warn_compiled_autograd()
        aot_phase = self.aot_phase() or _aot_phase(graph)
        if self.model.rooted is None:
            self.model.rooted = node_names.graph_is_rooted(graph)
            self.model.frame = guards.current_frame()
            self.model.code = compiled_frame(graph)
        golden = self._copy(gm) if self.settings.dump_stage == "original" else None
        plan = plan_graph(graph, self.settings, self.model, aot_phase, golden)
        instrument(graph, plan, self.capture.add_graph(plan.graph))
        self._planned = plan.graph

    def following(self, compiled: Any) -> Any:
        """``compiled``, the AOT graph this pass instrumented last as the compiler returned it,
        telling the capture what each run receives and returns (``graph_dump/_handover.py``)."""
        plan, self._planned = self._planned, None
        if plan is None or not (plan.inputs or plan.outputs):
            return compiled
        capture = self.capture
        return calls_around(
            compiled, lambda args: capture.before_run(plan, args), lambda outputs: capture.after_run(plan, outputs)
        )

    @staticmethod
    def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        return torch.fx.GraphModule(gm, graph)


def instrument(graph: torch.fx.Graph, plan: Plan, sink: int) -> None:
    """Insert into ``graph`` what ``plan`` asks for, reporting to ``sink``; fill in how
    ``dump_graph``'s lists are laid out (``plan.graph.tables``, ``golden_inputs``).

    Afterwards the graph holds, for ``dump_stage="optimized"``:

    - accumulator nodes (``torchdebug.graph_dump._accumulators``) after each value whose statistics
      the graph computes, and ``torchdebug::host_stats`` calls, a few values at a time, after the
      values the host takes (the planner says which);
    - before the output, ``torchdebug::dump_graph([statistics], [dumped tensors], sink)``: the 0-d
      accumulators and the ``host_stats`` results, ordered in runs of one device and dtype
      (``GraphPlan.tables``; nothing in the graph combines two devices, so CUDA graphs holding CPU
      scalars compile), and the tensors of a tensor dump (passing them to an extern call is what makes
      inductor materialise them; nodes not passed keep their fusion); in a graph with symbolic sizes,
      the symbols' values as its ``sizes`` (``aten.sym_size.int`` / ``aten.sym_stride.int`` reads
      where no placeholder holds one);
    - ``torchdebug::dump_point([...], sink, i)`` at each point the scene asks for (the watcher: after
      each watched node and each ``layer`` node).

    For ``dump_stage="original"`` the graph only hands its inputs to ``dump_point(..., -1)`` when it
    starts and calls ``dump_graph`` when it ends; the values come from an interpreter over a copy of
    the graph as it was before this pass (``torchdebug.graph_dump._golden``).
    """
    _Instrumenter(graph, plan, sink).run()


class _Instrumenter:
    """Inserts the statistics nodes and the dump ops a plan needs."""

    def __init__(self, graph: torch.fx.Graph, plan: Plan, sink: int) -> None:
        self.graph, self.plan, self.graph_plan, self.sink = graph, plan, plan.graph, sink

    def run(self) -> None:
        graph, plan = self.graph, self.graph_plan
        before = set(graph.nodes)
        placeholders = list(graph.find_nodes(op="placeholder"))
        self.after_inputs = placeholders[-1].next if placeholders else next(iter(graph.nodes))
        if plan.golden is not None:
            self._insert_golden_inputs(placeholders)
        sizes = self._size_nodes()
        stats = self._insert_stats()
        with graph.inserting_before(graph.find_nodes(op="output")[0]):
            if not stats and not self.plan.tensors:
                # an extern call with no tensor argument makes inductor (2.13) free a buffer
                # before its last use; an empty tensor, which no table covers, avoids that
                stats = [graph.call_function(aten.full.default, ([0], 0.0), {"dtype": torch.float64})]
            args: tuple[Any, ...] = (stats, self._tensors(), self.sink)
            if sizes:
                args += ("", sizes)
            graph.call_function(DUMP_GRAPH, args)
        self._insert_points()
        propagate_fake_values(graph, [n for n in graph.nodes if n not in before and "val" not in n.meta])

    def _tensors(self) -> list[torch.fx.Node]:
        """The tensors handed to ``dump_graph``: those a later node writes in place (``plan.copied``)
        as a copy taken right after them, so the dump holds what the ops that read them saw."""
        tensors = []
        for node in self.plan.tensors:
            if node in self.plan.copied:
                with self.graph.inserting_before(self._after(node)):
                    node = self.graph.call_function(aten.clone.default, (node,))
            tensors.append(node)
        return tensors

    def _after(self, node: torch.fx.Node) -> torch.fx.Node:
        return self.after_inputs if node.op == "placeholder" else node.next

    def _insert_golden_inputs(self, placeholders: list[torch.fx.Node]) -> None:
        """``dump_point(tensor inputs, sink, -1, symbolic-int inputs)`` where the inputs are known."""
        tensors, sizes, kinds = [], [], []
        written = first_writes(self.graph)
        for node in placeholders:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                tensors.append(node)
                kinds.append("written" if node in written else "tensor")
            elif isinstance(value, (int, torch.SymInt)):
                sizes.append(node)
                kinds.append("size")
            else:
                kinds.append("none")
        self.graph_plan.golden_inputs = tuple(kinds)
        args: tuple[Any, ...] = (tensors, self.sink, -1)
        if sizes:
            args += (sizes,)
        with self.graph.inserting_before(self.after_inputs):
            self.graph.call_function(DUMP_POINT, args)

    def _size_nodes(self) -> list[torch.fx.Node]:
        """The nodes ``dump_graph`` reads the plan's symbols from, in ``plan.sizes.symbols`` order:
        symbolic-int inputs as they are, other symbols read off a node's size or stride right after it."""
        nodes = []
        for node, kind, dim in self.plan.size_sources:
            if kind is None:
                nodes.append(node)
                continue
            value = node.meta["val"]
            op = aten.sym_size.int if kind == "size" else aten.sym_stride.int
            with self.graph.inserting_before(self._after(node)):
                read = self.graph.call_function(op, (node, dim))
            read.meta["val"] = value.shape[dim] if kind == "size" else value.stride()[dim]
            nodes.append(read)
        return nodes

    def _insert_stats(self) -> list[torch.fx.Node]:
        """Insert the accumulators and ``host_stats`` calls; return them as ``dump_graph``'s
        ``stats`` list, one run per device and dtype (``plan.tables``): nothing in the graph joins
        values of two devices (a CUDA graph holds CPU scalars too), the host does, per table."""
        graph, rows = self.graph, self.plan.stat_rows
        before = set(graph.nodes)
        accumulators: list[tuple[torch.fx.Node, tuple[int, int]]] = []
        for node in self.plan.in_graph:
            count = self.graph_plan.numel[rows[node]] is None  # the host cannot work out its element count
            for index, accumulator in insert_stats(graph, node, self._after(node), count_valid=count):
                accumulators.append((accumulator, (rows[node], index)))
        host: list[tuple[torch.fx.Node, list[torch.fx.Node]]] = []
        for nodes in self.plan.host_groups:
            with graph.inserting_before(self._after(nodes[-1])):
                host.append((graph.call_function(HOST_STATS, (nodes,)), nodes))
        propagate_fake_values(graph, [n for n in graph.nodes if n not in before])
        tables: dict[tuple[torch.device, torch.dtype], list[tuple[torch.fx.Node, tuple[int, int]]]] = {}
        for accumulator, entry in accumulators:
            value = accumulator.meta["val"]
            tables.setdefault((value.device, value.dtype), []).append((accumulator, entry))
        self.graph_plan.tables = [StatTable(len(table), entries=tuple(entry for _, entry in table)) for table in tables.values()]
        stats = [accumulator for table in tables.values() for accumulator, _ in table]
        if host:  # CPU float64 vectors, the ACCUMULATORS of each value
            self.graph_plan.tables.append(StatTable(len(host), rows=tuple(rows[n] for _, nodes in host for n in nodes)))
            stats += [result for result, _ in host]
        return stats

    def _insert_points(self) -> None:
        """``dump_point`` after each watcher point's node, fed its output (ordering) and the watched outputs."""
        nodes = {n.name: n for n in self.graph.nodes}
        positions = {n: i for i, n in enumerate(self.graph.nodes)}

        def first_output(name: str) -> torch.fx.Node:
            return next(holder for _, holder, _ in node_names.output_nodes(nodes[name]) if holder is not None)

        for index, point in enumerate(self.graph_plan.points):
            watched = [first_output(self.graph_plan.calls[i].node) for i, _ in point.watched]
            node = nodes[point.after]
            outputs = [h for _, h, v in node_names.output_nodes(node) if h is not None and isinstance(v, torch.Tensor)]
            own = [] if node.name == self.graph_plan.calls[point.watched[0][0]].node else outputs[:1]
            last = max([node, *outputs], key=positions.__getitem__)
            with self.graph.inserting_after(last):
                self.graph.call_function(DUMP_POINT, (own + watched, self.sink, index))
