"""A rank that closed cleanly is digested from its Arrow columns: the same slots and digests as from its records."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

import torchdebug
from torchdebug.compare._replica_digests import RankDigest, digest_rank
from torchdebug.compare._steps import metric_pool
from torchdebug.compare._value_digests import column_digests, value_digest
from torchdebug.records import STAT_KEYS, Record
from torchdebug.store import _layout as layout
from torchdebug.store._record_columns import records_table
from torchdebug.store._writer import RankWriter, run_manifest

_NEGATIVE_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000001))[0]


def _stats(**values) -> dict:
    return {**dict.fromkeys(STAT_KEYS, 0), "min": -1.0, "max": 2.0, "mean": 0.5, "norm": 3.0, **values}


def _record(name: str, **fields) -> Record:
    defaults = {"phase": "optimizer", "op": "aten.add_.Tensor", "io": "output", "dtype": "float32", "shape": [2, 3]}
    return Record(name=name, step=0, rank=0, module="-", call=0, seq=len(name), arg="0", **{**defaults, **fields})


_RECORDS = [
    _record("update", stats=_stats()),
    _record("nan", stats=_stats(mean=math.nan)),
    _record("other_nan", stats=_stats(mean=_NEGATIVE_NAN)),
    _record("zero", stats=_stats(min=0.0)),
    _record("negative_zero", stats=_stats(min=-0.0)),
    _record("no_stats", stats=None),
    _record("unknown_count", stats=_stats(zeros=None)),
    _record("integers", dtype="int64", stats=_stats(min=-3, max=7)),
    _record("no_shape", shape=None, stats=_stats()),
    _record("scalar", shape=[], stats=_stats()),
    _record("fewer_stats", stats={"min": 1.0, "max": 2.0}),  # written before the counts: kept as JSON
    _record("replicate", stats=_stats(), extra={"placements": ["R"], "mesh": [2]}),
    _record("shard", stats=_stats(), extra={"placements": ["S(0)"], "mesh": [2]}),
    _record("reduced", phase="forward", op="c10d.allreduce_.default", stats=_stats()),
    _record("reduce_input", phase="forward", op="c10d.allreduce_.default", io="input", stats=_stats()),
    _record("parameter", phase="forward", op="module", io="parameter", stats=_stats()),
    _record("activation", phase="forward", op="aten.mm.default", stats=_stats()),
    _record("failed", stats=None, capture_error="unreadable"),
    _record("lr", kind="value", dtype=None, shape=None, value=0.1),
    _record("update", stats=_stats(max=5.0)),  # the slot written again: its last record counts
]


def test_column_digests_equal_the_digests_of_the_records():
    plain = [r for r in _RECORDS if not r.extra and (r.stats is None or r.stats.keys() == set(STAT_KEYS))]
    assert column_digests(records_table(plain)) == [value_digest(None, record, tensors=False) for record in plain]


def test_digests_tell_values_apart_but_not_nans():
    digest = {record.name: value_digest(None, record, tensors=False) for record in _RECORDS[:-1]}
    assert digest["nan"] == digest["other_nan"]  # a NaN's sign and payload bits are not its value
    assert digest["zero"] != digest["negative_zero"]
    assert len({digest[name] for name in ("update", "nan", "zero", "no_stats", "unknown_count", "no_shape", "scalar")}) == 7


def _rank_folder(run: Path, records: list[Record], complete: bool) -> Path:
    folder = run / layout.rank_dir_name(1, 0)
    writer = RankWriter(folder, run_manifest("run", 0, 1, {"task": "statistics"}))
    writer.submit(0, records, None, [])
    writer.close()
    if not complete:
        (folder / layout.COMPLETE).unlink()  # a partial rank: read as records
    return run


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    found = {}
    with metric_pool(1) as pool:
        for complete in (True, False):
            run = _rank_folder(tmp_path_factory.mktemp("run"), _RECORDS, complete)
            found[complete] = digest_rank(torchdebug.load(run).ranks[0], tensors=True, pool=pool)
    return found


def test_a_complete_rank_digested_from_its_columns_gives_the_slots_of_its_records(digests):
    from_columns, from_records = digests[True], digests[False]
    assert from_columns.slots == from_records.slots
    names = [name for _, name, _, _ in from_columns.slots]
    assert names == [
        "update",
        "nan",
        "other_nan",
        "zero",
        "negative_zero",
        "no_stats",
        "unknown_count",
        "integers",
        "no_shape",
        "scalar",
        "fewer_stats",
        "replicate",
        "reduced",
        "parameter",
    ]
    last_update = value_digest(None, _RECORDS[-1], tensors=False)
    assert from_columns.slots[0] == (0, "update", len("update"), last_update)
    assert from_columns.notes == [] and from_records.notes and "is partial" in from_records.notes[0]


def test_a_digest_makes_the_trip_to_another_process_as_json(digests):
    for digest in (digests[True], RankDigest(3, [], ["a note"])):
        assert RankDigest.from_plain(json.loads(json.dumps(digest.to_plain()))) == digest
