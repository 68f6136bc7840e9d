"""Records as Arrow columns, and Arrow columns back as records.

A dump stores its records as an Arrow IPC stream (``records.arrows``, ``_record_file.py``): one
compressed record batch per flush, in the columns of :data:`SCHEMA`; whatever a typed column cannot
hold exactly goes into the row's ``json_fields`` as JSON, so a batch always encodes. The columns:
docs/format.md; why Arrow, and how reading shares strings, shapes and statistics between records:
docs/architecture.md, "Decisions and their reasons" ("Records as Arrow columns").
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from itertools import repeat, takewhile
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from torchdebug.gc_paused import paused_gc
from torchdebug.records import SCHEMA_VERSION, Record
from torchdebug.stats import STAT_KEYS, VALUE_KEYS
from torchdebug.store._arrow_buffers import EXACT_IN_FLOAT, array, null_column, numbers, strings, valid
from torchdebug.store._arrow_buffers import column as arrow_column
from torchdebug.store._arrow_buffers import text as arrow_text
from torchdebug.store._record_json import json_text
from torchdebug.store._shared_keys import shared_keys_dict

__all__ = [
    "SCHEMA",
    "STATS_TYPE",
    "VALUE_CODES",
    "columns_batch",
    "int_column",
    "plain_values",
    "records_batch",
    "records_from_table",
    "records_table",
    "stats_array",
]

_STRING, _INT, _SIZES = pa.string(), pa.int64(), pa.list_(pa.int64())
STATS_TYPE = pa.struct([(key, pa.float64() if key in VALUE_KEYS else _INT) for key in STAT_KEYS])
"""The type of the ``stats`` column."""

_PLAIN = {
    "name": _STRING,
    "step": _INT,
    "rank": _INT,
    "phase": _STRING,
    "module": _STRING,
    "op": _STRING,
    "call": _INT,
    "seq": _INT,
    "io": _STRING,
    "arg": _STRING,
    "kind": _STRING,
    "dtype": _STRING,
    "shape": _SIZES,
    "stride": _SIZES,
    "device": _STRING,
    "requires_grad": pa.bool_(),
    "checksum": _STRING,
    "sampled": _INT,
    "stack": _STRING,
    "source": _STRING,
    "fwd": _STRING,
    "node": _STRING,
    "capture": _STRING,
    "capture_error": _STRING,
    "value_id": _INT,
    "version": _INT,
    "view_of": _INT,
}
"""Record fields stored as they are, with their column type."""

SCHEMA = pa.schema(
    [
        *((name, kind) for name, kind in _PLAIN.items() if name not in ("checksum", "sampled")),
        ("stats", STATS_TYPE),
        ("checksum", _STRING),
        ("tensor_file", _STRING),
        ("tensor_key", _STRING),
        ("sampled", _INT),
        ("value", _STRING),
        ("extra", _STRING),
        ("json_fields", _STRING),
    ],
    metadata={"torchdebug.schema_version": str(SCHEMA_VERSION)},
)
"""The columns of a dump's records (``docs/format.md``)."""

VALUE_CODES = pa.dictionary(pa.int32(), _STRING)
"""The ``value`` column as the native path makes it, and a records file stores it: an index per
record into the step's distinct texts (no text gathered per record, none encoded again to write)."""
_CODED_SCHEMA = SCHEMA.set(SCHEMA.get_field_index("value"), pa.field("value", VALUE_CODES))
_SCHEMA_COLUMNS = tuple(zip(SCHEMA.names, SCHEMA.types))
"""Each column's name and type, in order (``SCHEMA.types`` makes a Python object a type each time asked)."""

