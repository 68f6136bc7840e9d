"""Two processes under torch.distributed (gloo, file rendezvous) write two rank folders of one run."""

import torch
import torch.distributed as dist

import torchdebug
from tests import gloo


def _worker(rank: int, dump_path: str) -> None:
    model = torch.nn.Linear(4, 2)
    with torchdebug.dump(dump_path, model=model):
        out = model(torch.full((3, 4), float(rank + 1)))
        dist.all_reduce(out)
        out.sum().backward()


def test_two_gloo_ranks_write_two_rank_folders_of_one_run(tmp_path):
    dump_path = tmp_path / "dump"
    gloo.spawn(_worker, tmp_path, str(dump_path))
    runs = [p for p in dump_path.iterdir() if p.is_dir()]
    assert len(runs) == 1
    assert sorted(p.name for p in runs[0].iterdir()) == ["worldsize2_global_rank0", "worldsize2_global_rank1"]
    run = torchdebug.load(dump_path)
    assert sorted(run.ranks) == [0, 1] and not run.partial_ranks
    for rank, dump in run.ranks.items():
        assert dump.manifest["world_size"] == 2 and dump.manifest["rank"] == rank
        assert all(r.rank == rank for r in dump.records())
        assert any(r.op == "aten.addmm.default" for r in dump.records())


def test_torchrun_ranks_without_a_process_group_share_the_run_named_after_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job42")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    run_dirs = []
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        with torchdebug.dump(tmp_path) as debugger:
            torch.ones(2).exp()
        run_dirs.append(debugger.run_dir)
    assert run_dirs[0] == run_dirs[1] and run_dirs[0].name == "torchrun-job42-restart1"
    assert sorted(torchdebug.load(tmp_path).ranks) == [0, 1]


def _dying_worker(rank: int, init_file: str, dump_path: str) -> None:
    import os

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    debugger = torchdebug.Debugger(dump_path)
    debugger.start()
    torch.ones(3).exp()
    debugger.stop()
    debugger.step()
    debugger.flush()  # on disk before the kill (a step's records are written while the next one runs)
    if rank == 0:
        debugger.close()
    dist.barrier()  # rank 0 has closed before rank 1 dies (spawn then terminates the others)
    if rank == 1:
        os._exit(3)  # dies without closing: no completion marker
    dist.destroy_process_group()


def test_a_rank_that_dies_leaves_a_readable_partial_folder(tmp_path):
    import pytest

    with pytest.raises(Exception, match="exit code 3"):
        gloo.start(_dying_worker, str(tmp_path / "init"), str(tmp_path / "dump"))
    run = torchdebug.load(tmp_path / "dump")
    assert run.partial_ranks == [1]
    assert any(r.op == "aten.exp.default" for r in run.ranks[1].records())
