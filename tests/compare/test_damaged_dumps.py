"""Dumps cut short by a crash still compare, and say so."""

from __future__ import annotations

import shutil

import torchdebug


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
    records = rank / "records.jsonl"
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
