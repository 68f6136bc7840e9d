"""Two ranks (gloo, file rendezvous): each writes its own ``run_*-rank_<r>/torchdebug`` folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank: int, root: str, rendezvous: str) -> None:
    os.environ["TORCH_COMPILE_DEBUG"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        import torchdebug

        with torch._dynamo.config.patch(debug_dir_root=root):
            backend = torchdebug.get_backend(torchdebug.CompilerConfig(mode="aot_eager"))
            torch.compile(lambda x: x * (rank + 1), backend=backend)(torch.ones(2))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_each_rank_writes_a_rank_suffixed_run_folder(tmp_path: Path) -> None:
    root = tmp_path / "debug"
    mp.spawn(_rank_main, args=(str(root), str(tmp_path / "rendezvous")), nprocs=2, join=True)
    for rank in (0, 1):
        (folder,) = root.glob(f"run_*-rank_{rank}/torchdebug")
        assert (folder / "model__0" / "forward" / "000_aot_forward_graph.txt").is_file()
        assert (folder / "debug.log").is_file()
