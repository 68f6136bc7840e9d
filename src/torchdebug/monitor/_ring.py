"""The last K steps of watched statistics, on the host: one row of statistics per watched slot per step.

A *slot* is one watched tensor position (a module's ``output.0``, a parameter's gradient), named as
a module-level dump names it (:func:`torchdebug.records.make_name`). Slots get an index in the order
they are first seen and keep it for the whole run; :meth:`Ring.execution_order` sorts them as a
step runs them: forward outputs (innermost module first), the loss, gradients, parameters after
the update.

Memory: ``window × slots × len(STAT_KEYS)`` float64 (8 statistics: 2 MiB for 32 steps of 1,000
slots), grown by doubling as slots appear; :meth:`Ring.memory_bytes` reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from torchdebug.records import LOSS_OP, MODULE_OP, make_name
from torchdebug.stats._schema import STAT_KEYS, StatsDict

_STAGES = {"forward": 0, "backward": 2, "optimizer": 3}


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
    """Statistics of the last ``window`` steps per slot (NaN where a slot was not seen that step)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.slots: list[Slot] = []
        self._index: dict[tuple[str, str, str, int, str, str], int] = {}
        self.values = np.full((window, 64, len(STAT_KEYS)), math.nan)
        self._order: list[int] = []
        self.steps = [-1] * window
        """The step each position holds (-1: none yet)."""

    def slot(self, phase: str, module: str, op: str, call: int, io: str, arg: str) -> int:
        """The index of a slot, registered on first sight."""
        key = (phase, module, op, call, io, arg)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.slots)
            self.slots.append(Slot(phase, module, call, io, arg, op))
            if index >= self.values.shape[1]:
                grown = np.full((self.window, 2 * self.values.shape[1], len(STAT_KEYS)), math.nan)
                grown[:, : self.values.shape[1]] = self.values
                self.values = grown
        return index

    def stage(self, index: int | None) -> int:
        """Where in a step slot ``index`` is seen: 0 forward outputs, 1 the loss, 2 gradients, 3
        parameters after the update (4: no slot)."""
        if index is None:
            return 4
        slot = self.slots[index]
        return 1 if slot.op == LOSS_OP else _STAGES.get(slot.phase, 4)

    def execution_order(self) -> list[int]:
        """Slot indices in the order a step runs them (see the module docstring)."""
        if len(self._order) != len(self.slots):
            self._order = sorted(range(len(self.slots)), key=lambda i: (self.stage(i), i))
        return self._order

    def begin(self, step: int) -> None:
        """Make ``step`` the newest step, forgetting the oldest."""
        position = step % self.window
        self.steps[position] = step
        self.values[position] = math.nan

    def put(self, step: int, index: int, stats: StatsDict) -> None:
        """Statistics of slot ``index`` at ``step`` (ignored once the step has left the window)."""
        position = step % self.window
        if self.steps[position] == step:
            self.values[position, index] = [math.nan if stats.get(key) is None else stats[key] for key in STAT_KEYS]

    def row(self, step: int) -> np.ndarray | None:
        """``slots × STAT_KEYS`` of ``step``, or ``None`` once it has left the window."""
        position = step % self.window
        return self.values[position, : len(self.slots)] if self.steps[position] == step else None

    def kept_steps(self) -> list[int]:
        """The steps in the window, oldest first."""
        return sorted(step for step in self.steps if step >= 0)

    def memory_bytes(self) -> int:
        return self.values.nbytes
