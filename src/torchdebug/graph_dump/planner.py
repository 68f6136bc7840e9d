"""The ``data_dump`` pass: make a compiled graph report the inputs and outputs of selected nodes.

Reads ``node.meta``: ``val`` (dtype, shape, device), ``nn_module_stack`` / ``fwd_nn_module_stack``,
``seq_nr``, ``partitioner_tag``, ``stack_trace`` and ``custom`` (``torchdebug.scope.data_dump()``
marks). Writes nothing to existing nodes. After the pass the graph holds, for ``dump_stage``
``optimized``:

- for each value a dumped slot reads (views and clones share the row of their input), its
  statistics. CPU values that inductor keeps in memory anyway (graph inputs and outputs, inputs and
  outputs of matrix products and convolutions), that are small (``SMALL``) or that inductor computes
  in a loop over the rows of a reduction (layer norm, softmax: statistics over the whole value
  cannot join that loop, so in the graph they would split the kernel in two) go to
  ``torchdebug::host_stats`` a few at a time, as soon as they exist, and the host takes them in one
  native pass each (``torchdebug.native``, about twice as fast per element as inductor's fused
  reductions here, and nothing to compile). The other values get accumulator nodes inside the graph
  (``graph_stats``), fused by inductor into the loops that compute them: storing them for the host
  would cost more than it saves;
- before the output, ``torchdebug::dump_graph([statistics], [dumped tensors], sink)``: the 0-d
  accumulators and the ``host_stats`` results, ordered in runs of one device and dtype
  (``GraphPlan.tables``; nothing in the graph combines two devices, so CUDA graphs holding CPU
  scalars compile), and the tensors of a tensor dump (passing them to an extern call is what makes
  inductor materialise them; nodes not passed keep their fusion);
- for the watcher scene, ``torchdebug::dump_point([...], sink, i)`` after each watched node and each
  ``layer`` node (no statistics rows: the watcher takes its own).

For ``dump_stage="original"`` the graph only hands its inputs to ``dump_point(..., -1)`` when it
starts and calls ``dump_graph`` when it ends; the values come from an interpreter over a copy of the
graph as it was before this pass (``torchdebug.graph_dump.golden``).

Dynamic shapes: sizes, strides, element counts and arguments that are expressions of the graph's
symbols (``SymInt``: ``2*s27``) are planned as such (``graph_plan.SymbolicSize``), and
``dump_graph`` gets the symbols' values as its ``sizes``: each symbol's placeholder where the graph
has one (Dynamo and AOT autograd pass the symbols a graph uses as inputs), else
``aten.sym_size.int`` / ``aten.sym_stride.int`` of the first node whose size or stride is that
symbol. Compiled code hands them over as the host ints it sizes its loops with; the host evaluates
the expressions once per distinct set of values. Compile-time choices that depend on sizes
(``SMALL``, the row loops) use the sizes the graph was traced with (the hints).

Forward nodes that the partitioner recomputes in a backward graph are neither dumped nor counted:
their values are those the forward graph dumped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from torchdebug._torch import guards, symbolic
from torchdebug.graph_dump import accumulators as graph_stats
from torchdebug.graph_dump import node_names
from torchdebug.graph_dump.capture import GraphCapture
from torchdebug.graph_dump.plan import CallPlan, GraphPlan, Key, PointPlan, SlotPlan, StatTable, SymbolicSizes
from torchdebug.graph_dump.runtime import DUMP_GRAPH, DUMP_POINT, HOST_STATS
from torchdebug.graph_dump.settings import DumpSettings, safe_model_name
from torchdebug.native import fused_stats
from torchdebug.scope import SCOPE_KEY
from torchdebug.slots import dtype_name, iter_slots, json_value

aten = torch.ops.aten
log = logging.getLogger("torchdebug.graph_dump.planner")

HOST_GROUP = 8
"""CPU values handed to one ``host_stats`` call (fewer calls; values stay in memory a little longer)."""

SMALL = 65536
"""Values with fewer elements go to the host on the CPU even when inductor would fuse them."""

UNKNOWN_SIZE = 8192
"""What a data-dependent (unbacked) size counts as in compile-time choices: it has no hint."""


@dataclass
class ModelContext:
    """What the passes over the AOT graphs of one Dynamo graph share."""

    name: str
    rooted: bool | None = None
    forward_calls: dict[Any, tuple[Key, int]] = field(default_factory=dict)
    frame: str | None = None
    """The Dynamo frame the graph comes from (recompiles share it)."""


def _numel(value: torch.Tensor) -> int:
    """The element count of a fake value; for a symbolic one, as traced (compile-time choices only)."""
    numel = value.numel()
    return numel if isinstance(numel, int) else symbolic.hint(numel, UNKNOWN_SIZE)


def _is_integral(value: torch.Tensor) -> bool:
    return not (value.is_floating_point() or value.is_complex())


_STORED_AROUND = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten.convolution_backward})
"""Ops inductor runs as extern kernels: their inputs and outputs are in memory in any case."""


def _host_stats(value: torch.Tensor) -> bool:
    """Whether the host can take this value's statistics (see the module docstring)."""
    return value.device.type == "cpu" and fused_stats.available()


