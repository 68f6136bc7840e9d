"""The last K steps of watched statistics, on the host: one row of statistics per watched slot per step.

A *slot* is one watched tensor position (a module's ``output.0``, a parameter's gradient), named as
a module-level dump names it (:func:`torchdebug.records.make_name`), indexed in the order first seen
for the whole run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from torchdebug.capture.modules import ROOT_MODULE
from torchdebug.records import LOSS_OP, LOSS_SCALE_OP, MODULE_OP, make_name
from torchdebug.stats import FIRST_COUNT, STAT_KEYS, WIDTH, stats_array_from_sums

_STAGES = {"forward": 0, "backward": 2, "optimizer": 3}

_MEAN = STAT_KEYS.index("mean")

_ROW_BYTES = WIDTH * 8
"""Bytes of one slot's sums (float64)."""


@dataclass(slots=True)
class Slot:
    """One watched tensor position; ``dtype`` and ``shape`` are those last seen."""

    phase: str
    module: str
    call: int
    io: str
    arg: str
    op: str = MODULE_OP
    dtype: str = ""
    shape: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return make_name(self.phase, self.module, self.op, self.call, self.io, self.arg)


class Ring:
    """Statistics of the last ``window`` steps per slot (NaN where a slot was not seen that step).

    A step's row is written as the sums every statistics path produces (``schema.COLUMNS``) and the
    element counts: on the CPU the native kernel writes them straight into the ring's memory
    (:meth:`addresses`), with no Python object per tensor; rows from a device table arrive with
    :meth:`put_sums`. :meth:`row` finishes a step into statistics (``schema.STAT_KEYS``) in one
    vectorised call when it was written since it was last read.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self.slots: list[Slot] = []
        self._index: dict[tuple[str, str, str, int, str, str], int] = {}
        self.sums = np.full((window, 64, WIDTH), math.nan)
        self.numel = np.zeros((window, 64))
        self._values = np.full((window, 64, len(STAT_KEYS)), math.nan)
        """The finished statistics of each position, as of its last :meth:`row`."""
        self._base = self.sums.ctypes.data
        """The address of :attr:`sums` (numpy's ``ctypes`` attribute builds an object at each read)."""
        self._numel_base = self.numel.ctypes.data
        """The address of :attr:`numel`."""
        self._numel_items = memoryview(self.numel).cast("B").cast("d")
        """:attr:`numel` flat, ``position × capacity + slot``: a store costs a third of numpy's."""
        self._capacity = self.sums.shape[1]
        """Slots a position holds (numpy's ``shape`` builds a tuple at each read)."""
        self._stale = [False] * window
        """Positions written since their statistics were last finished."""
        self._order: list[int] = []
        self._position: dict[int, int] = {}
        """Each slot's place in :attr:`_order`."""
        self.steps = [-1] * window
        """The step each position holds (-1: none)."""
        self._held: dict[int, int] = {}
        """The position of each step held: steps take the positions in turn, whatever their numbers."""
        self._begun = 0
        """Steps begun (less those forgotten as they ran): the next step's turn."""
        self._gradients: list[int] = []
        """The gradient slots, which a loss scale divides."""
        self._scale: int | None = None
        """The loss scale's slot, once seen."""

    def slot(self, phase: str, module: str, op: str, call: int, io: str, arg: str) -> int:
        """The index of a slot, registered on first sight."""
        key = (phase, module, op, call, io, arg)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.slots)
            self.slots.append(Slot(phase, module, call, io, arg, op))
            if io == "parameter_grad":
                self._gradients.append(index)
            elif op == LOSS_SCALE_OP:
                self._scale = index
            if index >= self._capacity:
                self.sums, self.numel, self._values = (_doubled(a) for a in (self.sums, self.numel, self._values))
                self._base, self._numel_base = self.sums.ctypes.data, self.numel.ctypes.data
                self._numel_items = memoryview(self.numel).cast("B").cast("d")
                self._capacity = self.sums.shape[1]
        return index

    def stage(self, index: int | None) -> int:
        """Where in a step slot ``index`` is seen: 0 forward outputs, 1 the loss, 2 gradients, 3
        parameters after the update (4: no slot)."""
        if index is None:
            return 4
        slot = self.slots[index]
        return 1 if slot.op == LOSS_OP else _STAGES.get(slot.phase, 4)

    def place(self, index: int | None) -> tuple[int, int]:
        """Where in a step slot ``index`` is first seen, comparable across ranks that run the same
        model: its :meth:`stage`, then its place in :meth:`execution_order`."""
        if index is None:
            return (self.stage(index), -1)
        self.execution_order()
        return (self.stage(index), self._position[index])

    def execution_order(self) -> list[int]:
        """Slot indices in the order a step runs them: forward outputs (innermost module first), the
        loss, gradients, parameters after the update. The backward runs the forward in reverse, so a
        parameter's gradient is placed by its module's output, or by its nearest watched ancestor's
        (a compiled block's: the modules inside are not watched), the modules whose parameters were
        registered later first within one (a module's own parameters as registered); a parameter of
        the model's own, whose use no output places, last (as an embedding table, used first)."""
        if len(self._order) != len(self.slots):
            outputs: dict[str, int] = {}
            gradients: dict[str, int] = {}
            for index, slot in enumerate(self.slots):
                if slot.phase == "forward" and slot.op == MODULE_OP:
                    outputs.setdefault(slot.module, index)
                elif slot.io == "parameter_grad":
                    gradients.setdefault(slot.module, index)
            key = functools.partial(self._within_stage, outputs=outputs, gradients=gradients)
            self._order = sorted(range(len(self.slots)), key=lambda i: (self.stage(i), key(i)))
            self._position = {index: place for place, index in enumerate(self._order)}
        return self._order

    def _within_stage(self, index: int, outputs: dict[str, int], gradients: dict[str, int]) -> tuple[int, int, int]:
        """A slot's order within its stage: as registered, except gradients (see the module
        docstring); ``outputs``, ``gradients``: the first output and gradient slot of each module."""
        slot = self.slots[index]
        if slot.op == LOSS_SCALE_OP:
            return (2, 0, index)
        if slot.io != "parameter_grad":
            return (0, 0, index)
        module, placed = slot.module, 1  # no watched module places it: last
        while module and module != ROOT_MODULE:
            if module in outputs:
                placed = -outputs[module]
                break
            module = module.rpartition(".")[0]
        return (placed, -gradients[slot.module], index)

    def begin(self, step: int) -> None:
        """Make ``step`` the newest step, in the place of the oldest (numbers may skip: a loop's
        step count may jump, and the window still keeps the last ``window`` steps)."""
        position = self._begun % self.window
        self._begun += 1
        self._held.pop(self.steps[position], None)
        self._held[step] = position
        self.steps[position] = step
        self.sums[position] = math.nan
        self.numel[position] = 0
        self._stale[position] = True

    def forget(self, step: int) -> None:
        """Drop ``step`` from the window (a step renumbered as it ran: the newest, whose place the
        next step takes)."""
        position = self._held.pop(step, None)
        if position is not None:
            self.steps[position] = -1
            if position == (self._begun - 1) % self.window:
                self._begun -= 1

    def addresses(self, step: int, indices: list[int], numels: list[int]) -> list[int] | None:
        """Where the sums of each slot of ``indices`` at ``step`` go (``WIDTH`` float64 each, for the
        native kernel to write), the element counts ``numels`` noted in one call; ``None`` once the
        step has left the window. A slot added later may move them (:meth:`slot` grows the ring)."""
        rows = self.rows(step)
        if rows is None:
            return None
        start, position = rows[0], self._held[step]
        if len(indices) == 1:  # numpy's scalar store, not its fancy indexing (20x the time)
            self.numel[position, indices[0]] = numels[0]
        else:
            self.numel[position, indices] = numels
        return [start + index * _ROW_BYTES for index in indices]

    def address(self, step: int, index: int, numel: int) -> int | None:
        """:meth:`addresses` of one slot (a module's one output), with no list."""
        position = self._held.get(step)
        if position is None:
            return None
        self._stale[position] = True
        self._numel_items[position * self._capacity + index] = numel
        return self._base + (position * self._capacity + index) * _ROW_BYTES

    def rows(self, step: int) -> tuple[int, int] | None:
        """The addresses of slot 0's sums (``WIDTH`` float64) and element count (one float64) at
        ``step``, slot ``i``'s ``i`` rows on, for native code that writes both (``None`` once the
        step has left the window); valid until a slot is added (:meth:`slot` may move them). Asked at
        each module output, so it calls nothing."""
        position = self._held.get(step)
        if position is None:
            return None
        self._stale[position] = True
        first = position * self._capacity
        return self._base + first * _ROW_BYTES, self._numel_base + first * 8

    def put_sums(self, step: int, index: int, sums: list[float], numel: int) -> None:
        """The sums of ``numel`` elements of slot ``index`` at ``step`` (ignored once the step has left the window)."""
        position = self._held.get(step)
        if position is not None:
            self.sums[position, index] = sums
            self.numel[position, index] = numel
            self._stale[position] = True

    def copy(self, step: int, source: int, index: int) -> None:
        """Slot ``index`` at ``step`` holds what slot ``source`` holds (the same tensor)."""
        position = self._held.get(step)
        if position is not None:
            self.sums[position, index] = self.sums[position, source]
            self.numel[position, index] = self.numel[position, source]
            self._stale[position] = True

    def row(self, step: int) -> np.ndarray | None:
        """``slots × STAT_KEYS`` of ``step``, or ``None`` once it has left the window."""
        position = self._held.get(step)
        if position is None:
            return None
        count = len(self.slots)
        if self._stale[position]:
            values = stats_array_from_sums(self.sums[position, :count], self.numel[position, :count])
            self._unscale(values)
            self._values[position, :count] = values
            self._stale[position] = False
        return self._values[position, :count]

    def _unscale(self, values: np.ndarray) -> None:
        """Divide the gradients' value statistics (min, max, mean, norm) of one step's ``values`` by
        the loss scale staged with them, when the step has one: under a loss scaler the gradients
        are watched as the backward leaves them, and the scale's own slot (``monitor.loss_scale``,
        the last of the gradients' stage) is staged with them, so neither host nor device waits."""
        if self._scale is not None:
            scale = values[self._scale, _MEAN]
            if scale > 0:  # NaN: no scaled gradients this step
                values[self._gradients, :FIRST_COUNT] /= scale

    def kept_steps(self) -> list[int]:
        """The steps in the window, oldest first."""
        return sorted(self._held)

    def memory_bytes(self) -> int:
        """``window × slots × (2 × 8 + 1)`` float64 (the sums, the finished statistics, the element
        count: 4.3 MiB for 32 steps of 1,000 slots), grown by doubling as slots appear."""
        return self.sums.nbytes + self.numel.nbytes + self._values.nbytes


def _doubled(array: np.ndarray) -> np.ndarray:
    """``array`` with twice the slots (its second axis), the new ones NaN (no sums, no statistics)
    or 0 (no elements)."""
    grown = np.full((array.shape[0], 2 * array.shape[1], *array.shape[2:]), math.nan if array.ndim == 3 else 0.0)
    grown[:, : array.shape[1]] = array
    return grown
