"""``task="overflow_check"`` on the native path: the observer judges each op call as it ends.

:class:`~torchdebug.capture.overflow_check.OverflowWatch` judges calls in Python, as the dispatch mode
runs them. Here the observer judges each recorded call in C++ as it ends (``observer.cpp``'s
``watch``), from the statistics its slots took and its numbers, by :mod:`torchdebug.nonfinite`'s rule
handed over as tables (:func:`overflow_rule`: the rule stays written once), and keeps copies of the
tensors of the calls it finds, as they were at the call. At each drain :class:`NativeOverflowCheck`
records those calls (up to ``overflow_nums`` a run) with their tensors and logs them as the dispatch
mode does. Python runs once per op that holds a NaN/Inf in its outputs (its facts: which slots hold
no value of the run), not per call.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchdebug.capture.eager import op_info
from torchdebug.capture.native_records import op_overload
from torchdebug.capture.overflow_check import log_found
from torchdebug.native.observer import ENTRY_FOUND, ORIGIN_FOUND, NativeObserver, ObservedOps, OverflowRule
from torchdebug.nonfinite import ENTRY, GIVEN, GIVEN_LIMITS, ORIGIN, OriginTracker, describe_call, dtype_limit
from torchdebug.stats import has_statistics

__all__ = ["NativeOverflowCheck", "overflow_rule"]

NEVER_JUDGED = 1
"""An op's facts (:attr:`OverflowRule.facts`): its calls are never judged (an allocation, a collective, a wait)."""
ALLOCATES = 1 << 30
"""An op's facts: an allocation, whose outputs hold no value until an op writes them (``unwritten.py``)."""
_UNREAD_INPUT, _UNREAD_OUTPUT, _SLOTS = 1, 32, 24
"""The facts' bit of input position 0 and of output 0, and the positions that have one."""

_KINDS = {None: 0, GIVEN: 1, ORIGIN: ORIGIN_FOUND, ENTRY: ENTRY_FOUND}


def _verdicts() -> bytes:
    """:class:`OriginTracker`'s verdict for every flags and state (:attr:`OverflowRule.verdicts`)."""
    table = bytearray(256)
    for index in range(256):
        tracker = OriginTracker()
        tracker.nan_made, tracker.held = bool(index >> 6 & 1), bool(index >> 7 & 1)
        kind = tracker.judge(index & 7, index >> 3 & 7)
        table[index] = _KINDS[kind] | tracker.nan_made << 2 | tracker.held << 3
    return bytes(table)


def _limits(dtypes: dict[int, torch.dtype]) -> list[float]:
    """By ``c10::ScalarType`` code: the largest finite magnitude of a dtype the check judges (floating
    or complex, with statistics), NaN for the others."""
    limits = [math.nan] * (max(dtypes, default=-1) + 1)
    for code, dtype in dtypes.items():
        if (dtype.is_floating_point or dtype.is_complex) and has_statistics(dtype):
            limits[code] = dtype_limit(dtype)
    return limits


def op_facts(op_name: str) -> int:
    """The facts of an op (:attr:`OverflowRule.facts`) from eager capture's ``OpInfo``: never judged as
    the dispatch mode passes it through or makes no value, and the slots it does not read or make."""
    try:
        info = op_info(op_overload(op_name))
    except (AttributeError, RuntimeError):  # an op torch.ops does not name: every slot judged
        return 0
    if "*" in info.unread_outputs:
        return NEVER_JUDGED | ALLOCATES
    if info.collective or info.waits or info.skipped:
        return NEVER_JUDGED
    facts = 0
    for keys, first in ((info.unread_inputs, _UNREAD_INPUT), (info.unread_outputs, _UNREAD_OUTPUT)):
        for key in keys:
            if key.isdigit() and int(key) < _SLOTS:
                facts |= 1 << (first + int(key))
    return facts


def overflow_rule(observer: NativeObserver) -> OverflowRule:
    """:mod:`torchdebug.nonfinite`'s rule as ``observer`` takes it."""
    return OverflowRule(
        _verdicts(),
        _limits(observer.dtypes),
        sorted(GIVEN_LIMITS),
        lambda op: op_facts(observer.op_name(op)),
    )


class NativeOverflowCheck:
    """The overflow check of a native op capture: what the observer found, recorded up to ``limit``
    calls a run (``overflow_nums``; -1: all)."""

    def __init__(self, observer: NativeObserver, limit: int) -> None:
        self.observer = observer
        self.limit = limit
        self.found = 0
        self._rule = overflow_rule(observer)
        self._step: int | None = None

    @property
    def done(self) -> bool:
        """``overflow_nums`` calls are recorded: nothing more to check."""
        return self.limit != -1 and self.found >= self.limit

    def start(self, step: int) -> None:
        """Judge the calls recorded from now on, in ``step`` (a step started again goes on judging it)."""
        self.observer.watch_overflow(self._rule, fresh=self._step is None)
        self.observer.overflow_step(-1 if self.limit == -1 else self.limit - self.found, reset=step != self._step)
        self._step = step

    def stop(self) -> None:
        self.observer.watch_overflow(None)

    def recorded(
        self, ops: ObservedOps, calls: dict, recorded: np.ndarray, step: int
    ) -> tuple[np.ndarray, dict[int, torch.Tensor]]:
        """Of the rows ``ops`` drained that ``recorded`` selects (a flag a row), those to record: the
        calls found, in the order they ended, up to ``overflow_nums`` a run, each logged; and the
        copies of their tensors by drained slot. ``calls``: the rows' ``call_name``, ``phase``,
        ``module``, ``fwd`` and ``source`` columns."""
        found = self.observer.overflow_found()
        chosen = np.zeros(len(recorded), recorded.dtype)
        for row, kind in zip(found.rows.tolist(), found.kinds.tolist()):
            local = row - ops.first_row
            if not 0 <= local < len(recorded) or not recorded[local] or self.done:
                continue
            chosen[local] = 1
            self.found += 1
            name, phase, module, fwd, source = (
                calls[key][local].as_py() for key in ("call_name", "phase", "module", "fwd", "source")
            )
            log_found(
                self.found, step, describe_call(name, phase, module, fwd, source), ORIGIN if kind == ORIGIN_FOUND else ENTRY
            )
        return chosen, found.kept
