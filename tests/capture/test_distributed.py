"""Two processes under torch.distributed (gloo, file rendezvous) write two rank folders of one run."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torchdebug


def _worker(rank: int, world_size: int, init_file: str, dump_path: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model = torch.nn.Linear(4, 2)
        with torchdebug.dump(dump_path, model=model):
            out = model(torch.full((3, 4), float(rank + 1)))
            dist.all_reduce(out)
            out.sum().backward()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_write_two_rank_folders_of_one_run(tmp_path):
    dump_path = tmp_path / "dump"
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(dump_path)), nprocs=2, join=True)
    runs = [p for p in dump_path.iterdir() if p.is_dir()]
    assert len(runs) == 1
    assert sorted(p.name for p in runs[0].iterdir()) == ["worldsize2_global_rank0", "worldsize2_global_rank1"]
    run = torchdebug.load(dump_path)
    assert sorted(run.ranks) == [0, 1] and not run.partial_ranks
    for rank, dump in run.ranks.items():
        assert dump.manifest["world_size"] == 2 and dump.manifest["rank"] == rank
        assert all(r.rank == rank for r in dump.records())
        assert any(r.op == "aten.addmm.default" for r in dump.records())
