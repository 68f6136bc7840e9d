"""The native path's statistics column, finished from the callback's sums in one pass of ``stats.c``
(``fused_stats.finish_sums``, made a column by ``store/_slot_columns.py``), holds what
``stats_from_sums`` gives one slot at a time, bit for bit, and the element counts it divides by are
the slots' sizes' products (and a staging's sums landed by key, beside dicts taken at the flush, each
at its slots); its ``checksum`` column spells each fingerprint as ``hex_digits`` does,
by reference; its ``value`` column is made as the codes a records file stores."""

from __future__ import annotations

import dataclasses
import json
import math
from array import array
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from torchdebug.checksum import hex_digits
from torchdebug.native.fused_stats import finish_sums
from torchdebug.slots import json_value
from torchdebug.stats._schema import IDENTITY, stats_from_sums
from torchdebug.stats_table import LandedSums
from torchdebug.store._arrow_buffers import strings
from torchdebug.store._record_columns import SCHEMA, STATS_TYPE, VALUE_CODES, columns_batch, plain_values, records_batch
from torchdebug.store._record_file import RecordFile, read_records
from torchdebug.store._record_json import json_text
from torchdebug.store._slot_columns import SlotColumns, _complex, _finished, _value_text, _values

SUMS = [  # min, max, sum, squares, nan, posinf, neginf, zeros
    ((-1.5, 2.25, 0.1 + 0.2, 7.0, 0.0, 0.0, 0.0, 1.0), 6),
    ((-1.5, 2.25, 1.0, 3.0, 2.0, 0.0, 0.0, 0.0), 3),  # NaN elements: the mean of the others
    ((math.inf, -math.inf, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0), 4),  # every element NaN: no value statistics
    ((-math.inf, math.inf, math.nan, math.inf, 0.0, 1.0, 1.0, 0.0), 2),  # inf - inf: the mean is NaN, so empty
    (IDENTITY, 0),  # no elements
    ((1e-300, 3e300, 1e308, math.inf, 0.0, 0.0, 0.0, 0.0), 3),
]


def test_statistics_from_sums_in_one_pass_equal_stats_from_sums_bit_for_bit():
    sums = array("d", [value for row, _ in SUMS for value in row])
    shape = array("q", [count for _, count in SUMS])  # a dimension of count elements a row
    done = finish_sums(np.arange(len(SUMS)), sums, array("b", [1] * len(SUMS)), shape)
    column = _finished(done).to_pylist()
    for (row, count), got in zip(SUMS, column):
        expected = stats_from_sums(row, count)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert type(got[key]) is type(value) and (value is None or repr(got[key]) == repr(value)), (key, got, expected)


def test_the_statistics_column_takes_each_slots_by_reference_sums_none_or_taken_at_the_flush():
    sums = np.array([row for row, _ in SUMS], np.float64)
    shapes = [(2, 3), (3,), (4, 1), (2,), (0,), (3,)]  # the element counts of SUMS
    taken = {**stats_from_sums(SUMS[0][0], 6), "min": -7.0}
    huge = {**stats_from_sums((0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0), 1, integral=True), "max": 2**62 + 1}  # no float holds it
    refs = np.array([3, -1, 0, -2, 5, 0, -1, -3], np.int64)
    unused, no_text = np.zeros(len(refs), np.int64), pa.array([None], pa.string())
    args = pa.RecordBatch.from_pydict({})
    columns = SlotColumns(unused, unused, args, unused, unused, refs, [taken, huge], unused, [], unused, no_text, unused, no_text)
    drained = SimpleNamespace(
        stats=array("d", sums.reshape(-1)),
        shape=array("q", [size for shape in shapes for size in shape]),
        slot_ndim=array("b", [len(shape) for shape in shapes]),
    )
    column, odd = columns._stats_column(drained)
    finished = [stats_from_sums(row, count) for row, count in SUMS]
    assert column.to_pylist()[:7] == [finished[3], None, finished[0], taken, finished[5], finished[0], None]
    assert [column.field(key)[row].as_py() for key in ("max", "nan") for row in (1, 6)] == [None] * 4  # nothing under a null row
    assert odd == {7: {"stats": huge}}  # kept whole beside the column
    summed = dataclasses.replace(columns, stats_refs=np.array([3, -1, 0, -1], np.int64), stats=[])
    column, _ = summed._stats_column(drained)
    assert column.to_pylist() == [finished[3], None, finished[0], None]
    stored = [np.frombuffer(column.field(key).buffers()[1], np.int64)[[1, 3]] for key in ("max", "nan")]
    assert all((values == 0).all() for values in stored)  # a row without sums stores zeros: they compress best


