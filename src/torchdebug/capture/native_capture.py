"""The Debugger's eager op capture on the native observer, and when it is used instead of the
dispatch mode (``eager.py``).

The native path records ops in C++ (``torchdebug.native.observer``) and names them once per
:meth:`NativeOpCapture.stop` (``native_records.py``, with a C++ walk over the drained rows and slots):
no Python per op; at levels ``mix`` and ``module`` module calls' tensors are rows of their own
(``native_modules.py``). It writes the records the
dispatch mode writes, through the same session and store, for the configs :func:`why_not_native`
accepts; for any other, the Debugger uses the dispatch mode, and says why in one log line.

``TORCHDEBUG_NATIVE=0`` turns all native code off (the dispatch mode, torch ops for statistics);
otherwise the native path is taken wherever it applies (``docs/capture.md``).
"""

from __future__ import annotations

import ctypes
import logging
import os

import numpy as np
import torch
from torch import nn

from torchdebug.capture.collectives import DISTRIBUTED_DIR
from torchdebug.capture.filters import NameMatcher, RangeGate
from torchdebug.capture.modules import ModuleTracker
from torchdebug.capture.native_modules import NativeModuleRecorder
from torchdebug.capture.native_overflow import NativeOverflowCheck
from torchdebug.capture.native_records import NativeStepCapture, Snapshots
from torchdebug.capture.native_values import PHASES
from torchdebug.capture.recompute import RECOMPUTE
from torchdebug.capture.session import CaptureSession
from torchdebug.config import DebuggerConfig
from torchdebug.native import fused_stats
from torchdebug.native.build import DISABLE_ENV, load_torch_library
from torchdebug.native.observer import MODULE_ROW_OP, NativeObserver, ObservedOps

__all__ = ["NativeOpCapture", "why_not_native"]

logger = logging.getLogger("torchdebug.capture.native_capture")

_TASKS = ("structure", "statistics", "checksum", "tensor", "overflow_check")
_MODULE_ROW = 2
"""A row whose slots are written as module records (``native_modules.py``; 1: an op call's)."""

DEVICE_STATISTICS = False
"""Whether statistics and fingerprints of an accelerator's tensors take the native path: kept by the
callback and staged through the session's stager before an op writes their memory
(``NativeStepCapture.stage_kept``), as ``tests/capture/test_native_staging.py`` checks on the CPU.
Off until that path has run on a GPU (its ``gpu`` test; ``bench/overhead.py --native-devices``):
until then the dispatch mode reads them. The writers no op shows (FSDP2's reshard, inductor's
kernels) are staged before they write (docs/architecture.md, "The native path (issue 48)",
statistics), tested on the CPU with every tensor kept as an accelerator's."""

STAGE_AFTER_BYTES = 64 << 20
"""Bytes of kept tensors (those the callback does not read: other dtypes and devices) after which
they are staged at the next op, as before an op writes one: the memory they hold is bounded."""

_READS_VALUES = ("statistics", "checksum", "tensor", "overflow_check")
"""Tasks whose values the native path reads on the CPU only (statistics, fingerprints)."""


def why_not_native(config: DebuggerConfig, model: nn.Module | None) -> str | None:
    """Why a Debugger with ``config`` capturing ``model`` records ops through the dispatch mode (at
    level ``module``, module calls through Python's records), or ``None`` when the native path applies
    (decided before the run, from the config and the model)."""
    if os.environ.get(DISABLE_ENV) == "0":
        return f"{DISABLE_ENV}=0"
    if config.task not in _TASKS:
        return f"task={config.task!r} (the native path takes {' and '.join(_TASKS)})"
    if _distributed() and _works() is None:
        return "a distributed run where c10d_work.cpp cannot be built (the native path reads collectives once they complete)"
    if config.task in _SAVES_TENSORS:
        why = _why_not_for_saving(config)
        if why is not None:
            return why
    reads = config.task in _READS_VALUES or config.checksum
    if reads and not fused_stats.available():
        return "statistics or fingerprints without the C kernel (native/stats.c cannot be built here)"
    if model is not None:
        return _why_not_for_model(model, reads)
    if reads and torch.accelerator.is_available() and not DEVICE_STATISTICS:
        return "statistics or fingerprints with an accelerator present and no model (the native path reads CPU tensors only)"
    return None


