"""The cross-rank check reads one rank at a time, keeps one record per slot, and gives the same
result over worker processes (``workers=N``) and over the processes of a gloo group (torchrun)."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest

import torchdebug.compare._across_ranks as across_ranks
from tests import gloo
from tests.compare.replicas import PERTURBED_RANK, WORLD_SIZE
from torchdebug.cli import main
from torchdebug.compare._across_ranks import compare_ranks
from torchdebug.compare._distributed import compare_ranks_distributed
from torchdebug.errors import DumpError
from torchdebug.records import Record


def _live_records() -> int:
    return sum(1 for item in gc.get_objects() if type(item) is Record)


def _rows(result) -> list[dict]:
    return json.loads(json.dumps(result.to_dict()["rows"]))


def test_each_rank_is_read_without_keeping_the_ranks_read_before(replicas, monkeypatch):
    gc.collect()
    live = []
    digest_rank = across_ranks.digest_rank

    def counting(dump, tensors, pool):
        live.append(_live_records())
        return digest_rank(dump, tensors, pool)

    monkeypatch.setattr(across_ranks, "digest_rank", counting)
    result = compare_ranks(replicas["healthy"])
    assert len(live) == WORLD_SIZE
    assert live == [live[0]] * WORLD_SIZE  # nothing left behind by the ranks read before
    kept = {id(record) for row in result.rows for record in (row.record_a, row.record_b)}
    slots = len(result.rows) // WORLD_SIZE
    assert slots > 0 and len(kept) == slots  # one record per slot (the reference's), not one per rank


def test_workers_give_the_in_process_result(replicas, tmp_path):
    alone = compare_ranks(replicas["perturbed"])
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
        compare_ranks(broken, workers=2)


def _in_group(rank: int, dump: str, broken: str, out: str) -> None:
    result = compare_ranks_distributed(dump)
    assert (result is None) == (rank != 0)
    if result is not None:
        Path(out).write_text(json.dumps(_rows(result)))
    with pytest.raises(ValueError, match="rank 2: .* is missing"):  # rank 2 is process 0's: process 1 hears of it
        compare_ranks_distributed(broken)


def test_the_processes_of_a_gloo_group_give_the_in_process_result(replicas, tmp_path):
    out = tmp_path / "rows.json"
    broken = _without_tensors_of_rank_2(replicas["perturbed"], tmp_path / "broken")
    gloo.spawn(_in_group, tmp_path, str(replicas["perturbed_stats"]), str(broken), str(out))  # 2 processes, 3 dump ranks
    assert json.loads(out.read_text()) == _rows(compare_ranks(replicas["perturbed_stats"]))


def test_cli_refuses_workers_under_torchrun(replicas, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert main(["compare", "--across-ranks", str(replicas["healthy"]), "--workers", "2"]) == 2
    assert "torchrun already started the worker processes" in capsys.readouterr().err
