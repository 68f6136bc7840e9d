"""What an instrumented graph will report, decided at compile time and read at every run.

The planner (``torchdebug.graph_dump._planner``) describes each dumped node call and slot once;
:class:`torchdebug.graph_dump._capture.GraphCapture` turns a run's statistics rows and tensors into
records with these descriptions, adding only what changes per run (step, call index, seq).

A graph compiled with dynamic shapes describes sizes by expressions of its symbols (``2*s27``).
Those stand in the plan as :class:`SymbolicSize` (an index into :attr:`GraphPlan.sizes`); the graph
hands the symbols' values to ``dump_graph`` at every run (host ints, no device read), and the
records get the sizes that ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.fx

from torchdebug.stats import COLUMNS

if TYPE_CHECKING:
    from torchdebug.graph_dump._instances import CompiledFrame
    from torchdebug.graph_dump._value_ids import SlotValue

Key = tuple[str, str, str]
"""``(phase, module, op)``: what call indices are counted per, as in eager capture."""

Rows = Sequence[dict[str, Any] | None]
"""A run's statistics (``torchdebug.stats`` keys) by statistics row (``SlotPlan.stat``)."""

ACCUMULATORS = (*COLUMNS, "valid")
"""What the graph computes for a value whose statistics it takes (each a 0-d tensor): the columns of
the sums vector (``torchdebug.stats._schema``, which ``stats_from_sums`` turns into statistics on the
host), then the count of non-NaN values, computed only when the value's size is symbolic and a
symbol it depends on cannot be handed to the host (never seen so far). ``host_stats`` hands over all
of them for each value."""


@dataclass(frozen=True, slots=True)
class SymbolicSize:
    """A size, stride, element count or argument that is an expression of the graph's symbolic sizes."""

    index: int
    """Index into :attr:`SymbolicSizes.expressions`."""


@dataclass(slots=True)
class SymbolicSizes:
    """The symbolic expressions a plan's slots use, and the symbols the graph hands over to evaluate them."""

    symbols: tuple[Any, ...] = ()
    """The sympy symbols whose values ``dump_graph`` receives (its ``sizes`` argument), in that order."""
    expressions: list[Any] = field(default_factory=list)
    """Distinct sympy expressions, each referred to by a :class:`SymbolicSize`."""
    _index: dict[Any, int] = field(default_factory=dict, init=False, repr=False)

    def add(self, expression: Any) -> SymbolicSize:
        """The :class:`SymbolicSize` of ``expression`` (equal expressions share one)."""
        index = self._index.get(expression)
        if index is None:
            index = self._index[expression] = len(self.expressions)
            self.expressions.append(expression)
        return SymbolicSize(index)

    def free_symbols(self) -> set[Any]:
        found: set[Any] = set()
        for expression in self.expressions:
            found |= expression.free_symbols
        return found


def resolve(value: Any, evaluated: list[Any]) -> Any:
    """``value`` (a size list, an argument) with each :class:`SymbolicSize` replaced by its value in
    ``evaluated`` (``GraphPlan.sizes.expressions`` evaluated for one run); lists are copied only
    when they hold one."""
    if value.__class__ is SymbolicSize:
        return evaluated[value.index]
    if value.__class__ is list and any(item.__class__ is SymbolicSize or item.__class__ is list for item in value):
        return [resolve(item, evaluated) for item in value]
    return value


@dataclass(frozen=True, slots=True)
class CallSource:
    """Where a node came from in user code."""

    source: str
    """Innermost user frame, ``file:line in function``."""
    stack_id: str
    frames: tuple[str, ...]
    """User frames, outermost first, formatted as eager stacks are."""


@dataclass(slots=True)
class SlotPlan:
    """One input or output slot of a dumped call."""

    io: str
    arg: str
    kind: str = "tensor"
    meta: dict[str, Any] | None = None
    """``dtype``, ``shape``, ``stride``, ``device`` from the node's fake value (symbolic sizes as
    :class:`SymbolicSize`)."""
    value: Any = None
    """A non-tensor argument's JSON value (symbolic ints and floats, in lists too, as :class:`SymbolicSize`)."""
    stat: int | None = None
    """Statistics row of this slot's value; slots holding the same elements share a row."""
    tensor: int | None = None
    """Index of this slot's tensor in the tensors the graph hands over (tensor dumps)."""
    source_node: str | None = None
    """The node whose value fills the slot (``dump_stage="original"`` reads values by node)."""
    note: str | None = None
    """Why the slot is not read (an attention kernel's random-number state), written as ``capture_error``."""
    unread: str | None = None
    """Why the slot holds no value of the run (:data:`~torchdebug.records.NEVER_MATERIALISED`: an
    output of a multi-output op the graph never uses), written as ``extra.unread``."""
    held: SlotValue | None = None
    """Which value the slot holds, by ids local to the graph (``graph_dump._value_ids``): each run
    adds its base to make the record's ``value_id``, ``version`` and ``view_of``."""