_GETTERS = {name: attrgetter(name) for name in _PLAIN}
"""Each plain field's getter: a column is made from its field of every record, with no tuple per
record (7,302 records of a statistics step, batched in a loop: 2.9 µs a record, against 7.9 with a
tuple a record alive until the columns were made, the garbage collector's passes over them)."""
_UNIQUE = frozenset({"name"})
"""String columns whose values rarely repeat within a dump: read as they are, not through a
dictionary, and interned (two dumps of one program, the sides of a compare, hold the same names)."""
_SHARED_INTS = frozenset({"seq", "call", "value_id", "version", "view_of"})
"""Int columns whose values repeat beyond the ints Python keeps one of (-5 to 256): one int per
distinct value (the slots of one call share its ``seq``, the slots of one tensor its ``value_id``)."""
_INTEGRAL_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"})
"""dtypes whose statistics hold ints for ``min`` and ``max`` (``stats_from_sums(integral=True)``)."""
_TENSOR_KEYS = frozenset({"file", "key"})


# -- records to a batch ------------------------------------------------------------------------
def records_batch(records: Sequence[Record]) -> pa.RecordBatch:
    """``records`` as one record batch of :data:`SCHEMA`; fields the typed columns cannot hold exactly
    (a symbolic size in a shape, a float where an int goes, statistics with other keys than the
    schema's, a tensor reference with a view) go into the row's ``json_fields`` (``record_json``'s
    rules). Runs on the capturing thread: the column lists are built under the GIL, the writer thread
    compresses and writes with the GIL released."""
    count = len(records)
    odd: dict[int, dict[str, Any]] = {}  # row -> the fields the columns cannot hold
    columns: dict[str, pa.Array] = {}
    for name, kind in _PLAIN.items():
        columns[name] = _array(name, list(map(_GETTERS[name], records)), kind, odd)
    columns["stats"] = stats_array([r.stats for r in records], odd)
    tensors = [r.tensor for r in records]
    for row, tensor in enumerate(tensors):
        if tensor is not None and not (tensor.keys() <= _TENSOR_KEYS and all(v.__class__ is str for v in tensor.values())):
            odd.setdefault(row, {})["tensor"] = tensor
    columns["tensor_file"] = strings([t.get("file") if t else None for t in tensors])
    columns["tensor_key"] = strings([t.get("key") if t else None for t in tensors])
    columns["value"] = strings([None if r.value is None else json_text(r.value) for r in records])
    columns["extra"] = strings([json_text(r.extra) if r.extra else None for r in records])
    columns["json_fields"] = _json_fields(count, odd)
    return pa.RecordBatch.from_arrays([columns[name] for name in SCHEMA.names], schema=SCHEMA)


def columns_batch(
    count: int, columns: dict[str, pa.Array], stats: pa.StructArray, odd: dict[int, dict[str, Any]]
) -> pa.RecordBatch:
    """A record batch of :data:`SCHEMA` from columns built elsewhere (the native path's, from its
    drained arrays: ``_slot_columns.py``): ``columns`` by name, each of its schema type (``value``
    also :data:`VALUE_CODES`, which the batch's schema then says), the absent ones empty; ``stats``
    the statistics column, ``odd`` the fields of rows the columns cannot hold (``json_fields``, as
    :func:`records_batch` keeps them; :func:`stats_array` gives both)."""
    columns = {**columns, "stats": stats, "json_fields": _json_fields(count, odd)}
    arrays = [columns[name] if name in columns else null_column(count, kind) for name, kind in _SCHEMA_COLUMNS]
    coded = "value" in columns and pa.types.is_dictionary(columns["value"].type)
    return pa.RecordBatch.from_arrays(arrays, schema=_CODED_SCHEMA if coded else SCHEMA)


