"""What a graph dump reads from one AOT graph: :func:`plan_graph` returns a :class:`Plan`.

Reads ``node.meta``: ``val`` (dtype, shape, device), ``nn_module_stack`` / ``fwd_nn_module_stack``,
``seq_nr``, ``partitioner_tag``, ``stack_trace`` and ``custom`` (``torchdebug.scope.data_dump()``
marks); changes nothing. It names and counts every op node as eager capture names its call, and says
which values get statistics in the graph and which on the host, which tensors and symbolic sizes are
handed over, and the points the scene asks for; the instrumenter (``_instrument.py``) inserts them.
Where each value's statistics are taken, and why: docs/architecture.md, "The graph dump"; what a
user sees: docs/graph_dump.md, "How values leave the compiled graph" and "Dynamic shapes".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from torchdebug._torch import symbolic
from torchdebug.graph_dump import _node_names as node_names
from torchdebug.graph_dump._accumulators import SAME_ELEMENTS
from torchdebug.graph_dump._instances import CompiledFrame
from torchdebug.graph_dump._plan import CallPlan, GraphPlan, Key, SlotPlan, SymbolicSizes
from torchdebug.graph_dump._settings import DumpSettings
from torchdebug.graph_dump._value_ids import ForwardValues, GraphValues
from torchdebug.native import fused_stats
from torchdebug.records import NEVER_MATERIALISED
from torchdebug.slots import dtype_name, iter_slots, json_value

aten = torch.ops.aten
log = logging.getLogger("torchdebug.graph_dump._planner")

HOST_GROUP = 8
"""CPU values handed to one ``host_stats`` call (fewer calls; values stay in memory a little longer)."""

SMALL = 65536
"""Values with fewer elements go to the host on the CPU even when inductor would fuse them: storing
them costs next to nothing, and the host's native pass is about twice as fast per element as
inductor's fused reductions here, with nothing to compile."""

UNKNOWN_SIZE = 8192
"""What a data-dependent (unbacked) size counts as in compile-time choices: it has no hint."""

_WAIT = "_c10d_functional.wait_tensor.default"


@dataclass
class ModelContext:
    """What the passes over the AOT graphs of one Dynamo graph share."""

    name: str
    rooted: bool | None = None
    forward_calls: dict[Any, tuple[Key, int]] = field(default_factory=dict)
    frame: str | None = None
    """The Dynamo frame the graph comes from (recompiles share it)."""
    code: CompiledFrame | None = None
    """That frame's code and the local holding its module (``_instances.compiled_frame``)."""
    forward: ForwardValues | None = None
    """The forward graph's values, by node name: its backward graph's inputs of those names hold
    them, and the nodes it recomputes make them again."""


def _numel(value: torch.Tensor) -> int:
    """The element count of a fake value; for a symbolic one, as traced (compile-time choices only)."""
    numel = value.numel()
    return numel if isinstance(numel, int) else symbolic.hint(numel, UNKNOWN_SIZE)


def _is_integral(value: torch.Tensor) -> bool:
    return not (value.is_floating_point() or value.is_complex())


_STORED_AROUND = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten.convolution_backward})
"""Ops inductor runs as extern kernels: their inputs and outputs are in memory in any case."""


def _host_stats(value: torch.Tensor) -> bool:
    """Whether the host can take this value's statistics: a CPU value, with the native kernel built
    (which values it takes: docs/architecture.md, "The graph dump")."""
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


RNG_STATE = frozenset({"philox_seed", "philox_offset", "rng_state"})
"""Schema names of the random-number state that attention kernels return and take back: bookkeeping,
not numerics. The efficient and cuDNN kernels keep their seed and offset on the host while the
graph's fake values say the device, so statistics computed in the graph would launch a device
kernel on host memory (a CUDA "invalid argument")."""