@dataclass(slots=True)
class CallPlan:
    """One dumped node: its eager-style identity and its slots."""

    node: str
    key: Key
    local: int
    """Index of this call among the graph's calls with the same key, in graph order."""
    order: int
    """Position among the graph's op calls (for ``seq``)."""
    source: CallSource | None
    fwd: tuple[Key, int] | None
    """For backward nodes: the forward call (key, local index in the forward graph)."""
    target: str | None = None
    """The node's own op when the call is named after the op it replaced (``key`` holds that one)."""
    slots: list[SlotPlan] = field(default_factory=list)


@dataclass(slots=True)
class PointPlan:
    """A watcher point: after node ``after`` ran, the outputs of the watched calls."""

    after: str
    watched: list[tuple[int, str]]
    """``(index into GraphPlan.calls, output arg)`` for each tensor handed over at this point."""


@dataclass(frozen=True, slots=True)
class StatTable:
    """Consecutive tensors of ``dump_graph``'s ``stats`` list that reach the host as one vector:
    all on one device, of one dtype, so the host reads them with one copy (at the next flush on an
    accelerator). Either 0-d accumulators (``entries``) or ``host_stats`` results (``rows``)."""

    count: int
    """How many tensors of the list."""
    entries: tuple[tuple[int, int], ...] = ()
    """Per accumulator: ``(row, index into ACCUMULATORS)``."""
    rows: tuple[int, ...] = ()
    """Per row taken by ``host_stats``: its ``ACCUMULATORS``, one after the other."""


@dataclass(slots=True)
class GraphPlan:
    """Everything one instrumented graph reports."""

    model: str
    """``model__N``: the N-th graph the backend compiled."""
    phase: str
    """``forward``, ``backward`` or ``inference`` (the AOT graph kind)."""
    calls: list[CallPlan]
    counts: dict[Key, int]
    """Op calls per key in the whole graph (dumped or not), to keep call indices in step with eager."""
    n_ops: int
    values: int = 0
    """Value ids local to the graph (a run's base moves by as many)."""
    inputs: tuple[tuple[int, int, SlotValue], ...] = ()
    """``(position among the graph's inputs, local index, local value as it leaves)`` of each
    tensor input holding a value of its own: one another graph of the step handed over holds that
    graph's id instead, and a later graph reading it again holds this one's."""
    outputs: tuple[tuple[int, SlotValue], ...] = ()
    """``(position among the graph's outputs, local value as it leaves)`` of each tensor output:
    what a later graph reading it holds."""
    points: list[PointPlan] = field(default_factory=list)
    integral: list[bool] = field(default_factory=list)
    """Per statistics row: the value has an integer or bool dtype (min and max are ints)."""
    numel: list[int | SymbolicSize | None] = field(default_factory=list)
    """Per statistics row: the value's element count (``None`` when the host cannot work it out:
    the graph counts the values, ``ACCUMULATORS``' ``valid``)."""
    sizes: SymbolicSizes = field(default_factory=SymbolicSizes)
    """The symbolic expressions of the slots and element counts (none for a graph with static shapes)."""
    golden_inputs: tuple[str, ...] = ()
    """``dump_stage="original"``: per graph input, ``tensor``, ``written`` (a tensor the graph writes
    in place: the interpreter gets a copy, so the compiled graph, which runs after it, reads the
    input unwritten) or ``size`` (a symbolic int), the order in which the interpreter gets the
    values ``dump_point(..., -1)`` hands over."""
    tables: list[StatTable] = field(default_factory=list)
    """How ``dump_graph``'s ``stats`` list is cut into host vectors, in list order."""
    frame: str | None = None
    """The Dynamo frame (code object) the graph was compiled from; its recompiles (another input
    size, another dtype) share it, so their runs count steps together."""
    code: CompiledFrame | None = None
    """Where that frame is found on the stack while the graph runs, and which of its locals is the
    module instance that runs it (``graph_dump/_instances.py``)."""
    golden: torch.fx.GraphModule | None = None
    """``dump_stage="original"``: the graph before the backend's passes, interpreted on the real inputs."""