def test_taken_statistics_mix_dicts_and_keys_of_sums_landed_each_in_its_rows():
    """Taken entries are dicts (statistics taken at the flush) or keys of sums landed before it
    (``stats_table.LandedSums``, a staging's), in any order: each slot gets its own entry's, the landed
    finished as the callback's are, and a dict no column holds exactly kept whole at its own rows."""
    landed = LandedSums()
    landed.expect([0, 1, 2])
    for key, (row, count) in enumerate(SUMS[:3]):
        landed.land(key, row, count)
    taken = {**stats_from_sums(SUMS[0][0], 6), "min": -7.0}
    huge = {**stats_from_sums((0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0), 1, integral=True), "max": 2**62 + 1}
    entries = [2, taken, 0, huge, 1]
    refs = np.array([-6, -5, 0, -2, -1, -3, -4, -5, -3], np.int64)
    unused, no_text = np.zeros(len(refs), np.int64), pa.array([None], pa.string())
    args = pa.RecordBatch.from_pydict({})
    columns = SlotColumns(
        unused, unused, args, unused, unused, refs, entries, unused, [], unused, no_text, unused, no_text, landed=landed
    )
    drained = SimpleNamespace(stats=array("d", SUMS[5][0]), shape=array("q", [3]), slot_ndim=array("b", [1]))
    column, odd = columns._stats_column(drained)
    finished = [stats_from_sums(row, count) for row, count in SUMS]
    got = column.to_pylist()
    held = {**huge, "max": None}  # what the column holds of it: all but the value no float holds
    assert got == [finished[1], held, finished[5], finished[2], None, taken, finished[0], held, taken]
    assert odd == {1: {"stats": huge}, 7: {"stats": huge}}  # kept whole beside the column, at its rows


def test_the_elements_of_each_drained_slot_are_its_sizes_product_and_one_for_no_sizes():
    shapes = [(2, 3), (), (4,), (0, 5), (), (7, 1, 2), ()]
    flat = array("q", [size for shape in shapes for size in shape])
    ndim = array("b", [len(shape) for shape in shapes])
    ones = array("d", [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0] * len(shapes))  # a sum of 1: the mean is 1 / elements
    means = _finished(finish_sums(np.arange(len(shapes))[::-1], ones, ndim, flat)).field("mean").to_pylist()[::-1]
    assert means == [None if math.prod(shape) == 0 else 1 / math.prod(shape) for shape in shapes]


def test_finishing_sums_refuses_references_and_sizes_beyond_the_drained_rows():
    sums, ndim, shape = array("d", [0.0] * 16), array("b", [1, 2]), array("q", [3, 1, 2])
    assert finish_sums(np.array([1, -1, 0]), sums, ndim, shape).nulls.tolist() == [1, 1, 1]
    for refs, sizes in (([2], shape), ([0], array("q", [3, 1]))):
        with pytest.raises(ValueError, match="do not fit"):
            finish_sums(np.array(refs), sums, ndim, sizes)