def plain_values(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` in :data:`SCHEMA`: its ``value`` column decoded where :func:`columns_batch` was handed
    it as :data:`VALUE_CODES` (to join records made in Python)."""
    if batch.schema.field("value").type != VALUE_CODES:
        return batch
    at = batch.schema.get_field_index("value")
    return batch.set_column(at, SCHEMA.field("value"), batch.column(at).dictionary_decode())


def int_column(value: int, count: int) -> pa.Array:
    """An int column of ``count`` times ``value`` (a batch's ``step``, ``rank``): one numpy fill,
    where ``pa.repeat`` appends the values one by one (0.3 ms at 57k records)."""
    return array(np.full(count, value, np.int64))


def _json_fields(count: int, odd: dict[int, dict[str, Any]]) -> pa.Array:
    """The ``json_fields`` column: each row's fields the typed columns cannot hold, as JSON."""
    if not odd:  # almost always
        return null_column(count, _STRING)
    json_fields = [None] * count
    for row, fields in odd.items():
        json_fields[row] = json_text(fields)
    return strings(json_fields)


def records_table(records: Sequence[Record]) -> pa.Table:
    """``records`` as a table of :data:`SCHEMA` (the table of a dump written as JSON lines, or of another tool's)."""
    return pa.Table.from_batches([records_batch(records)])


def _array(name: str, values: Sequence[Any], kind: pa.DataType, odd: dict[int, dict[str, Any]]) -> pa.Array:
    """A column of ``values``; those it cannot hold exactly (or at all) are left empty and kept in ``odd``."""
    try:  # (2.5 or True in an int column, a symbolic size in a shape: TypeError; kept exactly below)
        return arrow_column(values, kind)
    except (TypeError, ValueError, OverflowError):
        pass
    kept = []
    for row, value in enumerate(values):
        if value is not None and not _exact(value, kind):
            odd.setdefault(row, {})[name] = value
            value = None
        kept.append(value)
    return arrow_column(kept, kind)


def _exact(value: Any, kind: pa.DataType) -> bool:
    if kind == _INT:
        return value.__class__ is int
    if kind == _SIZES:
        return isinstance(value, list) and all(size.__class__ is int for size in value)
    if kind == _STRING:
        return isinstance(value, str)
    return value.__class__ is bool


def stats_array(stats: list[dict[str, Any] | None], odd: dict[int, dict[str, Any]]) -> pa.StructArray:
    """The statistics as a struct column, empty where a record has none. Statistics with other keys
    (written before a count existed, or by another tool) or values the columns cannot hold are kept
    whole in ``odd``; the columns get what they can of them."""
    present = [s for s in stats if s is not None]
    usual = sum(map(len, present)) == len(STAT_KEYS) * len(present)
    try:
        if not usual:
            raise KeyError
        children = []
        for key, kind in zip(STAT_KEYS, STATS_TYPE):
            column = [s[key] if s is not None else None for s in stats]
            children.append(arrow_column(column, kind.type))  # (a count that is not an int: TypeError, kept exactly below)
    except (KeyError, TypeError, ValueError, OverflowError):
        children = []
        for key, kind in zip(STAT_KEYS, STATS_TYPE):
            column = []
            for row, s in enumerate(stats):
                value = s.get(key) if s is not None else None
                if s is not None and (s.keys() != _STAT_KEY_SET or not _number(value, kind.type)):
                    odd.setdefault(row, {})["stats"] = s
                column.append(value if _number(value, kind.type) else None)
            children.append(arrow_column(column, kind.type))
    mask = array(np.fromiter((s is None for s in stats), bool, len(stats)))
    return pa.StructArray.from_arrays(children, fields=list(STATS_TYPE), mask=mask)


_STAT_KEY_SET = frozenset(STAT_KEYS)
_STAT_COUNTS = tuple((key, key not in VALUE_KEYS) for key in STAT_KEYS)
"""Each statistic's key, and whether it is a count (an int; the others are floats)."""


def _number(value: Any, kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` holds ``value`` exactly."""
    if value is None:
        return True
    if kind == _INT:
        return value.__class__ is int
    return value.__class__ is float or (value.__class__ is int and -EXACT_IN_FLOAT <= value <= EXACT_IN_FLOAT)


def _finite(stats: dict[str, Any]) -> bool:
    low, high = stats["min"], stats["max"]
    return low is not None and high is not None and math.isfinite(low) and math.isfinite(high)


# -- columns to records ------------------------------------------------------------------------
def records_from_table(table: pa.Table) -> list[Record]:
    """The records of a table of :data:`SCHEMA` (columns it lacks read as empty, columns it has
    beyond the schema go to each record's ``extra``), in row order. The columns are read chunk
    by chunk (a batch per flush), never concatenated.

    Records are built column by column, not row by row: repeated strings (phases, modules, ops,
    dtypes) become one shared string each, equal shapes and strides one shared list, equal statistics
    one shared dict, and the records without extra fields share one empty ``extra`` (a dict per record
    took 64 bytes of about 550). A record's containers are shared: replace them
    (``record.extra = {**record.extra, ...}``, as :func:`dataclasses.replace` does), never update them
    in place."""
    count = table.num_rows
    if not count:
        return []
    names = set(table.column_names)
    with paused_gc():
        columns = {name: _column(table.column(name), name) if name in names else None for name in _PLAIN}
        empty = [None] * count
        columns["stats"] = _stats_column(table.column("stats")) if "stats" in names else None
        columns["tensor"] = _tensor_column(table, names)
        columns["value"] = _json_column(table, "value", names)
        args = [empty if columns[field] is None else columns[field] for field in _FIELDS]
        records = list(map(Record, *args, repeat({}, count)))  # one empty ``extra`` for them all
        for name in names.difference(SCHEMA.names):
            _to_extra(records, name, table.column(name).to_pylist())
        if "extra" in names and table.column("extra").null_count < count:
            _to_extra(records, None, _json_column(table, "extra", names))
        if "json_fields" in names and table.column("json_fields").null_count < count:
            _apply_json_fields(records, _json_column(table, "json_fields", names))
        _integral_min_max(records, columns["dtype"], columns["stats"])
    return records


_FIELDS = tuple(takewhile(lambda name: name != "extra", Record.__dataclass_fields__))
"""Record fields before ``extra`` (the last), in the order ``Record`` takes them by position."""


def _column(array: pa.ChunkedArray, name: str) -> list[Any] | None:
    """A plain column as a list (``None`` when every value is empty)."""
    if array.null_count == len(array):
        return None
    kind = array.type
    if kind == _STRING:
        return list(map(sys.intern, array.to_pylist())) if name in _UNIQUE else _shared_strings(array)
    if kind == _SIZES:
        return _shared_lists(array)
    if kind == _INT and name in _SHARED_INTS:  # empty rows (the value slots' ids) read as None
        return _shared_strings(array, int)
    if kind == _INT and not array.null_count:
        values = numbers(array)
        if values.min() == values.max():  # one step, one rank: one int for every row
            return [int(values[0])] * len(values)
        return values.tolist()
    return array.to_pylist()


def _shared_strings(array: pa.ChunkedArray, decode: Callable[[Any], Any] = sys.intern) -> list[Any]:
    """Each distinct string (or int) once, ``decode``d (interned: the same object in every rank and dump read)."""
    encoded = pc.dictionary_encode(array)  # one dictionary, shared by every chunk
    distinct = encoded.chunk(0).dictionary.to_pylist()
    values = np.empty(len(distinct) + 1, dtype=object)  # the last one, None, for empty rows
    for i, text in enumerate(distinct):
        values[i] = decode(text)
    indices = [numbers(chunk.indices, fill=len(distinct)) for chunk in encoded.chunks]
    return values.take(np.concatenate(indices)).tolist()


def _shared_lists(array: pa.ChunkedArray) -> list[list[int] | None]:
    """Each distinct list of sizes once (a record's shape and stride are shared as capture shares
    them): the lists joined into text by Arrow, each distinct text parsed once."""
    return _shared_strings(pc.binary_join(array.cast(pa.list_(_STRING)), _COMMA), _sizes)


_COMMA = arrow_text(",")


def _sizes(joined: str) -> list[int]:
    return [int(size) for size in joined.split(",")] if joined else []


def _stats_column(array: pa.ChunkedArray) -> list[dict[str, Any] | None] | None:
    """The statistics dicts; equal statistics share one dict (as the records of one tensor do).

    Each row's statistics are found by their bits (and which are empty): Arrow hashes the rows as
    fixed-size keys, and a dict is made once per distinct key."""
    if array.null_count == len(array):
        return None
    count, width = len(array), len(STAT_KEYS)
    words = np.zeros((count, width + 1), np.int64)  # the values' bits, then a mask of the empty ones
    for i in range(width):
        child = pc.struct_field(array, [i])
        words[:, i] = numbers(child).view(np.int64)
        if child.null_count:
            words[:, width] |= (~valid(child)).astype(np.int64) << i
    if array.null_count:
        words[:, width] |= (~valid(array)).astype(np.int64) << width
    key_type = pa.binary(words.itemsize * (width + 1))
    encoded = pc.dictionary_encode(pa.FixedSizeBinaryArray.from_buffers(key_type, count, [None, pa.py_buffer(words)]))
    unique = np.frombuffer(encoded.dictionary.buffers()[1], np.int64, len(encoded.dictionary) * (width + 1))
    unique = unique.reshape(-1, width + 1)
    empty = unique[:, width]
    columns = []  # each statistic of the distinct rows: ints or floats from their bits, None where empty
    for i, (_, count_key) in enumerate(_STAT_COUNTS):
        column = (unique[:, i] if count_key else unique[:, i].view(np.float64)).astype(object)
        column[(empty >> i & 1).astype(bool)] = None
        columns.append(column.tolist())
    shared = [
        None if all_empty else shared_keys_dict(_Statistics, zip(STAT_KEYS, values))
        for values, all_empty in zip(zip(*columns), (empty >> width).tolist())
    ]
    return list(map(shared.__getitem__, numbers(encoded.indices).tolist()))


class _Statistics:
    """The kind of a read record's statistics (``torchdebug.store._shared_keys``)."""


def _tensor_column(table: pa.Table, names: set[str]) -> list[dict[str, str] | None] | None:
    files = _column(table.column("tensor_file"), "tensor_file") if "tensor_file" in names else None
    keys = _column(table.column("tensor_key"), "tensor_key") if "tensor_key" in names else None
    if files is None and keys is None:
        return None
    files = files or [None] * table.num_rows
    keys = keys or [None] * table.num_rows
    return [
        None
        if file is None and key is None
        else {"file": file, "key": key}
        if file is not None and key is not None
        else ({"file": file} if key is None else {"key": key})
        for file, key in zip(files, keys)
    ]


def _json_column(table: pa.Table, name: str, names: set[str]) -> list[Any] | None:
    """A column of JSON text decoded, each distinct text once (argument values repeat: sizes, dims)."""
    if name not in names:
        return None
    array = table.column(name)
    if array.null_count == len(array):
        return None
    return _shared_strings(array, json.loads)


def _to_extra(records: list[Record], name: str | None, values: list[Any] | None) -> None:
    """Add a column's values to each record's ``extra`` (``name`` ``None``: the values are dicts to merge)."""
    for record, value in zip(records, values or ()):
        if value is not None:
            record.extra = {**record.extra, **value} if name is None else {**record.extra, name: value}


def _apply_json_fields(records: list[Record], rows: list[dict[str, Any] | None]) -> None:
    for record, fields in zip(records, rows):
        if fields:
            for name, value in fields.items():
                setattr(record, name, value)


def _integral_min_max(records: list[Record], dtypes: list[str | None] | None, stats: list[Any] | None) -> None:
    """Statistics of integer and bool tensors hold ints for ``min`` and ``max``; the float64 column
    gives floats back."""
    if dtypes is None or stats is None:
        return
    converted: dict[int, dict[str, Any]] = {}  # by the identity of the shared dict: shared again
    for row in [row for row, dtype in enumerate(dtypes) if dtype in _INTEGRAL_DTYPES]:
        values = stats[row]
        if values is not None and records[row].stats is values and _finite(values):
            ints = converted.get(id(values))
            if ints is None:
                ints = converted[id(values)] = {**values, "min": int(values["min"]), "max": int(values["max"])}
            records[row].stats = ints
