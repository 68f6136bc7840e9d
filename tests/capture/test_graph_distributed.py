"""A graph dump on two gloo ranks: one run folder, a rank folder each."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdebug
from tests import gloo
from tests.backends import dump_backend


def _rank_main(rank: int, path: str) -> None:
    backend = dump_backend(Path(path), run_eagerly=True)  # the folders are the point, not inductor's code
    torch.compile(lambda x: (x * (rank + 1)).exp(), backend=backend)(torch.ones(3))
    backend.data_dump.close()


@pytest.mark.slow
def test_every_rank_of_a_graph_dump_writes_into_one_run_folder(tmp_path: Path) -> None:
    gloo.spawn(_rank_main, tmp_path, str(tmp_path / "dump"))
    (run_dir,) = (tmp_path / "dump").iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["worldsize2_global_rank0", "worldsize2_global_rank1"]
    run = torchdebug.load(tmp_path / "dump")
    assert sorted(run.ranks) == [0, 1] and not run.partial_ranks
    for rank, dump in run.ranks.items():
        exp = [r for r in dump.records() if r.op == "aten.exp.default" and r.io == "output"]
        assert exp and exp[0].stats["max"] == pytest.approx(torch.tensor(float(rank + 1)).exp().item())
