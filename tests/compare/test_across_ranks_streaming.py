"""The cross-rank check reads one rank at a time, keeps one record per slot and value and a row only
for ranks that differ, and gives the same result over worker processes (``workers=N``) and over the
processes of a gloo group (torchrun)."""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow.compute as pc
import pytest

import torchdebug
import torchdebug.compare._across_ranks as across_ranks
from tests import gloo
from tests.compare.replicas import PERTURBED_RANK, WORLD_SIZE
from torchdebug.cli import main
from torchdebug.compare import compare, compare_ranks_distributed
from torchdebug.compare._result import CompareResult
from torchdebug.compare._rows import Row
from torchdebug.errors import DumpError
from torchdebug.records import Record
from torchdebug.store import _layout as layout
from torchdebug.store._record_file import RecordFile


def _live(kind: type) -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if type(item) is kind)


def _rows(result) -> list[dict]:
    return json.loads(json.dumps(result.to_dict()["rows"]))


def test_each_rank_is_read_without_keeping_the_ranks_read_before(replicas, monkeypatch):
    live = []
    digest_rank = across_ranks.digest_rank

    def counting(dump, tensors, pool):
        live.append(_live(Record))
        return digest_rank(dump, tensors, pool)

    monkeypatch.setattr(across_ranks, "digest_rank", counting)
    result = compare(replicas["healthy"])
    assert len(live) == WORLD_SIZE
    assert live == [live[0]] * WORLD_SIZE  # nothing left behind by the ranks read before
    kept = {id(record) for row in result.rows for record in (row.record_a, row.record_b)}
    slots = len(result.rows) // WORLD_SIZE
    assert slots > 0 and len(kept) == slots  # one record per slot (the reference's), not one per rank


def test_workers_give_the_in_process_result(replicas, tmp_path):
    alone = compare(replicas["perturbed"])
    assert (
        main(["compare", "--across-ranks", str(replicas["perturbed"]), "--workers", "2", "-o", str(tmp_path), "--format", "json"])
        == 1
    )
    report = json.loads((tmp_path / "compare.json").read_text())
    assert report["rows"] == _rows(alone)
    assert report["first_divergence"]["rank"] == PERTURBED_RANK


def _without_tensors_of_rank_2(dump: Path, copy: Path) -> Path:
    shutil.copytree(dump, copy)
    for tensors in copy.glob("*/*rank2/tensors/*.safetensors"):
        tensors.unlink()
    return copy


def test_a_worker_error_reaches_the_caller(replicas, tmp_path):
    broken = _without_tensors_of_rank_2(replicas["perturbed"], tmp_path / "broken")
    with pytest.raises(DumpError, match="is missing"):
        compare(broken, workers=2)


def _in_group(rank: int, dump: str, broken: str, out: str) -> None:
    result = compare(dump, workers=2)  # the group's two processes are the workers
    assert (result is None) == (rank != 0)
    if result is not None:
        Path(out).write_text(json.dumps(_rows(result)))
    with pytest.raises(ValueError, match="rank 2: .* is missing"):  # rank 2 is process 0's: process 1 hears of it
        compare(broken, workers=2)
    with pytest.warns(
        FutureWarning, match=r"compare_ranks_distributed\(dump\) is deprecated; use torchdebug.compare\(dump, workers=N\)"
    ):
        assert (compare_ranks_distributed(dump) is None) == (rank != 0)


def test_the_processes_of_a_gloo_group_give_the_in_process_result(replicas, tmp_path):
    out = tmp_path / "rows.json"
    broken = _without_tensors_of_rank_2(replicas["perturbed"], tmp_path / "broken")
    gloo.spawn(_in_group, tmp_path, str(replicas["perturbed_stats"]), str(broken), str(out))  # 2 processes, 3 dump ranks
    assert json.loads(out.read_text()) == _rows(compare(replicas["perturbed_stats"]))