_SAVES_TENSORS = ("tensor", "overflow_check")
"""Tasks whose calls' tensors the native path saves as each call runs, before the calls are named."""


def _why_not_for_saving(config: DebuggerConfig) -> str | None:
    """Why ``task="tensor"`` or ``"overflow_check"`` takes the dispatch mode: the native path saves (or
    judges) the tensors of every call as it runs, before the calls are named (at the drain), so it
    takes no filter by name or side (the overflow check judges every call, the dispatch mode's the
    calls selected)."""
    task = config.task
    for key, value in (("tensor_list", config.tensor_list), ("list", config.list), ("range", config.range)):
        if value:
            return f"task={task!r} with {key} (the native path saves the tensors before it names the calls)"
    if config.data_mode != ["all"]:
        return f"task={task!r} with data_mode other than ['all'] (the native path saves every side of every call)"
    if config.level != "op":
        return f"task={task!r} at level={config.level!r} (the native path saves the tensors of op calls)"
    if _distributed() and task == "tensor":
        return "task='tensor' in a distributed run (the native path may copy a gloo collective's outputs before they are final)"
    return None


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _works() -> ctypes.CDLL | None:
    """The library that tells whether a collective's Work completed (``c10d_work.cpp``), or ``None``."""
    return load_torch_library("c10d_work")


def _why_not_for_model(model: nn.Module, reads: bool) -> str | None:
    """Why the native path does not apply to ``model`` (``reads``: the config reads tensors' values).
    Compiled code takes it, run as compiled or eagerly (modules compiled in place or wrapped, a
    compiled ``forward`` or ``training_step``): the ops it calls through aten are named as the
    dispatch mode names them. So do tensor-subclass parameters (DTensors, quantized weights): each is
    described at its ops and read through the plain tensor holding its elements (``native_subclasses.py``)."""
    for parameter in model.parameters():
        if reads and parameter.device.type != "cpu" and not DEVICE_STATISTICS:
            return f"statistics or fingerprints of {parameter.device.type} tensors (the native path reads CPU tensors only)"
    return None


