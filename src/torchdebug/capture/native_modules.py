"""Module records on the native path (``level="mix"``): :class:`ModuleRecorder`'s records, in the
order of the step's op records and with the value ids of the same walk.

Each side of a module call hands its tensors to the observer as a row of its own between the ops
(``NativeObserver.module_row``), so that the C++ walk reads them and gives them value ids, statistics
and fingerprints as it gives the ops' inputs (``native_values.py``); each call's start (and each
gradient record) takes an empty row, which says where its ``seq`` falls among the op calls'. At the
drain, :meth:`NativeModuleRecorder.merged` names those slots as the dispatch mode's
:class:`ModuleRecorder` names them and puts every record at its row: the dump holds what the dispatch
mode writes, record for record (``docs/architecture.md``, "The native path (issue 48)").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from torchdebug.capture.modules import ModuleRecorder
from torchdebug.capture.session import CaptureSession
from torchdebug.native.observer import MODULE_ROW_SLOTS, NativeObserver
from torchdebug.records import MODULE_OP, Record, make_name
from torchdebug.slots import Slot, json_value
from torchdebug.store import records_batch, records_from_table

__all__ = ["NativeModuleRecorder"]

_READ = tuple(
    field.name
    for field in dataclasses.fields(Record)
    if field.name not in {"name", "step", "rank", "phase", "module", "op", "call", "seq", "io", "arg", "stack", "source", "fwd"}
)
"""The fields a module record takes from its slot's record in the walk's columns: all but its name's."""


class NativeModuleRecorder(ModuleRecorder):
    """:class:`ModuleRecorder` on the native observer's rows: records are kept until the op
    capture's drain (:meth:`merged`), not handed to the session."""

    def __init__(
        self,
        session: CaptureSession,
        phases: frozenset[str],
        ios: frozenset[str],
        model: nn.Module | None,
        observer: NativeObserver,
    ) -> None:
        super().__init__(session, phases, ios, model)
        self.observer = observer
        self.observing = False
        """Whether the op capture observes (it records nothing while another debugger does)."""
        self._calls_at: list[int] = []
        """The row of each module call's start and gradient record since the last drain: its ``seq``
        is its index here until :meth:`merged` numbers them with the op calls."""
        self._records: list[Record] = []
        self._rows: list[int] = []
        """By record: the row it is written at (its side's first row)."""
        self._slot_records: dict[tuple[int, int], int] = {}
        """By a tensor slot's ``(row, element)``: its record's index in :attr:`_records`."""

    def _next_seq(self) -> int:
        row = self.observer.module_row([]) if self.observing else -1
        if row < 0:
            return -1
        self._calls_at.append(row)
        return len(self._calls_at) - 1

    def _record(self, slots: list[Slot], *, phase: str, name: str, call: int, seq: int, io: str) -> None:
        if seq < 0 or not self.observing:
            return
        tensors = [value for _, value in slots if isinstance(value, torch.Tensor)]
        chunks = range(0, len(tensors) or 1, MODULE_ROW_SLOTS)  # (no tensor: an empty row, where its values go)
        rows = [self.observer.module_row(tensors[at : at + MODULE_ROW_SLOTS]) for at in chunks]
        if min(rows) < 0:
            return
        step, rank, index = self.session.step, self.session.rank, 0
        for arg, value in slots:
            full_name = make_name(phase, name, MODULE_OP, call, io, arg)
            record = Record(full_name, step, rank, phase, name, MODULE_OP, call, seq, io, arg)
            if isinstance(value, torch.Tensor):
                self._slot_records[(rows[index // MODULE_ROW_SLOTS], index % MODULE_ROW_SLOTS)] = len(self._records)
                index += 1
            else:
                record.kind = "value"
                record.value = json_value(value)
            self._records.append(record)
            self._rows.append(rows[0])

    def forget(self) -> None:
        """Drop the records kept since the last drain (merged, or lost with it)."""
        self._records, self._rows, self._slot_records, self._calls_at = [], [], {}, []

    def calls_at(self) -> np.ndarray:
        """The rows of the module calls (and gradient records) since the last drain, in order."""
        return np.array(self._calls_at, np.int64)

    def merged(self, columns: pa.RecordBatch, record_rows: np.ndarray, elements: np.ndarray, seqs: np.ndarray) -> pa.RecordBatch:
        """The drain's records in the order of the step: ``columns`` (the walk's records, with
        ``record_rows`` and ``elements`` their slots' rows and elements; those of module rows hold
        the module records' tensors) and the module records, each at its row, their ``seq`` the
        ``seqs`` of their calls (by :meth:`calls_at`)."""
        records, rows, slot_records = self._records, self._rows, self._slot_records
        ours = np.isin(record_rows, np.fromiter({row for row, _ in slot_records}, np.int64))
        if slot_records:
            read = records_from_table(pa.Table.from_batches([columns.filter(pa.array(ours))]))
            for key, slot in zip(zip(record_rows[ours].tolist(), elements[ours].tolist()), read):
                record = records[slot_records[key]]
                for field in _READ:
                    setattr(record, field, getattr(slot, field))
        if not records:
            return columns
        for record in records:
            record.seq = int(seqs[record.seq])
        table = pa.Table.from_batches([columns.filter(pa.array(~ours)), records_batch(records)])
        order = np.argsort(np.concatenate([record_rows[~ours], np.array(rows, np.int64)]), kind="stable")
        merged = table.take(pa.array(order)).combine_chunks().to_batches()
        return merged[0] if merged else columns.slice(0, 0)
