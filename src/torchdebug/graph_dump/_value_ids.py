"""Value ids of one graph's slots, read off the FX graph's data flow: exact, as eager capture's are.

Every node holding a tensor is a value with an id local to the graph; its users' input slots name
it. A view (an op whose schema returns an alias of an argument it does not write: ``view``, ``t``,
``detach``) gets an id of its own and names the memory it shares (``view_of``); an op that writes an
argument (functionalization's ``copy_`` back into a graph input, any ``Tensor(a!)``) keeps the
written value's id and moves the memory's version by one. Versions count from 0 where a value
enters the graph. A backward graph's inputs that its forward graph saved are that graph's values
(the partitioner names them as the forward nodes they are). At run time the capture adds each
run's base, so ids are unique within the rank's dump (docs/format.md, ``value_id``).
"""

from __future__ import annotations

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


class GraphValues:
    """The values of one graph's nodes, walked once in graph order: :meth:`read` and :meth:`made`
    give a dumped call's input and output slots; ``saved``: the forward graph's values that a
    backward graph's inputs of the same names hold."""

    def __init__(self, graph: torch.fx.Graph, saved: Saved | None = None) -> None:
        self.count = 0
        """Local ids given (the run's base moves by as many)."""
        self._held: dict[torch.fx.Node, SlotValue] = {}  # a node's value as first made
        self._versions: dict[Local, int] = {}  # per memory: its version now
        self._reads: dict[tuple[torch.fx.Node, torch.fx.Node], SlotValue] = {}
        self._made: dict[tuple[torch.fx.Node, int], SlotValue] = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                self._enter(node, (saved or {}).get(node.name))
            elif node.op == "call_function" and node not in self._held:
                self._call(node)

    def read(self, node: torch.fx.Node, holder: torch.fx.Node | None) -> SlotValue | None:
        """The value ``node`` reads from ``holder`` (before ``node`` writes it)."""
        return None if holder is None else self._reads.get((node, holder))

    def made(self, node: torch.fx.Node, index: int) -> SlotValue | None:
        """The value of ``node``'s output ``index`` (after ``node`` wrote it, for a written argument)."""
        return self._made.get((node, index))

    def leaving(self, nodes: list[torch.fx.Node]) -> Saved:
        """The values of ``nodes`` (a forward graph's outputs) as they leave the graph, as the
        backward graph sees them (``saved`` ids)."""
        found = {}
        for node in nodes:
            if node in self._held:
                value = self._now(node)
                view_of = None if value.view_of is None else (value.view_of[0], True)
                found[node.name] = SlotValue((value.value_id[0], True), value.version, view_of)
        return found

    # -- the walk ----------------------------------------------------------------------------------
    def _enter(self, node: torch.fx.Node, saved: SlotValue | None) -> None:
        if not isinstance(node.meta.get("val"), torch.Tensor):
            return
        held = self._held[node] = self._new() if saved is None else saved
        self._versions[_memory(held)] = held.version

    def _call(self, node: torch.fx.Node) -> None:
        for arg in node.all_input_nodes:
            if arg in self._held:
                self._reads[(node, arg)] = self._now(arg)
        schema = getattr(node.target, "_schema", None)
        for index, (_, holder, value) in enumerate(output_nodes(node)):
            if not isinstance(value, torch.Tensor):
                continue
            written, viewed = _aliased_argument(node, schema, index)
            if written is not None and written in self._held:
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
