"""When the flight recorder fires: NaN/Inf, a loss spike, a gradient-norm spike, or the user's predicate.

Each trigger reads one finished step of the ring (:class:`~torchdebug.monitor._ring.Ring`) and the
steps before it in the window, and names the first slot, in execution order, where the anomaly
shows. The rules (which Inf fires, the robust z-score, a loss scaler's overflows counted, not
fired): docs/monitor.md, "Triggers" and "fp16 mixed precision".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from torchdebug.monitor._config import MonitorConfig
from torchdebug.monitor._ring import Ring
from torchdebug.records import LOSS_OP, MODULE_OP
from torchdebug.stats import STAT_KEYS

_NORM, _NAN = STAT_KEYS.index("norm"), STAT_KEYS.index("nan")
_INF = [STAT_KEYS.index("posinf"), STAT_KEYS.index("neginf")]
_MEAN = STAT_KEYS.index("mean")

MAD_SCALE = 1.4826
"""Median absolute deviation to the standard deviation of normally distributed values."""

REASONS = ("nonfinite", "loss_spike", "grad_norm_spike", "predicate")
"""Why a step fires (:attr:`Trigger.reason`); ``max_events`` counts the window dumps of each apart."""


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why a step fired, and the first watched slot (its ring index) where it shows."""

    reason: str
    """One of :data:`REASONS`, or ``other_rank`` (another rank's step fired)."""
    step: int
    slot: int | None
    message: str


@dataclass(frozen=True, slots=True)
class StepSummary:
    """What a user predicate (``Monitor(predicate=...)``) is given for each finished step."""

    step: int
    loss: float | None
    grad_norm: float | None
    stats: Callable[[str], dict[str, float] | None]
    """``stats(name)``: the statistics of a watched slot by its record name, ``None`` if not seen."""


def robust_z(value: float, history: np.ndarray, floor: float) -> float:
    """How far ``value`` lies above the median of ``history``, in scaled median absolute deviations,
    the spread taken at least ``floor`` times the median (``loss_spike_floor``, ``grad_norm_spike_floor``)."""
    history = history[np.isfinite(history)]
    if not len(history) or not math.isfinite(value):
        return math.nan
    median = float(np.median(history))
    spread = max(MAD_SCALE * float(np.median(np.abs(history - median))), floor * abs(median), 1e-30)
    return (value - median) / spread


