"""A template's records as columns: each run's batch equals ``records_batch`` of its records."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from torchdebug.records import Record
from torchdebug.store import TemplateColumns
from torchdebug.store._record_columns import records_batch


def _template() -> list[Record]:
    """Records of every kind a graph run writes: tensors with statistics, one sharing another's
    row, one without, a value, a symbolic size the columns cannot hold."""
    common = dict(step=0, rank=0, phase="forward", module="fc", op="aten.addmm.default", call=0, capture="graph")
    return [
        Record(name="a/input.0", seq=0, io="input", arg="0", kind="tensor", dtype="float32", shape=[2, 3], **common),
        Record(name="a/input.1", seq=0, io="input", arg="1", kind="tensor", dtype="int64", shape=[2], **common),
        Record(name="a/input.2", seq=0, io="input", arg="2", kind="value", value=1.5, **common),
        Record(name="a/output.0", seq=0, io="output", arg="0", kind="tensor", dtype="float32", shape=["s0", 3], **common),
        Record(
            name="a/output.1",
            seq=0,
            io="output",
            arg="1",
            kind="tensor",
            dtype="float32",
            shape=[1],
            extra={"graph": "m/forward"},
            **common,
        ),
    ]


STAT_ROWS = [0, 1, -1, 0, 2]
HELD = [0, 1, 3, 4]


def _run_records(step: int, rows: list[dict], ids: list) -> list[Record]:
    records = []
    for position, (record, row) in enumerate(zip(_template(), STAT_ROWS)):
        record = dataclasses.replace(record, step=step, stats=rows[row] if row >= 0 else None)
        value = ids[HELD.index(position)] if position in HELD else None
        if value is not None:
            record.value_id, record.version, record.view_of = value
        records.append(record)
    return records


def test_each_runs_batch_equals_the_records_batch_of_its_records() -> None:
    columns = TemplateColumns(_template(), STAT_ROWS, HELD)
    stats = dict(min=-1.0, max=2.0, mean=0.5, norm=3.0, nan=0, posinf=0, neginf=0, zeros=1)
    huge = dict(stats, min=-(2**70), max=2**70)  # beyond what the float columns hold exactly: kept whole
    runs = [
        (0, [stats, dict(stats, min=0.0), {}], [(0, 0, None), (1, 2, None), (2, 0, 0), None]),
        (3, [dict(stats, max=7.0), huge, stats], [(10, 1, None), None, (12, 0, 10), (13, 4, None)]),
    ]
    for step, rows, ids in runs:
        got = columns.batch(step, rows, ids)
        want = records_batch(_run_records(step, rows, ids))
        assert got.schema == want.schema
        for name in want.schema.names:
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert pa.Table.from_batches([columns.batch(*runs[1])]).column("json_fields").null_count == 3
