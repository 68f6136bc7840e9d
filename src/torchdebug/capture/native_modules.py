"""Module records on the native path (levels ``mix`` and ``module``): :class:`ModuleRecorder`'s
records, in the order of the step's op records (at level ``module``, alone) and with the value ids
of the same walk.

Each side of a module call hands its tensors to the observer as a row of its own between the ops
(``NativeObserver.module_row``), so that the C++ walk reads them and gives them value ids, statistics
and fingerprints as it gives the ops' inputs (``native_values.py``); each call's start (and each
gradient record) takes an empty row, which says where its ``seq`` falls among the op calls'. At the
drain, :meth:`NativeModuleRecorder.merged` names those slots as the dispatch mode's
:class:`ModuleRecorder` names them and puts each side of a call where its slots were: the dump holds
what the dispatch mode (or Python's module records) writes, record for record (``docs/architecture.md``,
"The native path (issue 48)").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn

from torchdebug.capture.modules import ModuleRecorder
from torchdebug.capture.session import CaptureSession
from torchdebug.native.observer import MODULE_ROW_SLOTS, NativeObserver
from torchdebug.records import MODULE_OP, Record, make_name
from torchdebug.slots import Slot, json_value
from torchdebug.store import SCHEMA as _SCHEMA
from torchdebug.store import arrow_array, arrow_column, plain_values, records_batch

__all__ = ["NativeModuleRecorder"]

_NAMED = ("name", "phase", "module", "call", "seq", "io", "arg", "slot_at")
"""What :class:`NativeModuleRecorder` keeps of each record until the drain: the fields of its name
(a tensor's others are its slot's in the walk's columns; ``op`` is ``module``), and where its call's
side goes among the drained slots (``NativeObserver.module_row``)."""


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
        self.alone = False
        """Level ``module`` (no op capture beside): while the observer is another debugger's, the
        records go through Python's :class:`ModuleRecorder`, as before the native path took them."""
        self._calls_at: list[int] = []
        """The row of each module call's start and gradient record since the last drain: its ``seq``
        is its index here until :meth:`merged` numbers them with the op calls."""
        self._named: list[tuple] = []
        """The module records since the last drain, each its :data:`_NAMED` fields (``seq``: the
        index of its call in :attr:`_calls_at`)."""
        self._slots: list[int] = []
        """Each tensor record's slot, ``row << 16 | element`` (ascending), and its record's index."""
        self._tensor_records: list[int] = []
        self._values: list[Record] = []
        """The value records (non-tensor arguments and results), and each one's index."""
        self._value_records: list[int] = []

    def _next_seq(self) -> int:
        if not self.observing and self.alone:
            return super()._next_seq()
        row, _ = self.observer.module_row([]) if self.observing else (-1, 0)
        if row < 0:
            return -1
        self._calls_at.append(row)
        return len(self._calls_at) - 1

    def _record(self, slots: list[Slot], *, phase: str, name: str, call: int, seq: int, io: str) -> None:
        if not self.observing and self.alone:
            super()._record(slots, phase=phase, name=name, call=call, seq=seq, io=io)
            return
        if seq < 0 or not self.observing:
            return
        tensors = [value for _, value in slots if isinstance(value, torch.Tensor)]
        if len(tensors) <= MODULE_ROW_SLOTS:  # one row (no tensor: an empty row, where its values go)
            row, slot_at = self.observer.module_row(tensors)
            rows, slots_at = (row,), (slot_at,)
        else:
            chunks = range(0, len(tensors), MODULE_ROW_SLOTS)
            rows, slots_at = zip(*(self.observer.module_row(tensors[at : at + MODULE_ROW_SLOTS]) for at in chunks))
        if min(rows) < 0:
            return
        named, index = self._named, 0
        for arg, value in slots:
            at = len(named)
            full_name = make_name(phase, name, MODULE_OP, call, io, arg)
            named.append((full_name, phase, name, call, seq, io, arg, slots_at[0]))
            if isinstance(value, torch.Tensor):
                self._slots.append(rows[index // MODULE_ROW_SLOTS] << 16 | index % MODULE_ROW_SLOTS)
                self._tensor_records.append(at)
                index += 1
            else:
                step, rank = self.session.step, self.session.rank
                record = Record(full_name, step, rank, phase, name, MODULE_OP, call, seq, io, arg, kind="value")
                record.value = json_value(value)
                self._values.append(record)
                self._value_records.append(at)

    def forget(self) -> None:
        """Drop the records kept since the last drain (merged, or lost with it)."""
        self._calls_at, self._named, self._slots, self._tensor_records, self._values, self._value_records = [], [], [], [], [], []

    def calls_at(self) -> np.ndarray:
        """The rows of the module calls (and gradient records) since the last drain, in order."""
        return np.array(self._calls_at, np.int64)

    def merged(
        self, columns: pa.RecordBatch, record_slots: np.ndarray, ours: np.ndarray, keys: np.ndarray, seqs: np.ndarray
    ) -> pa.RecordBatch:
        """The drain's records in the order of the step: ``columns`` (the walk's records; by record,
        ``record_slots`` its drained slot, ``ours`` whether a module row holds it (one of the module
        records' tensors, which take their names here), ``keys`` its slot's ``row << 16 | element``)
        and the module records, each side of a call where its slots were, their ``seq`` the
        ``seqs`` of their calls (by :meth:`calls_at`). Linear in the records, but for a binary
        search per module record."""
        if not self._named:
            return columns
        slots = np.array(self._slots, np.int64)
        if not np.array_equal(keys[ours], slots):  # (a fault of ours: the step's records are lost, said once)
            raise RuntimeError("the module rows' slots are not the tensors they were handed")
        # each module tensor record's slot (the rows ``ours`` marks, in order) named as the record it is:
        # its fields put in place in the walk's columns, one call a field
        named = [self._named[record] for record in self._tensor_records]
        fields: dict[str, Any] = dict(zip(_NAMED, map(list, zip(*named)))) if named else {field: [] for field in _NAMED}
        fields["seq"] = seqs[np.array(fields["seq"], np.int64)]
        fields["op"] = [MODULE_OP] * len(named)
        del fields["slot_at"]
        every = len(named) == columns.num_rows
        mask = None if every else arrow_array(ours)
        replaced = {}
        for field, items in fields.items():
            kind = _SCHEMA.field(field).type
            array = arrow_array(items, kind) if isinstance(items, np.ndarray) else arrow_column(items, kind)
            replaced[field] = array if every else pc.replace_with_mask(columns.column(field), mask, array)
        arrays = [replaced[name] if name in replaced else columns.column(name) for name in columns.schema.names]
        source = pa.RecordBatch.from_arrays(arrays, schema=columns.schema)
        # the module records, in their order, each before the op records of later slots (both ascending):
        # positions among the op records, the tensor records and the value records, then in ``source``
        # and the value records after it
        ops, tensors, values = int((~ours).sum()), len(named), len(self._values)
        count = tensors + values
        slot_at = np.array([entry[-1] for entry in self._named], np.int64)
        module_records = np.empty(count, np.int64)
        module_records[np.array(self._tensor_records, np.int64)] = ops + np.arange(tensors)
        module_records[np.array(self._value_records, np.int64)] = ops + tensors + np.arange(values)
        at = np.searchsorted(record_slots[~ours], slot_at) + np.arange(count)
        order = np.empty(ops + count, np.int64)
        order[at] = module_records
        placed = np.ones(ops + count, bool)
        placed[at] = False
        order[placed] = np.arange(ops)
        rows = np.concatenate([np.flatnonzero(~ours), np.flatnonzero(ours), columns.num_rows + np.arange(values)])[order]
        if not values:
            return source if np.array_equal(rows, np.arange(len(rows))) else source.take(arrow_array(rows))
        for record in self._values:
            record.seq = int(seqs[record.seq])
        table = pa.Table.from_batches([plain_values(source), records_batch(self._values)])
        return table.take(arrow_array(rows)).combine_chunks().to_batches()[0]
