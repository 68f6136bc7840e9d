"""Value ids of one graph's slots, read off the FX graph's data flow: exact, as eager capture's are.

Every node holding a tensor is a value with an id local to the graph; its users' input slots name
it. A view (an op whose schema returns an alias of an argument it does not write: ``view``, ``t``,
``detach``) gets an id of its own and names the memory it shares (``view_of``); an op that writes an
argument (functionalization's ``copy_`` back into a graph input, any ``Tensor(a!)``) keeps the
written value's id and moves the memory's version by one. Versions count from 0 where a value
enters the graph. A backward graph's inputs that its forward graph saved are that graph's values
(the partitioner names them as the forward nodes they are), and so are the forward nodes it
recomputes there: a node of the forward's name, op and non-tensor arguments reading the values the
forward node read makes the value the forward node made. At run time the capture adds each run's
base, so ids are unique within the rank's dump (docs/format.md, ``value_id``), and gives a graph
input that another graph of the step handed over that graph's id (``graph_dump/_handover.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from torchdebug.graph_dump._node_names import output_nodes

Local = tuple[int, bool]
"""An id local to a graph: its index, and whether it indexes the forward graph's values (a backward
input the forward saved) rather than this graph's."""


@dataclass(frozen=True, slots=True)
class SlotValue:
    """What a slot holds: ``value_id``, ``version`` and ``view_of`` local to a graph."""

    value_id: Local
    version: int
    view_of: Local | None


Saved = dict[str, SlotValue]
"""A forward graph's values by node name, as they leave it (what its backward graph may read)."""


@dataclass(frozen=True, slots=True)
class ForwardCall:
    """A forward node as a backward graph could recompute it: its op, its arguments (the values it
    read, as ``saved`` ids) and the values it made (per output, ``saved`` ids)."""

    target: Any
    arguments: Any
    made: tuple[SlotValue | None, ...]


@dataclass(slots=True)
class ForwardValues:
    """What a backward graph knows of its forward graph's values."""

    saved: Saved
    """The values of the forward graph's outputs as they leave it, by node name."""
    calls: dict[str, ForwardCall]
    """The forward graph's op nodes by name (what a recomputation in the backward repeats)."""