def _small(value: torch.Tensor) -> bool:
    """Whether storing the value for the host costs next to nothing (while its statistics in the
    graph would cost as much generated code, so compile time, as a large value's). A symbolic size
    counts as traced: a value small then is of the same order at run time (a sequence length)."""
    return _numel(value) < SMALL


def _stored(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes whose values inductor keeps in memory whatever we add: graph inputs and outputs and
    the inputs and outputs of extern kernels (statistics from the host cost them no extra store)."""
    stored = set(graph.find_nodes(op="placeholder"))
    stored.update(graph.find_nodes(op="output")[0].all_input_nodes)
    for node in graph.nodes:
        if getattr(node.target, "overloadpacket", None) in _STORED_AROUND:
            stored.add(node)
            stored.update(node.all_input_nodes)
    return stored


def _in_row_kernels(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes inductor computes inside a loop over rows of a reduction (layer norm, softmax): values
    made from a computed value with fewer elements (a row statistic, broadcast), and the values of
    the same size made from them. A whole-tensor reduction cannot join such a kernel, so their
    statistics in the graph would split it in two (one more kernel to compile and run)."""
    found: set[torch.fx.Node] = set()
    numels: dict[torch.fx.Node, int] = {}
    for node in graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        numel = numels[node] = _numel(value)  # symbolic sizes as traced
        if node.op != "call_function":
            continue
        for arg in node.all_input_nodes:
            size = numels.get(arg)
            if size is None:
                continue
            row_statistic = arg.op == "call_function" and 1 < size < numel
            if row_statistic or (arg in found and size == numel):
                found.add(node)
                break
    return found


def _plain_lists(value: Any) -> Any:
    """FX's ``immutable_list``/``immutable_dict`` as plain ones, as eager calls get them: the slot
    walk (``iter_slots``) walks a plain list of tensors into one slot per tensor (``cat``'s inputs)."""
    if isinstance(value, list):
        return [_plain_lists(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_lists(item) for item in value)
    if isinstance(value, dict):
        return {key: _plain_lists(item) for key, item in value.items()}
    return value


def _aot_phase(graph: torch.fx.Graph) -> str:
    """The AOT graph kind where no compile phase is open (``aot_eager`` runs the pipeline without
    one): a backward graph takes the output gradients, its ``tangents`` inputs."""
    backward = any(node.name.startswith("tangents") for node in graph.find_nodes(op="placeholder"))
    return "backward" if backward else "forward"


def _output_nodes(node: torch.fx.Node) -> Iterator[tuple[str, torch.fx.Node | None, Any]]:
    """``(arg, node holding the value, fake value)`` for each output of ``node``."""
    value = node.meta.get("val")
    if not isinstance(value, (tuple, list)):
        yield "0", node, value
        return
    getitems = {
        user.args[1]: user
        for user in node.users
        if user.op == "call_function" and getattr(user.target, "__name__", "") == "getitem"
    }
    for index, item in enumerate(value):
        yield str(index), getitems.get(index), item


class DataDumpPass:
    """One instance per Dynamo graph; called by the pipeline on each of its AOT graphs."""

    def __init__(
        self,
        settings: DumpSettings,
        capture: GraphCapture,
        model: ModelContext,
        aot_phase: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.settings, self.capture, self.model = settings, capture, model
        self.aot_phase = aot_phase
        """The AOT graph kind of the compile phase open now (``None`` where none is open)."""

    def uuid(self) -> None:
        """No cache id: a cached graph would call sinks this process never registered."""
        return None

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        graph = gm.graph
        aot_phase = self.aot_phase() or _aot_phase(graph)
        if self.model.rooted is None:
            self.model.rooted = node_names.graph_is_rooted(graph)
            self.model.frame = guards.current_frame()
        golden = self._copy(gm) if self.settings.stage == "original" else None
        planner = _Planner(self.settings, self.model, aot_phase, graph)
        plan = planner.plan(golden)
        sink = self.capture.add_graph(plan)
        _Instrumenter(graph, plan, sink, planner).run()

    @staticmethod
    def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        return torch.fx.GraphModule(gm, graph)


class _Planner:
    """Names every op node and describes the dumped ones (no graph edits)."""

    def __init__(self, settings: DumpSettings, model: ModelContext, aot_phase: str, graph: torch.fx.Graph) -> None:
        self.settings, self.model, self.aot_phase, self.graph = settings, model, aot_phase, graph
        layers = set(settings.layers)
        if settings.models is not None:
            layers |= settings.models.get(safe_model_name(model.name), set())
        self.layers = layers
        self.whole_graph = settings.models is None or safe_model_name(model.name) in settings.models
        self.stat_rows: dict[torch.fx.Node, int] = {}
        self.tensor_index: dict[torch.fx.Node, int] = {}
        self.sizes = SymbolicSizes()
        self.size_sources: list[tuple[torch.fx.Node, str | None, int]] = []
        """Per symbol of ``sizes.symbols``: the node that holds its value, and how to read it
        (``None``: the node is the symbolic int; ``size``/``stride``: of dimension ``dim``)."""

    def _selected(self, node: torch.fx.Node) -> bool:
        if self.settings.scene == "overflow":
            return True
        if self.settings.scene == "watcher":
            return node.name in self.settings.watched
        if not self.whole_graph:
            return False
        custom = node.meta.get("custom")
        marked = isinstance(custom, dict) and bool(custom.get(SCOPE_KEY))
        any_mark = self.layers or self._any_mark
        return not any_mark or node.name in self.layers or marked

    def plan(self, golden: torch.fx.GraphModule | None) -> GraphPlan:
        self._any_mark = any(isinstance(n.meta.get("custom"), dict) and n.meta["custom"].get(SCOPE_KEY) for n in self.graph.nodes)
        counts: dict[Key, int] = {}
        calls: list[CallPlan] = []
        forward_calls: dict[Any, tuple[Key, int]] = {}
        replaced = node_names.replaced_ops(self.graph)
        order = 0
        for node in self.graph.nodes:
            target = node_names.op_name(node)
            if target is None:
                continue
            backward = node_names.is_backward_node(node, self.aot_phase)
            if self.aot_phase == "backward" and not backward:
                continue  # recomputed forward node (see the module docstring)
            # Backward calls run in another order than eager's: renamed ones would pair wrongly.
            op = target if backward else replaced.get(node, target)
            key = ("backward" if backward else "forward", node_names.module_of(node, backward, bool(self.model.rooted)), op)
            local = counts.get(key, 0)
            counts[key] = local + 1
            seq_nr = node.meta.get("seq_nr")
            if not backward and seq_nr is not None:
                forward_calls.setdefault(seq_nr, (key, local))
            if self._selected(node):
                fwd = self.model.forward_calls.get(seq_nr) if backward else None
                call = CallPlan(node.name, key, local, order, node_names.source_of(node), fwd, target if op != target else None)
                call.slots = list(self._slots(node, golden is not None, values=op == target))
                calls.append(call)
            order += 1
        if self.aot_phase != "backward":
            self.model.forward_calls.update(forward_calls)
        plan = GraphPlan(
            self.model.name, self.aot_phase, calls, counts, order, golden=golden, sizes=self.sizes, frame=self.model.frame
        )
        plan.points = self._points(calls) if self.settings.scene == "watcher" else []
        self._split_rows(plan)
        self._find_symbols(plan)
        self.tensor_nodes = sorted(self.tensor_index, key=self.tensor_index.get)
        return plan

    # -- symbolic sizes ----------------------------------------------------------------------------
    def _size(self, value: Any) -> Any:
        """A size, stride or count: an ``int``, or a ``SymbolicSize`` when it is symbolic."""
        if isinstance(value, int):
            return value
        if symbolic.is_symbolic(value):
            return self.sizes.add(symbolic.expression(value))
        return symbolic.evaluate([symbolic.expression(value)], {})[0]  # a SymInt that is a constant

    def _meta(self, value: torch.Tensor) -> dict[str, Any]:
        return {
            "dtype": dtype_name(value.dtype),
            "shape": [self._size(s) for s in value.shape],
            "stride": [self._size(s) for s in value.stride()],
            "device": str(value.device),
        }

    def _value(self, value: Any) -> Any:
        """A non-tensor argument's JSON value, its symbolic parts (a size list's ``s27``) planned."""
        if isinstance(value, symbolic.SYMBOLIC_TYPES):
            return self._size(value)
        if isinstance(value, (list, tuple)) and any(isinstance(v, (*symbolic.SYMBOLIC_TYPES, list, tuple)) for v in value):
            return [self._value(item) for item in value]
        return json_value(value)

    def _find_symbols(self, plan: GraphPlan) -> None:
        """Which node gives each symbol the plan's expressions use (see the module docstring);
        rows whose element count needs a symbol no node gives are counted in the graph instead."""
        wanted = self.sizes.free_symbols()
        if not wanted:
            return
        sources: dict[Any, tuple[torch.fx.Node, str | None, int]] = {}
        for node in self.graph.nodes:  # placeholders first: they are the graph's first nodes
            value = node.meta.get("val")
            if isinstance(value, torch.SymInt):
                symbol = symbolic.expression(value)
                if symbol in wanted and symbol not in sources:
                    sources[symbol] = (node, None, 0)
            elif isinstance(value, torch.Tensor):
                for kind, sizes in (("size", value.shape), ("stride", value.stride())):
                    for dim, size in enumerate(sizes):
                        if isinstance(size, torch.SymInt):
                            symbol = symbolic.expression(size)
                            if symbol in wanted and symbol not in sources:
                                sources[symbol] = (node, kind, dim)
            if len(sources) == len(wanted):
                break
        self.sizes.symbols = tuple(sources)
        self.size_sources = list(sources.values())
        missing = wanted - set(sources)
        if missing:
            log.warning(
                "%s/%s: no node holds the symbolic size(s) %s; records show them as expressions",
                self.model.name,
                self.aot_phase,
                ", ".join(sorted(map(str, missing))),
            )
            for row, numel in enumerate(plan.numel):
                if (
                    numel is not None
                    and not isinstance(numel, int)
                    and self.sizes.expressions[numel.index].free_symbols & missing
                ):
                    plan.numel[row] = None

    def _split_rows(self, plan: GraphPlan) -> None:
        """Who computes each statistics row: the host for CPU values stored in memory anyway, small
        ones and those computed in a loop over rows (their statistics in the graph would split the
        kernel), in groups of values in the order the graph computes them (``host_groups``); the
        graph for the others (``graph_nodes``), so that fused values stay fused."""
        nodes = sorted(self.stat_rows, key=self.stat_rows.get)
        plan.integral = [_is_integral(n.meta["val"]) for n in nodes]
        plan.numel = [self._size(n.meta["val"].numel()) for n in nodes]
        cheap = {self._source(n) for n in _stored(self.graph) | _in_row_kernels(self.graph)}
        on_host = {n for n in nodes if (n in cheap or _small(n.meta["val"])) and _host_stats(n.meta["val"])}
        self.graph_nodes = [n for n in nodes if n not in on_host]
        position = {n: i for i, n in enumerate(self.graph.nodes)}
        host = sorted(on_host, key=position.__getitem__)
        self.host_groups = [host[i : i + HOST_GROUP] for i in range(0, len(host), HOST_GROUP)]

    def _slots(self, node: torch.fx.Node, golden: bool, values: bool = True) -> Iterator[SlotPlan]:
        """``values``: also the non-tensor arguments (not for a node named after the op it replaced:
        its arguments are the stand-in's, ``permute`` dims for ``transpose``'s)."""
        mode = self.settings.mode
        if mode in ("all", "input") and self.settings.scene != "watcher":
            holders: dict[int, torch.fx.Node] = {}

            def fake(arg: torch.fx.Node) -> Any:
                value = arg.meta.get("val")
                holders[id(value)] = arg
                return value

            args, kwargs = _plain_lists(torch.fx.node.map_arg((node.args, node.kwargs), fake))
            for arg, value in iter_slots(args, kwargs):
                if isinstance(value, torch.Tensor):
                    yield self._slot("input", arg, holders.get(id(value)), value, golden)
                elif values:
                    yield self._slot("input", arg, None, value, golden)
        if mode in ("all", "output"):
            for arg, holder, value in _output_nodes(node):
                slot = self._slot("output", arg, holder, value, golden)
                if holder is None and isinstance(value, torch.Tensor):
                    slot.note = "output not used by the graph, so never materialised"
                yield slot

    def _slot(self, io: str, arg: str, holder: torch.fx.Node | None, value: Any, golden: bool) -> SlotPlan:
        if not isinstance(value, torch.Tensor):
            return SlotPlan(io, arg, kind="value", value=self._value(value))
        slot = SlotPlan(io, arg, meta=self._meta(value))
        if holder is None or golden:
            slot.source_node = holder.name if holder is not None else None
            return slot
        if self.settings.scene != "watcher":
            slot.stat = self._stat_row(holder)
        if self.settings.task == "tensor" and self.settings.scene == "model":
            slot.tensor = self.tensor_index.setdefault(holder, len(self.tensor_index))
        return slot

    def _stat_row(self, node: torch.fx.Node) -> int:
        return self.stat_rows.setdefault(self._source(node), len(self.stat_rows))

    @staticmethod
    def _source(node: torch.fx.Node) -> torch.fx.Node:
        """The node whose value holds the same elements as ``node`` (through views and clones)."""
        source = node
        while (
            source.op == "call_function"
            and getattr(source.target, "overloadpacket", None) in graph_stats.SAME_ELEMENTS
            and isinstance(source.args[0], torch.fx.Node)
            and isinstance(source.args[0].meta.get("val"), torch.Tensor)
            and source.args[0].meta["val"].numel() == source.meta["val"].numel()
            and source.args[0].meta["val"].dtype == source.meta["val"].dtype
        ):
            source = source.args[0]
        return source

    def _points(self, calls: list[CallPlan]) -> list[PointPlan]:
        """A point after each watched node (its reference values) and after each later ``layer`` node."""
        by_name = {call.node: index for index, call in enumerate(calls)}
        points, seen = [], []
        for node in self.graph.nodes:
            if node.name in by_name:
                seen.append(by_name[node.name])
                points.append(PointPlan(node.name, [(by_name[node.name], "0")]))
            elif (
                seen
                and node.op == "call_function"
                and node_names.op_name(node) is not None
                and (not self.settings.watched_after or node.name in self.settings.watched_after)
            ):
                points.append(PointPlan(node.name, [(index, "0") for index in seen]))
        return points


class _Instrumenter:
    """Inserts the statistics nodes and the dump ops a plan needs."""

    def __init__(self, graph: torch.fx.Graph, plan: GraphPlan, sink: int, planner: _Planner) -> None:
        self.graph, self.plan, self.sink = graph, plan, sink
        self.rows = planner.stat_rows
        self.graph_nodes, self.host_groups, self.tensor_nodes = planner.graph_nodes, planner.host_groups, planner.tensor_nodes
        self.size_sources = planner.size_sources

    def run(self) -> None:
        graph, plan = self.graph, self.plan
        before = set(graph.nodes)
        placeholders = list(graph.find_nodes(op="placeholder"))
        self.after_inputs = placeholders[-1].next if placeholders else next(iter(graph.nodes))
        if plan.golden is not None:
            self._insert_golden_inputs(placeholders)
        sizes = self._size_nodes()
        stats = self._insert_stats()
        with graph.inserting_before(graph.find_nodes(op="output")[0]):
            if not stats and not self.tensor_nodes:
                # an extern call with no tensor argument makes inductor (2.13) free a buffer
                # before its last use; an empty tensor, which no table covers, avoids that
                stats = [graph.call_function(aten.full.default, ([0], 0.0), {"dtype": torch.float64})]
            args: tuple[Any, ...] = (stats, list(self.tensor_nodes), self.sink)
            if sizes:
                args += ("", sizes)
            graph.call_function(DUMP_GRAPH, args)
        self._insert_points()
        graph_stats.propagate_fake_values(graph, [n for n in graph.nodes if n not in before and "val" not in n.meta])

    def _after(self, node: torch.fx.Node) -> torch.fx.Node:
        return self.after_inputs if node.op == "placeholder" else node.next

    def _insert_golden_inputs(self, placeholders: list[torch.fx.Node]) -> None:
        """``dump_point(tensor inputs, sink, -1, symbolic-int inputs)`` where the inputs are known."""
        tensors, sizes, kinds = [], [], []
        for node in placeholders:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                tensors.append(node)
                kinds.append("tensor")
            elif isinstance(value, (int, torch.SymInt)):
                sizes.append(node)
                kinds.append("size")
            else:
                kinds.append("none")
        self.plan.golden_inputs = tuple(kinds)
        args: tuple[Any, ...] = (tensors, self.sink, -1)
        if sizes:
            args += (sizes,)
        with self.graph.inserting_before(self.after_inputs):
            self.graph.call_function(DUMP_POINT, args)

    def _size_nodes(self) -> list[torch.fx.Node]:
        """The nodes ``dump_graph`` reads the plan's symbols from, in ``plan.sizes.symbols`` order:
        symbolic-int inputs as they are, other symbols read off a node's size or stride right after it."""
        nodes = []
        for node, kind, dim in self.size_sources:
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
        graph, rows = self.graph, self.rows
        before = set(graph.nodes)
        accumulators: list[tuple[torch.fx.Node, tuple[int, int]]] = []
        for node in self.graph_nodes:
            count = self.plan.numel[rows[node]] is None  # the host cannot work out its element count
            for index, accumulator in graph_stats.insert_stats(graph, node, self._after(node), count_valid=count):
                accumulators.append((accumulator, (rows[node], index)))
        host: list[tuple[torch.fx.Node, list[torch.fx.Node]]] = []
        for nodes in self.host_groups:
            with graph.inserting_before(self._after(nodes[-1])):
                host.append((graph.call_function(HOST_STATS, (nodes,)), nodes))
        graph_stats.propagate_fake_values(graph, [n for n in graph.nodes if n not in before])
        tables: dict[tuple[torch.device, torch.dtype], list[tuple[torch.fx.Node, tuple[int, int]]]] = {}
        for accumulator, entry in accumulators:
            value = accumulator.meta["val"]
            tables.setdefault((value.device, value.dtype), []).append((accumulator, entry))
        self.plan.tables = [StatTable(len(table), entries=tuple(entry for _, entry in table)) for table in tables.values()]
        stats = [accumulator for table in tables.values() for accumulator, _ in table]
        if host:  # CPU float64 vectors, the ACCUMULATORS of each value
            self.plan.tables.append(StatTable(len(host), rows=tuple(rows[n] for _, nodes in host for n in nodes)))
            stats += [result for result, _ in host]
        return stats

    def _insert_points(self) -> None:
        """``dump_point`` after each watcher point's node, fed its output (ordering) and the watched outputs."""
        nodes = {n.name: n for n in self.graph.nodes}
        positions = {n: i for i, n in enumerate(self.graph.nodes)}

        def first_output(name: str) -> torch.fx.Node:
            return next(holder for _, holder, _ in _output_nodes(nodes[name]) if holder is not None)

        for index, point in enumerate(self.plan.points):
            watched = [first_output(self.plan.calls[i].node) for i, _ in point.watched]
            node = nodes[point.after]
            outputs = [h for _, h, v in _output_nodes(node) if h is not None and isinstance(v, torch.Tensor)]
            own = [] if node.name == self.plan.calls[point.watched[0][0]].node else outputs[:1]
            last = max([node, *outputs], key=positions.__getitem__)
            with self.graph.inserting_after(last):
                self.graph.call_function(DUMP_POINT, (own + watched, self.sink, index))