class Triggers:
    """Judges finished steps of a ring (the rules: docs/monitor.md, "Triggers")."""

    def __init__(
        self,
        config: MonitorConfig,
        ring: Ring,
        predicate: Callable[[StepSummary], str | None] | None = None,
        scaled: bool = False,
    ) -> None:
        """``scaled``: the gradients pass through a loss scaler that skips the updates they overflow."""
        self.config, self.ring, self.predicate, self.scaled = config, ring, predicate, scaled
        self.overflows = 0
        """Steps whose gradients overflowed under the loss scaler (not fired while fewer than
        ``scaler_overflows`` in a row)."""
        self._last_overflow = (-2, 0)
        """The last step that overflowed, and how many in a row ended there."""
        self._loss_index: int | None = None
        self._slots_of: dict[tuple[str, int], list[int]] = {}
        """``_indices`` by io and slot count (slots only grow)."""
        self._grad_norms: dict[int, float | None] = {}
        """Total gradient norms of judged steps (their gradient rows do not change afterwards)."""

    def loss(self, step: int) -> float | None:
        """The loss passed in at ``step``, if any."""
        row, index = self.ring.row(step), self._loss_slot()
        return None if row is None or index is None or index >= len(row) else _finite_or_none(row[index, _MEAN])

    def grad_norm(self, step: int) -> float | None:
        """The total norm of the gradients watched at ``step``."""
        row = self.ring.row(step)
        if row is None:
            return None
        norms = row[self._indices("parameter_grad", len(row)), _NORM]
        norms = norms[~np.isnan(norms)]
        return float(np.sqrt(np.sum(norms**2))) if len(norms) else None

    def judge(self, step: int) -> Trigger | None:
        """The trigger ``step`` fires, or ``None``."""
        row = self.ring.row(step)
        if row is None:
            return None
        trigger = self._nonfinite(step, row)
        if trigger is not None and self.scaled and self.ring.slots[trigger.slot].io == "parameter_grad":
            trigger = self._overflowed(trigger)
        return trigger or self._loss_spike(step, row) or self._grad_spike(step) or self._predicate(step)

    def _overflowed(self, trigger: Trigger) -> Trigger | None:
        """A step whose NaN/Inf first show in the gradients, under a loss scaler: its overflow, which
        fires from the ``scaler_overflows``-th in a row (a step judged again, after its update, counts once)."""
        last, run = self._last_overflow
        if trigger.step != last:
            self.overflows += 1
            run = run + 1 if trigger.step == last + 1 else 1
            self._last_overflow = (trigger.step, run)
        if run < self.config.scaler_overflows:
            return None
        message = f"{trigger.message}; the gradients overflowed in {run} steps in a row, each skipped by the loss scaler"
        return Trigger("nonfinite", trigger.step, trigger.slot, message)

    # -- the triggers --------------------------------------------------------------------------
    def _nonfinite(self, step: int, row: np.ndarray) -> Trigger | None:
        nan = np.nan_to_num(row[:, _NAN]) > 0
        inf = np.nan_to_num(row[:, _INF]).sum(axis=1) > 0
        if not (nan.any() or inf.any()):
            return None
        for index in self.ring.execution_order():
            slot = self.ring.slots[index]
            if index >= len(row):
                continue
            counts_inf = slot.io != "output" or slot.op == LOSS_OP
            if nan[index] or (inf[index] and counts_inf):
                what = f"{int(row[index, _NAN])} NaN, {int(row[index, _INF].sum())} Inf"
                return Trigger("nonfinite", step, index, f"step {step}: {what} in {slot.name}")
        return None

    def _loss_spike(self, step: int, row: np.ndarray) -> Trigger | None:
        threshold, index = self.config.loss_spike, self._loss_slot()
        if not threshold or index is None:
            return None
        values = self._history(index, _MEAN, step)
        if values is None:
            return None
        floor = self.config.loss_spike_floor
        z = robust_z(float(row[index, _MEAN]), values, floor)
        if not z > threshold:
            return None
        culprit = self._first_standing_out(step, row, self._indices("output", len(row)), threshold, floor)
        return Trigger(
            "loss_spike", step, culprit, f"step {step}: loss {row[index, _MEAN]:.6g}, robust z-score {z:.1f} > {threshold}"
        )

    def _grad_spike(self, step: int) -> Trigger | None:
        threshold = self.config.grad_norm_spike
        value = self._grad_norms[step] = self.grad_norm(step)
        if not threshold or value is None:
            return None
        kept = self.ring.kept_steps()
        for old in [s for s in self._grad_norms if s < kept[0]]:
            del self._grad_norms[old]
        earlier = [self._grad_norms[s] if s in self._grad_norms else self.grad_norm(s) for s in kept if s < step]
        history = np.array([v for v in earlier if v is not None])
        if len(history) < self.config.history:
            return None
        z = robust_z(value, history, self.config.grad_norm_spike_floor)
        if not z > threshold:
            return None
        row = self.ring.row(step)
        assert row is not None
        culprit = self._first_standing_out(
            step, row, self._indices("parameter_grad", len(row)), threshold, self.config.grad_norm_spike_floor
        )
        return Trigger(
            "grad_norm_spike", step, culprit, f"step {step}: gradient norm {value:.6g}, robust z-score {z:.1f} > {threshold}"
        )

    def _predicate(self, step: int) -> Trigger | None:
        if self.predicate is None:
            return None
        names = {slot.name: index for index, slot in enumerate(self.ring.slots)}
        row = self.ring.row(step)
        assert row is not None

        def stats(name: str) -> dict[str, float] | None:
            index = names.get(name)
            if index is None or index >= len(row) or np.isnan(row[index]).all():
                return None
            return dict(zip(STAT_KEYS, map(float, row[index])))

        reason = self.predicate(StepSummary(step, self.loss(step), self.grad_norm(step), stats))
        return Trigger("predicate", step, None, f"step {step}: {reason}") if reason else None

    # -- helpers -------------------------------------------------------------------------------
    def _loss_slot(self) -> int | None:
        if self._loss_index is None:
            self._loss_index = next((i for i, slot in enumerate(self.ring.slots) if slot.op == LOSS_OP), None)
        return self._loss_index

    def _indices(self, io: str, count: int) -> list[int]:
        """Module slots of ``io`` (the loss and the loss scale left out) among the first ``count``,
        in execution order."""
        found = self._slots_of.get((io, count))
        if found is None:
            slots = self.ring.slots
            order = self.ring.execution_order()
            found = [i for i in order if i < count and slots[i].io == io and slots[i].op == MODULE_OP]
            self._slots_of[(io, count)] = found
        return found

    def _history(self, index: int, column: int, step: int) -> np.ndarray | None:
        """Column ``column`` of slot ``index`` over the window's steps before ``step``; ``None`` while
        fewer than ``history`` steps have it."""
        values = [
            row[index, column]
            for s in self.ring.kept_steps()
            if s < step and (row := self.ring.row(s)) is not None and index < len(row)
        ]
        values = np.array([v for v in values if not math.isnan(v)])
        return values if len(values) >= self.config.history else None

    def _first_standing_out(self, step: int, row: np.ndarray, indices: list[int], threshold: float, floor: float) -> int | None:
        """The first of ``indices`` whose norm at ``step`` stands out from its history by ``threshold``
        (the spread at least ``floor`` times the median), else the one standing out most."""
        best, best_z = None, -math.inf
        for index in indices:
            history = self._history(index, _NORM, step)
            if history is None:
                continue
            z = robust_z(float(row[index, _NORM]), history, floor)
            if z > threshold:
                return index
            if z > best_z:
                best, best_z = index, z
        return best


def _finite_or_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)