def test_cli_refuses_workers_under_torchrun(replicas, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert main(["compare", "--across-ranks", str(replicas["healthy"]), "--workers", "2"]) == 2
    assert "torchrun already started the worker processes" in capsys.readouterr().err


_RANKS = 9
_SHORT_RANK = 8


def _nine_ranks(dump: Path, run: Path) -> Path:
    """Nine ranks made of the three of ``dump``, rank ``i`` a copy of rank ``i % 3`` (so ranks 1, 4
    and 7 hold the perturbed update), rank 8 without step 1."""
    source = torchdebug.load(dump)
    for rank in range(_RANKS):
        copy = run / layout.rank_dir_name(_RANKS, rank)
        shutil.copytree(source.ranks[rank % WORLD_SIZE].path, copy, copy_function=os.link)
        manifest = json.loads((copy / layout.MANIFEST).read_text())
        (copy / layout.MANIFEST).unlink()  # a link to the source's: replaced, not written through
        (copy / layout.MANIFEST).write_text(json.dumps({**manifest, "rank": rank, "world_size": _RANKS}))
    records = run / layout.rank_dir_name(_RANKS, _SHORT_RANK) / layout.RECORDS
    table = torchdebug.load(records.parent).ranks[_SHORT_RANK].to_arrow()
    records.unlink()
    file = RecordFile(records)
    for batch in table.filter(pc.equal(table["step"], 0)).to_batches():
        file.append(batch)
    file.close()
    return run


@pytest.fixture(scope="module")
def nine_ranks(replicas, tmp_path_factory) -> Path:
    return _nine_ranks(replicas["perturbed_stats"], tmp_path_factory.mktemp("nine") / "run")


def test_ranks_holding_the_reference_value_keep_no_row(nine_ranks):
    before = _live(Row)
    result = compare(nine_ranks)
    kept = result.rows.differing
    assert _live(Row) - before == len(kept) > 0  # the rows of the six agreeing ranks are made when read
    assert {row.rank for row in kept} == {1, 4, 7}
    assert len(result.rows) == _RANKS * len(result.rows.slots) == len(list(result.rows))
    values = defaultdict(list)
    for row in kept:
        values[row.order].append(row)
    for rows in values.values():  # each differing value: one record read, one metrics computed
        assert [row.rank for row in rows] == [1, 4, 7]
        assert len({id(row.record_a) for row in rows}) == len({id(row.metrics) for row in rows}) == 1
    first = result.first_divergence
    assert (first.rank, first.phase, first.op, first.io) == (PERTURBED_RANK, "optimizer", "aten.add_.Tensor", "output")
    assert any(row is first for row in kept)


def test_counts_phases_and_coverage_are_those_of_the_rows_made(nine_ranks):
    result = compare(nine_ranks)
    made = CompareResult(rows=list(result.rows), a=result.a, b=result.b)
    assert result.counts() == made.counts() and result.counts(_SHORT_RANK)["unmatched"] > 0
    assert result.phases() == made.phases() and result.coverage() == made.coverage()
    assert result.ranks == made.ranks == list(range(_RANKS))
    for rank in result.ranks:
        assert result.counts(rank) == made.counts(rank)
        assert [row.to_dict() for row in result.rank_rows(rank)] == [row.to_dict() for row in made.rank_rows(rank)]
    assert made.first_divergence is result.first_divergence and result.diverged
    assert [row.to_dict() for row in result.rows[-_RANKS - 1 :]] == [row.to_dict() for row in made.rows[-_RANKS - 1 :]]
    assert result.rows[-1].to_dict() == made.rows[-1].to_dict() and result.rows[-1].message == "not on rank 8"


def test_the_result_does_not_depend_on_how_a_ranks_records_were_cut_into_messages(replicas, tmp_path, monkeypatch):
    """Ranks are digested and read a stored table of a few messages at a time (a large step is written
    as several messages): rewritten in messages of 2 records, many tables hold no slot the check
    reads back, and the result is the one of the ranks as written."""
    from torchdebug.store import _record_file

    copy = tmp_path / "perturbed"
    shutil.copytree(replicas["perturbed"], copy)
    monkeypatch.setattr(_record_file, "BATCH_ROWS", 2)
    for dump in torchdebug.load(copy).ranks.values():
        table = dump.to_arrow()
        (dump.path / layout.RECORDS).unlink()
        file = RecordFile(dump.path / layout.RECORDS)
        for batch in table.to_batches():
            file.append(batch)
        file.close()
        assert len(list(torchdebug.load(copy).ranks[dump.rank].stored_tables())) > 1
    assert _rows(compare(copy)) == _rows(compare(replicas["perturbed"]))