class NativeOpCapture:
    """Records the aten ops of one step into a :class:`CaptureSession` through the native observer;
    the Debugger's other op capture, with :class:`~torchdebug.capture.eager.OpCapture`'s lifetime."""

    def __init__(
        self,
        session: CaptureSession,
        tracker: ModuleTracker,
        observer: NativeObserver,
        model: nn.Module | None,
        *,
        phases: frozenset[str],
        ios: frozenset[str],
        names: list[str],
        call_range: list[str],
        stack: str | list[str],
        ops: bool = True,
    ) -> None:
        """``stack``: the config's (``all``, ``none``, or ``[FROM, TO]``: the stacks of that range of
        calls). ``ops=False``: no op is observed, only the module calls :attr:`modules` records
        (level ``module``)."""
        self.session = session
        self.observer = observer
        self.modules: NativeModuleRecorder | None = None
        """Levels ``mix`` and ``module``: the module records (the Debugger sets them), written among
        the op records (at level ``module``, alone)."""
        self.rows = NativeStepCapture(
            observer,
            model,
            tracker=tracker,
            step=session.step,
            rank=session.rank,
            stacks=stack != "none",
            stack_range=stack if isinstance(stack, list) else None,
            ops=ops,
        )
        self.phases = phases
        self.ios = ios
        self.names = NameMatcher(names)
        self.range = RangeGate(call_range)
        self._by_name = bool(names) or bool(call_range)
        recorded = phases | {RECOMPUTE} if "forward" in phases else phases  # recomputed ops are forward ops (eager.py)
        self._recorded_phase = np.zeros(len(PHASES) + 1, bool)
        """By a row's phase code plus one (-1: a row capture skips): whether its calls are recorded."""
        self._recorded_phase[[PHASES.index(phase) + 1 for phase in recorded if phase in PHASES]] = True
        self._overflow = NativeOverflowCheck(observer, session.overflow_nums) if session.overflow_nums is not None else None
        """``task="overflow_check"``: what the observer found (only those calls are recorded, with their tensors)."""
        self._statistics = session.want_stats or self._overflow is not None
        self._fingerprints = session.want_checksum
        self._tensors = session.want_tensors
        """``task="tensor"``: every tensor is kept (``NativeObserver.defer_cpu``) and saved as it is staged."""
        self._snapshots: Snapshots | None = None
        """With ``task="tensor"``, from start to stop: what saves the step's kept tensors."""
        self._failed = False
        self._stacks_handed = np.zeros(0, bool)
        """By index into ``NativeStepCapture.stack_table``: whether the stack went to the session."""
        self._told_staging = False
        self._told_hidden = False
        self._told_busy = False
        self._idle = False

    def start(self) -> None:
        """Observe, unless another capture in this process observes (then this one records no op until
        it stops, and says so once; at level ``module`` its module records go through Python's)."""
        self._idle = self.observer.running or (self._overflow is not None and self._overflow.done)  # (done: no call to check)
        if self.observer.running and not self._told_busy:
            self._told_busy = True
            meanwhile = "records none" if self.rows.ops else "records its module calls through Python"
            logger.warning("torchdebug: another debugger observes on the native path: this one %s meanwhile", meanwhile)
        if self._idle:
            return
        self.observer.use_stats(self._statistics)
        self.observer.use_fingerprints(self._fingerprints)
        if self._tensors:
            self.observer.defer_cpu(True)
            self._snapshots = self.rows.snapshots(self.session.snapshot, self.session.view_ref)
        self.observer.keep_unsummed(self._statistics or self._fingerprints)
        self.observer.use_stage_hook(self._stage_kept if self._statistics or self._fingerprints else None, STAGE_AFTER_BYTES)
        self.observer.use_works(_works() if _distributed() and self.rows.ops else None, DISTRIBUTED_DIR)
        if self._overflow is not None:
            self._overflow.start(self.session.step)
        self.rows.start()
        if self.modules is not None:
            self.modules.observing = True

    def stop(self) -> None:
        """Stop observing and hand the step's records so far to the session."""
        if self._idle:
            return
        self.observer.finish_collectives()
        if self.modules is not None:
            self.modules.observing = False
        self.rows.stop()
        self.observer.finish_functional()
        if self._tensors:  # the rest saved as staged, not handed at the drain: a view of one saved whole is saved as its view
            self._stage_kept()
        self.observer.use_stage_hook(None)
        if self._tensors:
            self.observer.defer_cpu(False)
        ops = self.observer.drain()
        hidden = self.observer.hidden_in_transforms()
        if hidden and not self._told_hidden:  # not seen from the model before the run
            self._told_hidden = True
            logger.warning(
                "torchdebug: %d op calls of step %d ran inside a torch.func transform (vmap, grad): the native path "
                "does not see them; TORCHDEBUG_NATIVE=0 captures them through the dispatch mode",
                hidden,
                self.session.step,
            )
        try:
            self._add_records(ops)
        except Exception as error:  # never crash the user's run: its records are lost, said once
            if not self._failed:
                self._failed = True
                logger.warning("torchdebug: the native op capture lost a step's ops (%s: %s)", type(error).__name__, error)
        finally:
            self._snapshots = None  # (the drain let go of the keys it names tensors by)
            if self._overflow is not None:
                self._overflow.stop()
            if self.modules is not None:
                self.modules.forget()

    def _hand_stacks(self, stacks: np.ndarray) -> None:
        """Hand the session the stacks of the recorded calls (``stacks``: each one's, -1 none) not
        handed before, in the order of their first call: a steady step's were all handed before,
        found so in one gather (a sort and a call a stack took 0.17M instructions of the tiny GPT's
        step)."""
        table = self.rows.stack_table
        if len(self._stacks_handed) < len(table):
            self._stacks_handed = np.concatenate([self._stacks_handed, np.zeros(len(table) - len(self._stacks_handed), bool)])
        stacks = stacks[stacks >= 0]
        if self._stacks_handed[stacks].all():
            return
        new, first = np.unique(stacks, return_index=True)
        for stack in new[np.argsort(first)].tolist():  # in the order of their first call
            stack_id, frames, _ = table[stack]
            self.session.add_stack(stack_id, frames)
        self._stacks_handed[new] = True

    def _stage_kept(self) -> None:
        """The observer's hook: stage the kept tensors' statistics now (``NativeStepCapture.stage_kept``).
        Never raises into the op that starts (a fault costs those statistics, said once)."""
        try:
            self.rows.stage_kept(
                self.session.stage_stats, self.session.stage_landed, self._statistics, self._fingerprints, self._snapshots
            )
        except Exception as error:
            if not self._told_staging:
                self._told_staging = True
                logger.warning("torchdebug: could not stage the statistics of kept tensors (%s: %s)", type(error).__name__, error)

    def next_step(self) -> None:
        self.rows.next_step()
        self.range.reset()

    def _add_records(self, ops: ObservedOps) -> None:
        session = self.session
        if not session.writer.takes_records:
            return  # a write of records failed: capture stopped, as ``CaptureSession.add_call`` stops
        rows = self.rows.name_rows(ops)
        recorded = self._recorded_phase[rows.phase.astype(np.intp) + 1]
        snapshots, saving = self._snapshots, None
        if self._overflow is not None:  # only the calls found, their tensors saved
            recorded, saving = self._overflow.recorded(ops, rows.columns, recorded, session.step)
            snapshots = self.rows.snapshots(session.snapshot, session.view_ref) if recorded.any() else None
        if self._by_name:  # a range or name patterns: each candidate call's name, in row order
            names, range_gate = self.names, self.range
            call_names = rows.columns["call_name"].to_pylist()
            for row in np.flatnonzero(recorded).tolist():
                name = call_names[row]
                recorded[row] = range_gate.check(name) and (not names or names(name))
        chosen = np.flatnonzero(recorded)
        seqs = np.full(len(recorded), -1, np.int64)
        # the op calls and the module calls numbered together in row order (both ascending; a module call's row: its start's)
        calls_at = self.modules.calls_at() if self.modules is not None else np.zeros(0, np.int64)
        seqs[chosen] = session.seq + np.arange(len(chosen)) + np.searchsorted(calls_at, chosen + ops.first_row)
        module_seqs = session.seq + np.arange(len(calls_at)) + np.searchsorted(chosen + ops.first_row, calls_at)
        session.seq += len(chosen) + len(calls_at)
        self._hand_stacks(rows.stack[chosen])
        self.rows.step = session.step
        written = recorded.astype(np.int8)
        if self.modules is not None and MODULE_ROW_OP in ops.names:  # the module rows' slots: module records
            written[np.frombuffer(ops.op, np.int32) == ops.names.index(MODULE_ROW_OP)] = _MODULE_ROW
        columns = self.rows.slot_columns(
            ops,
            rows,
            written,
            ios=self.ios,
            seqs=seqs,
            statistics=self._statistics,
            fingerprints=self._fingerprints,
            stage=session.stage_stats,
            deliver=session.flush,
            snapshots=snapshots,
            saving=saving,
        )
        if self.modules is not None:
            slots = self.rows.record_slots
            rows_of, elements = np.frombuffer(ops.slot_row, np.int64)[slots], np.frombuffer(ops.slot_element, np.int16)[slots]
            local = rows_of - ops.first_row  # (< 0: an op drained before, its outputs now)
            ours = (local >= 0) & (written[np.maximum(local, 0)] == _MODULE_ROW)
            columns = self.modules.merged(columns, slots, ours, rows_of << 16 | elements.astype(np.int64), module_seqs)
        if columns.num_rows:
            session.flush()  # what the session holds goes first: the dump keeps the order of capture
            session.writer.submit_columns(session.step, columns)
