"""Rank helpers: a value rank 0 chose reaches every rank as bytes, not as a pickle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.gloo import spawn
from torchdebug.dist import broadcast_from_rank0

VALUES = ("run-20261124-021500-ñ", "")


def _broadcast(rank: int, out: str) -> None:
    received = [broadcast_from_rank0(value if rank == 0 else f"rank {rank}'s own") for value in VALUES]
    with pytest.MonkeyPatch.context() as patch:  # no rank unpickles what another sent
        for pickling in ("broadcast_object_list", "all_gather_object", "scatter_object_list"):
            patch.setattr(dist, pickling, None)
        received.append(broadcast_from_rank0("x" * 1000 if rank == 0 else ""))
    Path(out, f"{rank}.json").write_text(json.dumps(received))


def test_rank0s_value_reaches_every_rank(tmp_path: Path) -> None:
    spawn(_broadcast, tmp_path, str(tmp_path))
    for rank in range(2):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == [*VALUES, "x" * 1000]


def test_without_a_process_group_the_value_is_returned_as_is() -> None:
    assert broadcast_from_rank0("alone") == "alone"
