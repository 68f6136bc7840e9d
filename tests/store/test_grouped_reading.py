"""A rank's records are built a group of record batches at a time (the next group decoded meanwhile):
the same records as from the whole table, with what equal records share still shared."""

import sys

import pytest

from tests.store.test_store import _STATS, _garbage_before_the_last_batch, _record, _writer
from torchdebug.errors import DumpError
from torchdebug.store import _layout as layout
from torchdebug.store import _reader
from torchdebug.store._reader import load
from torchdebug.store._record_columns import records_from_table
from torchdebug.store._record_file import read_records


def _five_batches(tmp_path):
    """A rank folder of five record batches (a flush each) of two records, the second with an extra field."""
    writer = _writer(tmp_path)
    for i in range(5):
        writer.submit(0, [_record(2 * i, stats=dict(_STATS)), _record(2 * i + 1, stats=dict(_STATS), extra={"k": i})], None, [])
        writer.drain()
    writer.close()
    return writer.rank_dir


def test_records_read_a_group_at_a_time_equal_those_of_the_whole_table(tmp_path, monkeypatch):
    rank_dir = _five_batches(tmp_path)
    monkeypatch.setattr(_reader, "_GROUP", 2)  # groups of 2, 2 and 1 batches
    records = load(tmp_path).ranks[0].records()
    assert len(records) == 10
    assert records == records_from_table(read_records(rank_dir / layout.RECORDS)[0])
    assert [record.extra for record in records[1::2]] == [{"k": i} for i in range(5)]


def test_records_of_one_group_share_equal_statistics_and_one_empty_extra(tmp_path, monkeypatch):
    _five_batches(tmp_path)
    monkeypatch.setattr(_reader, "_GROUP", 5)  # one group: the five batches
    records = load(tmp_path).ranks[0].records()
    assert len({id(record.stats) for record in records}) == 1
    plain = records[0::2]
    assert plain[0].extra == {} and all(record.extra is plain[0].extra for record in plain)


def test_a_corrupt_batch_in_a_later_group_is_named_when_its_group_is_read(tmp_path, monkeypatch):
    size = _garbage_before_the_last_batch(tmp_path, batches=3)
    monkeypatch.setattr(_reader, "_GROUP", 1)  # the damaged batch is decoded ahead, on the reading thread
    with pytest.raises(DumpError, match=rf"records.arrows: batch 3 of records \(byte {size}\) is corrupt"):
        load(tmp_path).ranks[0].records()


def test_read_statistics_are_plain_dicts_that_share_their_keys(tmp_path):
    # 32 distinct statistics: CPython (3.11 to 3.13) sizes a shared-key dict's values by the room
    # its kind's table of keys still offers, which the first few dicts of a kind leave wide (280 bytes
    # with 3 alive, more than a dict of its own), so a handful would pass only after other tests
    writer = _writer(tmp_path)
    writer.submit(0, [_record(i, stats={**_STATS, "mean": float(i)}) for i in range(32)], None, [])
    writer.close()
    stats = [record.stats for record in load(tmp_path).ranks[0].records()]
    assert [s["mean"] for s in stats] == [float(i) for i in range(32)] and all(type(s) is dict for s in stats)
    assert stats[0] == {**_STATS, "mean": 0.0} and list(stats[0]) == list(_STATS)
    assert all(sys.getsizeof(s) < sys.getsizeof(dict(s)) for s in stats)  # one table of keys for them all
