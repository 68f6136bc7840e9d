"""Dumps cut short by a crash still compare, and say so."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import torchdebug
from tests.store.old_format import to_json_lines
from torchdebug.cli import main
from torchdebug.errors import DumpError
from torchdebug.store import _layout as layout


def _copy(dumps, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dumps("mlp"), copy)
    return copy, next(copy.glob("*/*/"))


def test_a_dump_without_completion_marker_is_compared_and_reported_partial(dumps, tmp_path):
    copy, rank = _copy(dumps, tmp_path)
    (rank / "complete.json").unlink()
    result = torchdebug.compare(copy, dumps("mlp"))
    assert any("partial" in problem and "did not close cleanly" in problem for problem in result.problems)
    assert "note: A rank 0 is partial" in result.summary()


def test_a_half_written_last_record_is_skipped_and_reported(dumps, tmp_path):
    copy, rank = _copy(dumps, tmp_path)
    records = to_json_lines(copy)  # a dump of JSON lines: one record a line (tests/store cuts Arrow batches)
    text = records.read_text()
    records.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 1] + text.splitlines()[-1][:40])
    result = torchdebug.compare(copy, dumps("mlp"))
    assert any("half-written" in problem for problem in result.problems)
    assert result.counts()["unmatched"] == 1  # the lost slot is listed, not dropped
    assert not result.diverged


def test_a_rank_present_on_one_side_only_is_reported(dumps, tmp_path):
    copy, rank = _copy(dumps, tmp_path)
    shutil.copytree(rank, rank.parent / "worldsize2_global_rank1")
    manifest = rank.parent / "worldsize2_global_rank1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"rank": 0', '"rank": 1'))
    result = torchdebug.compare(copy, dumps("mlp"))
    assert "ranks only in A (not compared): [1]" in result.problems


def _add_rank(run_dir, source_rank_dir, rank: int) -> None:
    target = run_dir / f"worldsize2_global_rank{rank}"
    shutil.copytree(source_rank_dir, target)
    manifest = target / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"rank": 0', f'"rank": {rank}'))


def test_ranks_are_compared_one_by_one_and_the_divergent_rank_is_named(dumps, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(dumps("mlp"), good)
    shutil.copytree(dumps("mlp"), bad)
    good_rank, bad_rank = next(good.glob("*/*/")), next(bad.glob("*/*/"))
    _add_rank(good_rank.parent, good_rank, 1)
    _add_rank(bad_rank.parent, next(dumps("mlp", gain=1.001).glob("*/*/")), 1)
    result = torchdebug.compare(bad, good)
    assert result.ranks == [0, 1]
    assert result.counts(0)["error"] == 0
    assert result.first_divergence.rank == 1
    assert "rank 1" in result.summary()


def test_a_dump_still_being_written_is_named_when_nothing_matches(dumps, tmp_path, capsys):
    copy, rank = _copy(dumps, tmp_path)
    (rank / "complete.json").unlink()
    (rank / layout.RECORDS).write_bytes(b"")  # its writer has not flushed a record yet
    with pytest.raises(ValueError, match="no tensor records in common") as error:
        torchdebug.compare(copy, dumps("mlp"))
    assert f"A ({copy}) is still being written or did not finish (rank 0 without complete.json)" in str(error.value)
    assert "different models or programs" not in str(error.value)
    assert main(["compare", str(copy), str(dumps("mlp")), "-q"]) == 2
    assert "is still being written or did not finish" in capsys.readouterr().err


def _truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def test_a_damaged_tensor_file_falls_back_to_statistics_with_one_warning(dumps, tmp_path, caplog):
    copy = tmp_path / "buggy"
    shutil.copytree(dumps("mlp", gain=1.001), copy)
    damaged = sorted(copy.glob("*/*/tensors/*.safetensors"))
    for file in damaged:
        _truncate(file)
    with caplog.at_level(logging.WARNING, logger="torchdebug.compare"):
        result = torchdebug.compare(copy, dumps("mlp"))
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1 and all(str(file) in warnings[0].getMessage() for file in damaged)
    assert warnings[0].getMessage() in result.problems
    assert "compared by their statistics instead" in warnings[0].getMessage()
    assert all("cosine" not in row.metrics for row in result.rows)  # statistics metrics only
    assert result.first_divergence.op == "aten.mul.Tensor"  # the planted bug, found by statistics
    assert main(["compare", str(copy), str(dumps("mlp")), "-q"]) == 1  # the comparison's status, not 2


def test_a_missing_tensor_file_is_still_a_dump_error(dumps, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dumps("mlp"), copy)
    for file in copy.glob("*/*/tensors/*.safetensors"):
        file.unlink()
    with pytest.raises(DumpError, match="is missing"):
        torchdebug.compare(copy, dumps("mlp"))