def _rng_state_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes holding an attention kernel's random-number state (:data:`RNG_STATE`): the ``getitem``
    of such an output, and whatever is passed back as such an argument (a backward graph's input)."""
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        indices = {index for index, value in enumerate(schema.returns) if value.name in RNG_STATE}
        found.update(user for user in node.users if getattr(user.target, "__name__", "") == "getitem" and user.args[1] in indices)
        for position, argument in enumerate(schema.arguments):
            if argument.name in RNG_STATE:
                value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
                if isinstance(value, torch.fx.Node):
                    found.add(value)
    return found


def first_writes(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    """Where each value a node writes in place is first written (its position in the graph), by the
    value's source (:meth:`_Planner._source`: a view is written with its base). In the graphs a
    backend gets, that is the ``copy_`` functionalisation puts before the output for an input the
    user's code mutates (``x.mul_(2)`` on the step's input, a buffer); a value read on the host or
    handed over later would be read as written, not as the ops before it saw it."""
    written: dict[torch.fx.Node, int] = {}
    for position, node in enumerate(graph.nodes):
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, torch.fx.Node):
                written.setdefault(_Planner._source(value), position)
    return written


def _waited(node: torch.fx.Node) -> torch.fx.Node:
    """The ``_c10d_functional.wait_tensor`` of ``node`` where the graph waits for it, else ``node``.
    A functional collective's output (tensor parallelism's all-reduce) holds the collective's result
    only once it is waited for: its statistics and tensor are read off the wait's output (the same
    elements, as eager capture records them), so they are taken after the wait, never mid-collective."""
    for user in node.users:
        if user.args and user.args[0] is node and str(user.target) == _WAIT:
            return user
    return node


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


SizeSource = tuple[torch.fx.Node, str | None, int]
"""Where the graph holds a symbol's value: ``(node, None, 0)``, the node is the symbolic int;
``(node, "size" or "stride", dim)``, that of the node's dimension ``dim``."""


@dataclass(frozen=True)
class Plan:
    """What the planner decided for one AOT graph: what the run time reads, and the nodes the
    instrumenter reads values from."""

    graph: GraphPlan
    """The run-time description (calls, slots, counts, points), registered with the capture."""
    stat_rows: dict[torch.fx.Node, int]
    """The node whose value fills each statistics row, with its row."""
    in_graph: list[torch.fx.Node]
    """Values whose statistics the graph computes (accumulator nodes), in row order."""
    host_groups: list[list[torch.fx.Node]]
    """Values the host takes, in groups per ``host_stats`` call, in graph order."""
    tensors: list[torch.fx.Node]
    """Values handed to ``dump_graph`` as tensors, in the order ``SlotPlan.tensor`` counts."""
    size_sources: list[SizeSource]
    """Per symbol of ``graph.sizes.symbols``, where the graph holds its value."""
    copied: frozenset[torch.fx.Node] = frozenset()
    """Of ``tensors``, those a later node writes in place (:func:`first_writes`): handed over as a
    copy taken right after them."""


def plan_graph(
    graph: torch.fx.Graph,
    settings: DumpSettings,
    model: ModelContext,
    aot_phase: str,
    golden: torch.fx.GraphModule | None = None,
) -> Plan:
    """The plan of one AOT graph (``forward``, ``backward`` or ``inference``) of Dynamo graph
    ``model``; ``golden``: the graph's copy for ``dump_stage="original"``."""
    return _Planner(settings, model, aot_phase, graph).plan(golden)


class _Planner:
    """Names every op node and describes the dumped ones (no graph edits)."""

    def __init__(self, settings: DumpSettings, model: ModelContext, aot_phase: str, graph: torch.fx.Graph) -> None:
        self.settings, self.scene, self.model, self.aot_phase, self.graph = settings, settings.scene, model, aot_phase, graph
        self.stat_rows: dict[torch.fx.Node, int] = {}
        self.tensor_index: dict[torch.fx.Node, int] = {}
        self.sizes = SymbolicSizes()
        self.rng_state = _rng_state_nodes(graph)
        self.values = GraphValues(graph, model.forward if aot_phase == "backward" else None)
        self.written = first_writes(graph)
        self.position = {node: index for index, node in enumerate(graph.nodes)}

    def plan(self, golden: torch.fx.GraphModule | None) -> Plan:
        selected = self.scene.selector(self.graph, self.model.name, self.settings.nodes)
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
                continue  # recomputed forward node: neither dumped nor counted, the forward graph dumped its value
            # Backward calls run in another order than eager's: renamed ones would pair wrongly.
            op = target if backward else replaced.get(node, target)
            key = ("backward" if backward else "forward", node_names.module_of(node, backward, bool(self.model.rooted)), op)
            local = counts.get(key, 0)
            counts[key] = local + 1
            seq_nr = node.meta.get("seq_nr")
            if not backward and seq_nr is not None:
                forward_calls.setdefault(seq_nr, (key, local))
            if selected(node):
                fwd = self.model.forward_calls.get(seq_nr) if backward else None
                call = CallPlan(node.name, key, local, order, node_names.source_of(node), fwd, target if op != target else None)
                call.slots = list(self._slots(node, golden is not None, values=op == target))
                calls.append(call)
            order += 1
        if self.aot_phase != "backward":
            self.model.forward_calls.update(forward_calls)
            self.model.forward = self.values.forward_values(self.graph)
        model = self.model
        plan = GraphPlan(
            model.name,
            self.aot_phase,
            calls,
            counts,
            order,
            values=self.values.count,
            inputs=tuple(self.values.inputs()),
            outputs=tuple(self.values.outputs(self.graph)),
            golden=golden,
            sizes=self.sizes,
            frame=model.frame,
            code=model.code,
        )
        plan.points = self.scene.points(self.graph, calls)
        in_graph, host_groups = self._split_rows(plan)
        size_sources = self._find_symbols(plan)
        tensors = sorted(self.tensor_index, key=self.tensor_index.__getitem__)
        copied = frozenset(node for node in tensors if self._written_later(node))
        return Plan(plan, self.stat_rows, in_graph, host_groups, tensors, size_sources, copied)

    def _written_later(self, node: torch.fx.Node) -> bool:
        """Whether a node after ``node`` writes its value in place (:func:`first_writes`)."""
        written = self.written.get(self._source(node))
        return written is not None and written > self.position[node]

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

    def _find_symbols(self, plan: GraphPlan) -> list[SizeSource]:
        """Which node gives each symbol the plan's expressions use: its placeholder where the graph has
        one (Dynamo and AOT autograd pass the symbols a graph uses as inputs), else the size or stride of
        the first node whose size or stride is that symbol; rows whose element count needs a symbol no
        node gives are counted in the graph instead."""
        wanted = self.sizes.free_symbols()
        if not wanted:
            return []
        sources: dict[Any, SizeSource] = {}
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
        return list(sources.values())

    def _split_rows(self, plan: GraphPlan) -> tuple[list[torch.fx.Node], list[list[torch.fx.Node]]]:
        """Who computes each statistics row: the host for CPU values stored in memory anyway, small
        ones and those computed in a loop over rows (their statistics in the graph would split the
        kernel), in groups of values in the order the graph computes them (``host_groups``); the
        graph for the others (``in_graph``), so that fused values stay fused. A group is read after
        its last value, so it ends before a node that writes one of its values in place
        (:func:`first_writes`)."""
        nodes = sorted(self.stat_rows, key=self.stat_rows.get)
        plan.integral = [_is_integral(n.meta["val"]) for n in nodes]
        plan.numel = [self._size(n.meta["val"].numel()) for n in nodes]
        cheap = {self._source(n) for n in _stored(self.graph) | _in_row_kernels(self.graph)}
        on_host = {n for n in nodes if (n in cheap or _small(n.meta["val"])) and _host_stats(n.meta["val"])}
        groups: list[list[torch.fx.Node]] = []
        group: list[torch.fx.Node] = []
        written = len(self.position)  # where the group's first value written in place is written
        for node in sorted(on_host, key=self.position.__getitem__):
            if len(group) == HOST_GROUP or self.position[node] >= written:
                groups.append(group)
                group, written = [], len(self.position)
            group.append(node)
            written = min(written, self.written.get(node, written))
        if group:
            groups.append(group)
        return [n for n in nodes if n not in on_host], groups

    def _slots(self, node: torch.fx.Node, golden: bool, values: bool = True) -> Iterator[SlotPlan]:
        """``values``: also the non-tensor arguments (not for a node named after the op it replaced:
        its arguments are the stand-in's, ``permute`` dims for ``transpose``'s)."""
        mode = self.settings.data_mode
        if mode in ("all", "input") and self.scene.inputs:
            holders: dict[int, torch.fx.Node] = {}

            def fake(arg: torch.fx.Node) -> Any:
                value = arg.meta.get("val")
                holders[id(value)] = arg
                return value

            args, kwargs = _plain_lists(torch.fx.node.map_arg((node.args, node.kwargs), fake))
            for arg, value in iter_slots(args, kwargs):
                if isinstance(value, torch.Tensor):
                    holder = holders.get(id(value))
                    slot = self._slot("input", arg, holder, value, golden)
                    slot.held = self.values.read(node, holder)
                    yield slot
                elif values:
                    yield self._slot("input", arg, None, value, golden)
        if mode in ("all", "output"):
            for arg, holder, value in node_names.output_nodes(node):
                slot = self._slot("output", arg, holder, value, golden)
                if isinstance(value, torch.Tensor):
                    slot.held = self.values.made(node, int(arg))
                    if holder is None:
                        slot.unread = NEVER_MATERIALISED
                yield slot

    def _slot(self, io: str, arg: str, holder: torch.fx.Node | None, value: Any, golden: bool) -> SlotPlan:
        if not isinstance(value, torch.Tensor):
            return SlotPlan(io, arg, kind="value", value=self._value(value))
        slot = SlotPlan(io, arg, meta=self._meta(value))
        if holder is None or golden:
            slot.source_node = _waited(holder).name if holder is not None else None
            return slot
        if holder in self.rng_state:
            slot.note = "an attention kernel's random-number state: not read"
            return slot
        if self.scene.statistics:
            slot.stat = self._stat_row(holder)
        if self.settings.task == "tensor" and self.scene.tensors:
            slot.tensor = self.tensor_index.setdefault(_waited(holder), len(self.tensor_index))
        return slot

    def _stat_row(self, node: torch.fx.Node) -> int:
        return self.stat_rows.setdefault(_waited(self._source(node)), len(self.stat_rows))

    @staticmethod
    def _source(node: torch.fx.Node) -> torch.fx.Node:
        """The node whose value holds the same elements as ``node`` (through views and clones)."""
        source = node
        while (
            source.op == "call_function"
            and getattr(source.target, "overloadpacket", None) in SAME_ELEMENTS
            and isinstance(source.args[0], torch.fx.Node)
            and isinstance(source.args[0].meta.get("val"), torch.Tensor)
            and source.args[0].meta["val"].numel() == source.meta["val"].numel()
            and source.args[0].meta["val"].dtype == source.meta["val"].dtype
        ):
            source = source.args[0]
        return source
