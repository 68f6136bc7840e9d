"""Two ranks (gloo, file rendezvous): each writes its own ``run_*-rank_<r>/torchdebug`` folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests import gloo


def _rank_main(rank: int, root: str) -> None:
    os.environ["TORCH_COMPILE_DEBUG"] = "1"
    import torchdebug

    with torch._dynamo.config.patch(debug_dir_root=root):
        backend = torchdebug.get_backend(torchdebug.CompilerConfig(backend="aot_eager"))
        torch.compile(lambda x: x * (rank + 1), backend=backend)(torch.ones(2))


@pytest.mark.slow
def test_each_rank_writes_a_rank_suffixed_run_folder(tmp_path: Path) -> None:
    root = tmp_path / "debug"
    gloo.spawn(_rank_main, tmp_path, str(root))
    for rank in (0, 1):
        (folder,) = root.glob(f"run_*-rank_{rank}/torchdebug")
        assert (folder / "model__0" / "forward" / "000_aot_forward_graph.txt").is_file()
        assert (folder / "debug.log").is_file()