class GraphValues:
    """The values of one graph's nodes, walked once in graph order: :meth:`read` and :meth:`made`
    give a dumped call's input and output slots; ``forward``: for a backward graph, its forward
    graph's values (those its inputs of the same names hold, and the nodes it recomputes)."""

    def __init__(self, graph: torch.fx.Graph, forward: ForwardValues | None = None) -> None:
        self.count = 0
        """Local ids given (the run's base moves by as many)."""
        self._inputs: list[tuple[int, torch.fx.Node]] = []  # inputs holding a value of their own
        self._held: dict[torch.fx.Node, SlotValue] = {}  # a node's value as first made
        self._versions: dict[Local, int] = {}  # per memory: its version now
        self._reads: dict[tuple[torch.fx.Node, torch.fx.Node], SlotValue] = {}
        self._made: dict[tuple[torch.fx.Node, int], SlotValue] = {}
        self._forward = forward
        for position, node in enumerate(graph.find_nodes(op="placeholder")):
            self._enter(node, position, None if forward is None else forward.saved.get(node.name))
        for node in graph.nodes:
            if node.op == "call_function" and node not in self._held:
                self._call(node)

    def read(self, node: torch.fx.Node, holder: torch.fx.Node | None) -> SlotValue | None:
        """The value ``node`` reads from ``holder`` (before ``node`` writes it)."""
        return None if holder is None else self._reads.get((node, holder))

    def made(self, node: torch.fx.Node, index: int) -> SlotValue | None:
        """The value of ``node``'s output ``index`` (after ``node`` wrote it, for a written argument)."""
        return self._made.get((node, index))

    def inputs(self) -> list[tuple[int, int, SlotValue]]:
        """``(position among the graph's inputs, local index, value as it leaves)`` of each input
        holding a value of its own (not one the forward saved): another graph may have handed it
        over, and a later one may read it again."""
        return [(position, self._held[node].value_id[0], self._now(node)) for position, node in self._inputs]

    def outputs(self, graph: torch.fx.Graph) -> list[tuple[int, SlotValue]]:
        """``(position among the graph's outputs, value as it leaves)`` of each output holding one."""
        returned = graph.find_nodes(op="output")[0].args[0]
        items = returned if isinstance(returned, (list, tuple)) else [returned]
        return [(i, self._now(node)) for i, node in enumerate(items) if isinstance(node, torch.fx.Node) and node in self._held]

    def forward_values(self, graph: torch.fx.Graph) -> ForwardValues:
        """This (forward) graph's values as its backward graph sees them (``saved`` ids)."""
        leaving: list[torch.fx.Node] = []
        torch.fx.node.map_arg(graph.find_nodes(op="output")[0].args, leaving.append)
        saved = {node.name: _as_saved(self._now(node)) for node in leaving if node in self._held}
        calls = {}
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            made = tuple(self._made.get((node, i)) for i in range(len(list(output_nodes(node)))))
            calls[node.name] = ForwardCall(
                node.target, _as_saved(self._arguments(node)), tuple(None if m is None else _as_saved(m) for m in made)
            )
        return ForwardValues(saved, calls)

    # -- the walk ----------------------------------------------------------------------------------
    def _enter(self, node: torch.fx.Node, position: int, saved: SlotValue | None) -> None:
        if not isinstance(node.meta.get("val"), torch.Tensor):
            return
        if saved is None:
            saved = self._new()
            self._inputs.append((position, node))
        self._held[node] = saved
        self._versions[_memory(saved)] = saved.version

    def _arguments(self, node: torch.fx.Node) -> Any:
        """``node``'s arguments with each node holding a value replaced by the value ``node`` read
        (other nodes by their names)."""
        reads = self._reads
        return _frozen((node.args, node.kwargs), lambda a: reads.get((node, a), a.name) if isinstance(a, torch.fx.Node) else a)

    def _recomputed(self, node: torch.fx.Node, schema: Any) -> ForwardCall | None:
        """The forward node ``node`` repeats: the same name, op and arguments, the same values read,
        and no argument written (a backward graph only)."""
        twin = None if self._forward is None else self._forward.calls.get(node.name)
        if twin is None or twin.target != node.target or any(a.alias_info and a.alias_info.is_write for a in schema.arguments):
            return None
        return twin if twin.arguments == self._arguments(node) else None

    def _call(self, node: torch.fx.Node) -> None:
        for arg in node.all_input_nodes:
            if arg in self._held:
                self._reads[(node, arg)] = self._now(arg)
        schema = getattr(node.target, "_schema", None)
        twin = self._recomputed(node, schema) if schema is not None else None
        for index, (_, holder, value) in enumerate(output_nodes(node)):
            if not isinstance(value, torch.Tensor):
                continue
            written, viewed = _aliased_argument(node, schema, index)
            again = twin.made[index] if twin is not None and index < len(twin.made) else None
            if again is not None:  # the forward's value, made again
                made = again
                self._versions.setdefault(_memory(made), made.version)
            elif written is not None and written in self._held:
                memory = _memory(self._held[written])
                self._versions[memory] = self._versions.get(memory, 0) + 1
                made = self._now(written)
            elif viewed is not None and viewed in self._held:
                memory = _memory(self._held[viewed])
                made = SlotValue((self.count, False), self._versions.get(memory, 0), memory)
                self.count += 1
            else:
                made = self._new()
            self._made[(node, index)] = made
            if holder is not None:
                self._held.setdefault(holder, made)

    def _new(self) -> SlotValue:
        value = SlotValue((self.count, False), 0, None)
        self.count += 1
        return value

    def _now(self, node: torch.fx.Node) -> SlotValue:
        """``node``'s value at its memory's version now."""
        held = self._held[node]
        version = self._versions.get(_memory(held), 0)
        return held if version == held.version else SlotValue(held.value_id, version, held.view_of)


def _frozen(value: Any, leaf: Callable[[Any], Any] = lambda item: item) -> Any:
    """FX's argument lists as tuples (to compare the arguments of two graphs), ``leaf`` applied to
    everything else."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item, leaf) for item in value)
    if isinstance(value, dict):
        return {key: _frozen(item, leaf) for key, item in value.items()}
    return leaf(value)


def _as_saved(value: Any) -> Any:
    """``value`` (a :class:`SlotValue`, or frozen arguments holding some) with its ids as ``saved`` ones."""
    if isinstance(value, SlotValue):
        view_of = None if value.view_of is None else (value.view_of[0], True)
        return SlotValue((value.value_id[0], True), value.version, view_of)
    return _frozen(value, _as_saved) if isinstance(value, (list, tuple, dict)) else value


def _memory(value: SlotValue) -> Local:
    """The id of the value whose memory ``value`` holds (its own, or the one it is a view of)."""
    return value.value_id if value.view_of is None else value.view_of


def _aliased_argument(node: torch.fx.Node, schema: Any, index: int) -> tuple[torch.fx.Node | None, torch.fx.Node | None]:
    """The argument node output ``index`` of ``node`` aliases, as ``(written, viewed)``: an argument
    the op writes and returns, or one it returns a view of (by the schema's alias sets)."""
    if schema is None or index >= len(schema.returns):
        return None, None
    alias = schema.returns[index].alias_info
    if alias is None:
        return None, None
    for position, argument in enumerate(schema.arguments):
        info = argument.alias_info
        if info is None or not (set(info.before_set) & set(alias.before_set)):
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        if isinstance(value, torch.fx.Node):
            return (value, None) if info.is_write else (None, value)
    return None, None
