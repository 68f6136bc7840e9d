"""Distributed compare: worker processes (spawned, or started by torchrun) give the in-process result."""

from __future__ import annotations

import faulthandler
import json
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

import torchdebug
from tests import gloo
from torchdebug.cli import main
from torchdebug.compare import _distributed, compare_distributed
from torchdebug.compare._distributed import Share, plan
from torchdebug.errors import ConfigError, DumpError


def _assert_same(result, expected):
    assert [row.to_dict() for row in result.rows] == [row.to_dict() for row in expected.rows]
    assert result.problems == expected.problems and result.options == expected.options
    first, first_expected = result.first_divergence, expected.first_divergence
    assert (first and first.name) == (first_expected and first_expected.name)
    if first is not None:
        assert result.stack(first) == expected.stack(first_expected)


def test_two_workers_sharing_three_ranks_give_the_in_process_result(replicas):
    a, b = replicas["perturbed"], replicas["healthy"]
    expected = torchdebug.compare(a, b)
    assert expected.diverged and expected.ranks == [0, 1, 2]
    _assert_same(torchdebug.compare(a, b, workers=2), expected)


def test_two_workers_splitting_one_rank_by_tensor_file_give_the_in_process_result(dumps):
    a, b = dumps("mlp", gain=1.001), dumps("mlp")
    expected = torchdebug.compare(a, b)
    assert expected.first_divergence is not None
    _assert_same(torchdebug.compare(a, b, workers=2), expected)


@pytest.mark.slow  # torchrun and its two workers are fresh processes: about 10 s on 2 cores
def test_torchrun_workers_write_the_in_process_result(dumps, tmp_path):
    a, b = dumps("gpt", bf16=True), dumps("gpt")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "torchdebug",
        "compare",
        str(a),
        str(b),
        "-o",
        str(tmp_path),
        "--format",
        "json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("first divergence: none") == 1  # process 0 reports, alone
    expected = torchdebug.compare(a, b).to_json(tmp_path / "expected.json")
    assert json.loads((tmp_path / "compare.json").read_text()) == json.loads(expected.read_text())


def test_a_worker_error_reaches_the_caller_as_one_error(dumps, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dumps("mlp"), copy)
    for tensors in copy.glob("*/*/tensors/*.safetensors"):
        tensors.unlink()
    with pytest.raises(DumpError, match="is missing"):
        torchdebug.compare(copy, dumps("mlp"), workers=2)


def test_a_bad_path_fails_before_any_worker_starts(dumps, tmp_path):
    with pytest.raises(DumpError, match="no such dump folder"):
        torchdebug.compare(tmp_path / "nope", dumps("mlp"), workers=2)


def test_the_plan_gives_whole_ranks_when_there_are_enough_and_parts_of_ranks_otherwise():
    assert plan([0, 1, 2], 2) == [[Share(0), Share(2)], [Share(1)]]
    assert plan([0], 3) == [[Share(0, 0, 3)], [Share(0, 1, 3)], [Share(0, 2, 3)]]
    assert plan([4, 5], 3) == [[Share(4, 0, 2)], [Share(5, 0, 1)], [Share(4, 1, 2)]]


def test_workers_below_one_and_a_missing_process_group_are_refused(dumps):
    with pytest.raises(ValueError, match=r"^workers: got 0, expected an integer >= 1$"):
        torchdebug.compare(dumps("mlp"), dumps("mlp"), workers=0)
    with pytest.raises(ValueError, match="torch.distributed is not initialised"), pytest.warns(FutureWarning):
        compare_distributed(dumps("mlp"), dumps("mlp"))


def _in_group(rank: int, a: str, b: str, out: str) -> None:
    result = torchdebug.compare(a, b, workers=2)  # the group's two processes are the workers
    assert (result is None) == (rank != 0)
    if result is not None:
        result.to_json(out)
    with pytest.warns(
        FutureWarning, match=r"compare_distributed\(a, b\) is deprecated; use torchdebug.compare\(a, b, workers=N\)"
    ):
        assert (compare_distributed(a, b) is None) == (rank != 0)


def test_compare_with_as_many_workers_as_its_process_group_shares_the_work_with_the_group(dumps, tmp_path):
    a, b = dumps("mlp", gain=1.001), dumps("mlp")
    gloo.spawn(_in_group, tmp_path, str(a), str(b), str(tmp_path / "group.json"))
    expected = torchdebug.compare(a, b).to_json(tmp_path / "expected.json")
    assert json.loads((tmp_path / "group.json").read_text()) == json.loads(expected.read_text())


def _alone(rank: int, init_file: str, a: str, b: str, failed: str) -> None:
    """Process 0 calls compare(a, b, workers=2) alone; process 1 waits until it has failed. A hang
    ends the process after a minute (the test fails instead of waiting forever). The barrier's
    timeout closes the group's pairs, so the processes leave without the harness's last barrier."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        if rank == 1:
            while not Path(failed).exists():
                time.sleep(0.05)
            return
        _distributed._JOIN_TIMEOUT = timedelta(seconds=2)
        faulthandler.dump_traceback_later(60, exit=True)
        try:
            with pytest.raises(ConfigError, match=r"not all of them called it within 2 s \(.*Ranks 1 failed.*\); call it"):
                torchdebug.compare(a, b, workers=2)
        finally:
            faulthandler.cancel_dump_traceback_later()
            Path(failed).touch()
    finally:
        dist.destroy_process_group()


def test_compare_called_on_one_process_of_the_group_alone_raises_instead_of_waiting(dumps, tmp_path):
    gloo.start(_alone, str(tmp_path / "gloo-init"), str(dumps("mlp")), str(dumps("mlp")), str(tmp_path / "failed"))


def test_cli_refuses_workers_under_torchrun(dumps, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    assert main(["compare", str(dumps("mlp")), str(dumps("mlp")), "--workers", "2"]) == 2
    assert "torchrun already started the worker processes" in capsys.readouterr().err