def test_the_checksum_column_holds_each_slots_fingerprint_by_reference_as_hex_digits():
    drained = [0, 1, -1, 0x0123456789ABCDEF, -(1 << 63)]  # int64, as the observer drains them
    refs = np.array([3, 0, -1, 2, 4, -2, -3, 1], np.int64)
    unused, no_text = np.zeros(len(refs), np.int64), pa.array([None], pa.string())
    columns = SlotColumns(
        slots=unused,
        arg_codes=unused,
        args=pa.RecordBatch.from_pydict({}),
        value_ids=unused,
        view_of=unused,
        stats_refs=unused,
        stats=[],
        fingerprint_refs=refs,
        fingerprints=[0xFEDCBA9876543210, None],
        error_codes=unused,
        errors=no_text,
        unread_codes=unused,
        unread=no_text,
    )
    column = columns._checksum_column(SimpleNamespace(slot_fingerprint=array("q", drained)))
    assert column.buffers()[2].size == 16 * (len(refs) - 2)  # the null rows hold no digits on disk
    got = column.to_pylist()
    unsigned = [value & 0xFFFFFFFFFFFFFFFF for value in drained]
    expected = [hex_digits(unsigned[3]), hex_digits(0), None, hex_digits(unsigned[2]), hex_digits(unsigned[4])]
    assert got == [*expected, "fedcba9876543210", None, "0000000000000001"]  # an entry not delivered: none


def test_a_value_text_is_written_as_capture_writes_the_python_value_floats_read_directly_included():
    """The observer's texts (floats with 17 digits, always with a point or an exponent) become what
    ``CaptureSession`` writes for the value; floats alone take a shorter road that must agree."""
    floats = [0.1, -2.5e-05, 1e16, 123456.0, 1.0, -0.0, 0.9999999999999999, 5e-324, 1.7976931348623157e308]
    texts = [f"{value:.17g}" + ("" if any(c in f"{value:.17g}" for c in ".e") else ".0") for value in floats]
    texts += ["NaN", "Infinity", "-Infinity", "3", "-7", "true", "null", '"mean"', "[1.5,2]", '{"complex":[1.0,-2.0]}', '"-1.5"']
    for text in texts:
        assert _value_text(text) == json_text(json_value(json.loads(text, object_hook=_complex))), text
    assert _value_text("3") == "3" and _value_text("1.0") == "1.0" and _value_text("0.10000000000000001") == "0.1"


def test_the_value_column_is_made_as_codes_that_a_records_file_keeps_and_a_join_decodes(tmp_path):
    """The native path's ``value`` column is the drain's distinct texts and an index per slot (no text
    gathered per slot): the batch says so in its schema, a records file stores it as it is and reads
    it back as the texts, and ``plain_values`` gives the batch of ``SCHEMA`` that joins Python's records."""
    ops = SimpleNamespace(value_texts=["1.0000000000000001e-05", "[2,16]", "true"], slot_value=array("q", [9, 1, 0, 9, 2, 1]))
    slots, values = np.array([1, 2, 3, 4, 5]), np.array([True, True, False, True, True])
    column = _values(ops, slots, values)
    assert column.type == VALUE_CODES and column.dictionary.to_pylist() == ["1e-05", "[2,16]", "true"]
    expected = ["[2,16]", "1e-05", None, "true", "[2,16]"]
    assert column.to_pylist() == expected
    batch = columns_batch(len(slots), {"value": column}, pa.nulls(len(slots), STATS_TYPE), {})
    assert batch.schema.field("value").type == VALUE_CODES
    path = tmp_path / "records.arrow"
    records = RecordFile(path)
    records.append(batch)
    records.append(columns_batch(2, {"value": strings(["3", None])}, pa.nulls(2, STATS_TYPE), {}))  # Python's: encoded to write
    records.close()
    table, _ = read_records(path)
    assert table.column("value").to_pylist() == [*expected, "3", None]
    joined = pa.Table.from_batches([plain_values(batch), records_batch([])])
    assert joined.schema == SCHEMA and joined.column("value").to_pylist() == expected
