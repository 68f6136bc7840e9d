"""Collectives under torch.distributed (gloo): outputs captured after the work completes."""

import torch
import torch.distributed as dist

import torchdebug
from tests import gloo


def _worker(rank: int, dump_path: str) -> None:
    with torchdebug.dump(dump_path):
        x = torch.full((4,), float(rank + 1))
        dist.all_reduce(x)
        x.mul_(10)  # the all_reduce output record must hold the value before this
        gathered = [torch.zeros(4) for _ in range(2)]
        dist.all_gather(gathered, torch.full((4,), float(rank)))
        flat = torch.zeros(8)
        dist.all_gather_into_tensor(flat, torch.full((4,), float(rank)))
        b = torch.full((2,), float(rank + 5))
        dist.broadcast(b, 1)
        out = torch.zeros(2)
        dist.reduce_scatter_tensor(out, torch.arange(4.0))
        p2p = torch.full((3,), 7.0) if rank == 0 else torch.zeros(3)
        if rank == 0:
            dist.send(p2p, 1)
        else:
            dist.recv(p2p, 0)
        y = torch.full((2,), float(rank + 1))
        work = dist.all_reduce(y, async_op=True)
        work.wait()
        z = torch.full((2,), 1.0)
        dist.all_reduce(z, async_op=True)  # never waited by the user: capture stop waits


def _outputs(records, op):
    return [r for r in records if r.op == op and r.io == "output" and r.kind == "tensor"]


def test_collective_outputs_hold_the_values_after_completion(tmp_path):
    gloo.spawn(_worker, tmp_path, str(tmp_path / "dump"))
    run = torchdebug.load(tmp_path / "dump")
    names = []
    for rank, dump in sorted(run.ranks.items()):
        records = dump.records()
        allreduce = _outputs(records, "c10d.allreduce_.default")
        assert [r.stats["mean"] for r in allreduce] == [3.0, 3.0, 2.0]
        gathered = _outputs(records, "c10d.allgather_.default")
        assert sorted(r.stats["mean"] for r in gathered) == [0.0, 1.0]
        (flat,) = _outputs(records, "c10d._allgather_base_.default")
        assert flat.stats["mean"] == 0.5
        (bcast,) = _outputs(records, "c10d.broadcast_.default")
        assert bcast.stats["mean"] == 6.0
        (scattered,) = _outputs(records, "c10d._reduce_scatter_base_.default")
        assert scattered.stats["min"] == 4.0 * rank
        if rank == 1:
            (received,) = _outputs(records, "c10d.recv_.default")
            assert received.stats["mean"] == 7.0
        names.append(
            {r.name for r in records if r.op.startswith("c10d.") and r.op != "c10d.recv_.default" and r.op != "c10d.send.default"}
        )
    assert names[0] == names[1]  # the same collective has the same name on every rank
