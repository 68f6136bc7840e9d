"""The native path's records as one Arrow record batch, built from the observer's drained arrays.

The native path's C++ walk (``capture/native_values.py``) gives, per recorded slot, its drained
index, ``arg`` (a code), value id, ``view_of``, where its statistics come from and why it is not read
or has no statistics, as arrays. The rest is taken column by column from the drained arrays and the
rows' names: dtypes, shapes, strides, devices and versions at the recorded slots, a call's fields
per row, texts by code, the statistics finished from the callback's sums in one pass of ``stats.c``,
fingerprints spelled as 16 hex digits (``checksum.hex_digits``) in another: no record, name or
statistics dict is made per slot. The batch has the schema ``records_batch`` gives
(``_record_columns.py``), read back the same way: docs/architecture.md, "The native path".
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torchdebug.native.fused_stats import FinishedStats, finish_sums
from torchdebug.records import UNREAD
from torchdebug.slots import json_value
from torchdebug.store._arrow_buffers import array, bitmap, int_lists, null_column, strings, text
from torchdebug.store._arrow_buffers import column as arrow_column
from torchdebug.store._record_columns import STATS_TYPE, columns_batch, int_column, stats_array
from torchdebug.store._record_json import json_text

__all__ = ["FixedColumns", "SlotOverrides", "SlotColumns", "extra_text", "unread_text"]


_STRING, _INT, _FLOAT = pa.string(), pa.int64(), pa.float64()
_INDICES = 1 << 16
"""Device indices (and -1, none) a device code holds: ``type * _INDICES + index + 1``."""


@dataclass(frozen=True, slots=True)
class SlotOverrides:
    """Slots whose fields Python gives rather than the drained arrays (the native path's subclass
    instances, read through their inner tensors at the flush): by position among the recorded
    slots, the fields their records hold."""

    positions: list[int]
    dtypes: list[str | None]
    shapes: list[list[int] | None]
    strides: list[list[int] | None]
    devices: list[str | None]
    errors: list[str | None]
    """``capture_error``."""
    extras: list[str | None]
    """``extra`` as JSON text."""

    def patch(self, columns: dict[str, pa.Array]) -> None:
        """Put these slots' fields into the batch's ``columns`` (one take a column)."""
        count = len(columns["dtype"])
        index = np.arange(count)
        index[self.positions] = count + np.arange(len(self.positions))
        at = array(index)
        fields = {"dtype": self.dtypes, "shape": self.shapes, "stride": self.strides, "device": self.devices}
        fields |= {"capture_error": self.errors, "extra": self.extras}
        for name, values in fields.items():
            column = columns[name]
            added = int_lists(values) if pa.types.is_list(column.type) else strings(values)
            columns[name] = pa.concat_arrays([column, added]).take(at)


class FixedColumns:
    """The columns of a drain's records that its structure alone sets (names, the call's fields, io
    and arg, kind, dtype, shape, stride, device), kept with that structure: a steady training loop
    drains the same structure every step, and makes them once (:meth:`SlotColumns.batch`)."""

    def __init__(self) -> None:
        self._calls: dict[str, pa.Array] | None = None
        self._key: list[np.ndarray] = []
        self._columns: dict[str, pa.Array] = {}
        empty = pa.nulls(0)
        self._values: tuple[list[str], np.ndarray, np.ndarray, pa.Array, pa.Array] = ([], np.empty(0), np.empty(0), empty, empty)

    def get(self, calls: dict[str, pa.Array], key: list[np.ndarray]) -> dict[str, pa.Array] | None:
        """The columns made last, if made from these call columns (the same object) and structure."""
        if calls is not self._calls or len(key) != len(self._key):
            return None
        return self._columns if all(np.array_equal(a, b) for a, b in zip(key, self._key)) else None

    def put(self, calls: dict[str, pa.Array], key: list[np.ndarray], columns: dict[str, pa.Array]) -> None:
        self._calls, self._key, self._columns = calls, key, columns

    def value_column(self, ops: Any, slots: np.ndarray, values: np.ndarray) -> pa.Array:
        """:func:`_values`, the last drain's column where its value texts and the slots holding them are
        the same; its indices where only the texts changed (an optimizer's step sizes are new texts
        every step, at the same places)."""
        texts, held, at, indices, column = self._values
        now = np.asarray(ops.slot_value, np.int64).take(slots[values])
        if not np.array_equal(held, values) or not np.array_equal(at, now):
            indices = _value_indices(ops, slots, values)
        elif texts == ops.value_texts:
            return column
        column = pa.DictionaryArray.from_arrays(indices, _value_dictionary(ops.value_texts))
        self._values = (ops.value_texts, values, now, indices, column)
        return column


@dataclass(frozen=True, slots=True)
class SavedTensors:
    """The saved tensor of each recorded slot (``task="tensor"``), in order: its tensor reference
    (``{"file", "key"}``, a view's with ``"view"``; ``None``: not saved) and its sampling stride."""

    refs: list[dict[str, Any] | None]
    sampled: list[int | None]

    def columns(self, odd: dict[int, dict[str, Any]]) -> dict[str, pa.Array]:
        """``tensor_file``, ``tensor_key`` and ``sampled``; a view's reference goes whole into
        ``odd`` (``json_fields``), as ``records_batch`` keeps it."""
        for row, ref in enumerate(self.refs):
            if ref is not None and "view" in ref:
                odd.setdefault(row, {})["tensor"] = ref
        return {
            "tensor_file": strings([ref and ref.get("file") for ref in self.refs]),
            "tensor_key": strings([ref and ref.get("key") for ref in self.refs]),
            "sampled": arrow_column(self.sampled, _INT),
        }


@dataclass(frozen=True, slots=True)
class SlotColumns:
    """The recorded slots of one drain, as the native path's walk gives them (per slot, in row
    order: numpy arrays; texts by code: string columns); :meth:`batch` makes their records' columns.

    A slot's statistics are a reference: ``>= 0`` the drained slot whose callback sums give them
    (a slot that shows a tensor again names the slot that first showed it), ``-1`` none, ``<= -2``
    ``stats[-2 - ref]``: a dict (statistics taken at the flush, filled before :meth:`batch`) or an
    int, the key of sums landed in :attr:`landed` (finished here, all at once). A slot's
    fingerprint is a reference of the same kind: the callback's of a drained slot, none, or
    ``fingerprints[-2 - ref]`` (``None`` where it was not delivered)."""

    slots: np.ndarray
    """The drained index of each recorded slot."""
    arg_codes: np.ndarray
    args: pa.RecordBatch
    """By code: ``arg`` (``0``, ``1.2``, ``out``), ``io`` (``input``) and ``io_arg`` (``input.0``)."""
    value_ids: np.ndarray
    view_of: np.ndarray
    """-1: none."""
    stats_refs: np.ndarray
    stats: list[dict[str, Any] | int]
    fingerprint_refs: np.ndarray
    fingerprints: list[int | None]
    error_codes: np.ndarray
    errors: pa.Array
    """``capture_error`` by code (0: none)."""
    unread_codes: np.ndarray
    unread: pa.Array
    """``extra`` by code: why a slot was described and not read (:func:`unread_text`; 0: read)."""
    overrides: SlotOverrides | None = None
    """Slots whose fields Python gave (their flags say no drained description): they replace the
    drained ones."""
    tensors: SavedTensors | None = None
    """With ``task="tensor"``: each slot's saved tensor."""
    landed: Any = None
    """The ``stats_table.LandedSums`` whose keys :attr:`stats` holds, if any."""

    def batch(
        self,
        ops: Any,
        calls: dict[str, pa.Array],
        seqs: np.ndarray,
        *,
        step: int,
        rank: int,
        dtype_names: dict[int, str],
        device_name: Callable[[int, int], str],
        flagged: int,
        valued: int,
        laid_out: int,
        fixed: FixedColumns | None = None,
    ) -> pa.RecordBatch:
        """The recorded slots' records. ``ops``: the drained ``ObservedOps``; ``calls``: the call's
        fields by name (``RowNames.columns``), a drained row each, ``seqs`` its ``seq``; ``flagged``: the slots
        whose ``slot_flag`` is not it (subclasses, nested tensors, values) have no shape, stride or
        device; ``valued``: the ``slot_flag`` of a value slot (a non-tensor argument or result: a
        record of kind ``value``, its ``value`` the JSON text ``CaptureSession`` writes); ``laid_out``:
        the slots whose ``slot_flag`` is it or more (a tensor with no strides: sparse) have their
        dtype, shape and device, no stride; ``fixed``: the columns the structure sets, kept from the
        last drain of the same structure (and kept for the next)."""
        count = len(self.slots)
        slots = self.slots
        rows = np.asarray(ops.slot_row, np.int64).take(slots) - ops.first_row
        flags = np.asarray(ops.slot_flag).take(slots)
        unstrided, values = flags != flagged, flags == valued
        undescribed = unstrided & (flags < laid_out)
        versions = np.asarray(ops.slot_version, np.int64).take(slots)
        device_types, device_indices = np.asarray(ops.slot_device_type, np.int64), np.asarray(ops.slot_device_index)
        devices = device_types.take(slots) * _INDICES + device_indices.take(slots) + 1
        drained = (ops.slot_dtype, ops.slot_ndim, ops.shape, ops.stride)
        structure = [slots, rows, flags, devices, self.arg_codes, *map(np.asarray, drained)]
        keeps = fixed is not None and self.overrides is None  # patched slots: made each drain
        shared = fixed.get(calls, structure) if keeps else None
        if shared is None:
            args = self.args.take(array(self.arg_codes))
            by_row = pa.RecordBatch.from_pydict(calls).take(array(rows))
            shared = {
                "name": pc.binary_join_element_wise(by_row.column("call_name"), args.column("io_arg"), text("/")),
                "rank": int_column(rank, count),
                **{name: by_row.column(name) for name in by_row.schema.names if name != "call_name"},
                "io": args.column("io"),
                "arg": args.column("arg"),
                "kind": _kinds().take(array(values.astype(np.int64))),
                "dtype": _named(np.asarray(ops.slot_dtype)[slots], dtype_names.get),
                "shape": _sizes(ops.shape, ops.slot_ndim, slots, undescribed),
                "stride": _sizes(ops.stride, ops.slot_ndim, slots, unstrided),
                "device": _named(devices, lambda key: device_name(key // _INDICES, key % _INDICES - 1), undescribed),
                "capture": pa.repeat(text("eager"), count),
            }
            if keeps:
                fixed.put(calls, structure, shared)
        columns = {
            **shared,
            "step": int_column(step, count),
            "seq": array(np.asarray(seqs, np.int64).take(rows)),
            "capture_error": _by_code(self.errors, self.error_codes),
            "value_id": array(self.value_ids, _INT, values),
            "version": array(versions, _INT, versions < 0),
            "view_of": array(self.view_of, _INT, self.view_of < 0),
            "extra": _by_code(self.unread, self.unread_codes),
        }
        if self.overrides is not None:
            self.overrides.patch(columns)
        if values.any():
            columns["value"] = fixed.value_column(ops, slots, values) if fixed is not None else _values(ops, slots, values)
        if (self.fingerprint_refs != -1).any():
            columns["checksum"] = self._checksum_column(ops)
        stats, odd = self._stats_column(ops) if (self.stats_refs != -1).any() else (null_column(count, STATS_TYPE), {})
        if self.tensors is not None:
            columns.update(self.tensors.columns(odd))
        return columns_batch(count, columns, stats, odd)

    def _stats_column(self, ops: Any) -> tuple[pa.StructArray, dict[int, dict[str, Any]]]:
        """The statistics column by reference (the class docstring), and the rows whose statistics
        the column cannot hold exactly (kept whole in ``json_fields``, as ``records_batch`` keeps them).
        The referenced sums are gathered first and finished once, a recorded slot each; statistics
        taken at the flush (tensors the callback did not sum) and sums landed before it (those staged:
        finished once too) replace their rows after."""
        refs = self.stats_refs
        column = _finished(finish_sums(refs, ops.stats, ops.slot_ndim, ops.shape))
        if not self.stats:
            return column, {}
        taken = self.stats
        keyed = np.fromiter((type(stats) is int for stats in taken), bool, len(taken))
        where = np.empty(len(taken), np.int64)  # each entry's row after the column's
        pieces, start = [column], len(refs)
        dicts, keys = np.flatnonzero(~keyed), np.flatnonzero(keyed)
        odd_dicts: dict[int, dict[str, Any]] = {}
        if dicts.size:
            pieces.append(stats_array([taken[entry] for entry in dicts.tolist()], odd_dicts))  # type: ignore[misc]
            where[dicts] = start + np.arange(dicts.size)
            start += dicts.size
        if keys.size:  # sums landed: finished in one call, as the callback's
            numels = self.landed.numels
            rows = np.array([taken[entry] for entry in keys.tolist()], np.int64)
            pieces.append(_finished(finish_sums(rows, self.landed.sums.reshape(-1), np.ones(len(numels), np.int8), numels)))
            where[keys] = start + np.arange(keys.size)
        index = np.where(refs <= -2, where[np.maximum(-2 - refs, 0)], np.arange(len(refs)))
        odd = {}
        if odd_dicts:  # rare: statistics of huge ints (beyond a float's exact ints)
            place = {entry: at for at, entry in enumerate(dicts.tolist())}
            odd = {row: odd_dicts[at] for row, ref in enumerate(refs.tolist()) if (at := place.get(-2 - ref, -1)) in odd_dicts}
        return pa.concat_arrays(pieces).take(array(index)), odd

    def _checksum_column(self, ops: Any) -> pa.Array:
        """The ``checksum`` column by reference (the class docstring): 16 lowercase hex digits,
        spelled once a recorded slot from the gathered fingerprints."""
        refs = self.fingerprint_refs
        values = np.asarray(ops.slot_fingerprint, np.int64).view(np.uint64)[np.maximum(refs, 0)]
        missing = refs == -1
        taken = np.flatnonzero(refs <= -2)
        if taken.size:  # taken at the flush (rare): None where it was not delivered
            delivered = [self.fingerprints[entry] for entry in (-2 - refs[taken]).tolist()]
            values[taken] = np.array([value or 0 for value in delivered], np.uint64)
            missing[taken] = [value is None for value in delivered]
        return _hex_digits(values, missing)


@functools.cache
def _kinds() -> pa.Array:
    """``kind`` by whether a slot holds a value (made once)."""
    return strings(["tensor", "value"])


def _values(ops: Any, slots: np.ndarray, values: np.ndarray) -> pa.DictionaryArray:
    """The ``value`` column: each value slot's JSON text as eager capture writes it, none elsewhere,
    as the dictionary a records file stores (:data:`~torchdebug.store._record_columns.VALUE_CODES`):
    the drain's distinct texts, each converted once, and each slot's index among them, no gather."""
    return pa.DictionaryArray.from_arrays(_value_indices(ops, slots, values), _value_dictionary(ops.value_texts))


def _value_indices(ops: Any, slots: np.ndarray, values: np.ndarray) -> pa.Array:
    """Each slot's index among the drain's value texts, empty where it holds a tensor."""
    return array(np.where(values, np.asarray(ops.slot_value, np.int64)[slots], 0), pa.int32(), ~values)


def _value_dictionary(texts: list[str]) -> pa.Array:
    """The drain's distinct value texts (the observer's), each as eager capture writes it."""
    return strings([_value_text(text) for text in texts])


@functools.lru_cache(maxsize=1 << 16)
def _value_text(text: str) -> str:
    """The observer's JSON text of a value (``observer.cpp``: a float in the fewest digits that read
    back as it, a complex number as ``{"complex": [real, imag]}``) as ``CaptureSession`` writes the
    Python value: ``json_value``, then ``json_text``.
    A float alone (the observer writes one with a point, an exponent, or as ``NaN``, ``Infinity``;
    an optimizer's step sizes are new texts every step) is read with ``float``, as ``json`` would,
    and a finite one written as ``json`` writes it, ``float.__repr__``, without the encoder ``json``
    makes at each call."""
    if text[:1] in _NUMBER_STARTS and ("." in text or "e" in text or text in _NOT_FINITE):
        number = float(text)
        return repr(number) if math.isfinite(number) else json_text(number)
    return json_text(json_value(json.loads(text, object_hook=_complex)))


_NUMBER_STARTS = frozenset("-0123456789NI")
"""The first characters of a number's JSON text (``NaN``, ``Infinity``); a string, list, object,
bool or null begins otherwise."""
_NOT_FINITE = frozenset(("NaN", "Infinity", "-Infinity"))


def _complex(pair: dict[str, Any]) -> Any:
    return complex(*pair["complex"]) if pair.keys() == {"complex"} else pair


_HEX_PAIRS = np.array([ord(f"{byte:02x}"[0]) | ord(f"{byte:02x}"[1]) << 8 for byte in range(256)], "<u2")
"""Each byte's two hex digits, as the two bytes (in memory order) of a little-endian ``uint16``."""


def _hex_digits(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    """``checksum.hex_digits`` of each unsigned 64-bit value, as one string column (no Python per
    value): its bytes most significant first, each spelled by a table; ``missing`` rows are null
    (and empty)."""
    present = ~missing
    digits = _HEX_PAIRS[values[present].astype(">u8").view(np.uint8)]
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(16 * present, out=offsets[1:])
    return pa.StringArray.from_buffers(
        len(values), pa.py_buffer(offsets), pa.py_buffer(digits.tobytes()), bitmap(missing), int(missing.sum())
    )


def _by_code(texts: pa.Array, codes: np.ndarray) -> pa.Array:
    """``texts[code]`` of each slot; code 0 (and ``texts[0]``) is none: mostly all of them."""
    return texts.take(array(codes)) if codes.any() else null_column(len(codes), _STRING)


def _named(codes: np.ndarray, name: Callable[[int], str], empty: np.ndarray | None = None) -> pa.Array:
    """A string column from per-slot codes: each distinct code named once (``empty``: rows left
    empty, their codes never named)."""
    if empty is not None and empty.any():
        if empty.all():
            return null_column(len(codes), _STRING)
        codes = np.where(empty, codes[~empty][0], codes)
    distinct, inverse = np.unique(codes, return_inverse=True)
    dictionary = strings([name(code) for code in distinct.tolist()])
    return dictionary.take(array(inverse.reshape(-1).astype(np.int64), missing=empty))


def extra_text(extra: dict[str, Any]) -> str:
    """A record's ``extra`` as the JSON text the store writes (for a slot described outside the drain's arrays)."""
    return json_text(extra)


_UNREAD_TEXTS: dict[str, str] = {}


def unread_text(why: str) -> str:
    """The ``extra`` of a slot described and not read: ``{"unread": why}`` as JSON."""
    text = _UNREAD_TEXTS.get(why)
    if text is None:
        text = _UNREAD_TEXTS[why] = json_text({UNREAD: why})
    return text


def _offsets(ndim: Any) -> np.ndarray:
    offsets = np.zeros(len(ndim) + 1, np.int32)
    np.cumsum(np.asarray(ndim), out=offsets[1:])
    return offsets


def _sizes(values: Any, ndim: Any, slots: np.ndarray, empty: np.ndarray) -> pa.Array:
    """The shapes (or strides) of the recorded slots as a list column, from the drained flat sizes."""
    every = pa.ListArray.from_arrays(array(_offsets(ndim)), array(np.asarray(values), _INT))
    return every.take(array(slots, missing=empty))


def _finished(done: FinishedStats) -> pa.StructArray:
    """The statistics column of records finished by ``stats.c`` (``fused_stats.finish_sums``): each
    field's values an Arrow buffer as they are, with one of its three validity bitmaps."""
    count = done.values.shape[1]
    present, some, mean = (pa.py_buffer(bitmap) if nulls else None for bitmap, nulls in zip(done.validity, done.nulls.tolist()))
    masks = (some, some, mean, some)
    children = [pa.Array.from_buffers(_FLOAT, count, [mask, pa.py_buffer(field)]) for mask, field in zip(masks, done.values)]
    children += [pa.Array.from_buffers(_INT, count, [present, pa.py_buffer(field)]) for field in done.counts]
    return pa.Array.from_buffers(STATS_TYPE, count, [present], children=children)
