"""Collectives under torch.distributed (gloo): outputs captured after the work completes.

The programs (plain collectives, functional collectives, DTensor tensor parallelism with op and
module records) run in one spawn of two gloo ranks, each into its own dump, which the tests of this
module read.
"""

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torchdebug
from tests import gloo
from tests.blocks import MLPBlock
from torchdebug.capture.collectives import completed


def collective_calls(rank: int) -> None:
    """Plain collectives on each rank's own values, waited for and not, one never waited for."""
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


def _collectives_worker(rank: int, dump_path: str) -> None:
    with torchdebug.dump(dump_path):
        collective_calls(rank)


def _worker(rank: int, root: str) -> None:
    _collectives_worker(rank, f"{root}/collectives")
    _functional_worker(rank, f"{root}/functional")
    _tensor_parallel_worker(rank, f"{root}/tensor_parallel", root)
    _tensor_parallel_modules_worker(f"{root}/tensor_parallel_modules")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the four dumps (``collectives``, ``functional``, ``tensor_parallel``,
    ``tensor_parallel_modules``) and the tensor-parallel ranks' reduced outputs (``{rank}.json``),
    written by one spawn of two ranks."""
    root = tmp_path_factory.mktemp("collectives")
    gloo.spawn(_worker, root, str(root))
    return root


def _outputs(records, op):
    return [r for r in records if r.op == op and r.io == "output" and r.kind == "tensor"]


def test_collective_outputs_hold_the_values_after_completion(dumps):
    run = torchdebug.load(dumps / "collectives")
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


# -- functional collectives (DTensor, tensor parallelism) ---------------------------------------------


def _functional_program(rank: int) -> dict[str, torch.Tensor]:
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    x = torch.arange(4.0) + 4 * rank  # [0, 1, 2, 3] and [4, 5, 6, 7]: their sum [4, 6, 8, 10]
    reduced = funcol.all_reduce(x, "sum", group)  # an AsyncCollectiveTensor
    doubled = reduced.view(2, 2) * 2  # a view runs unwaited, the multiplication waits
    tripled = funcol.wait_tensor(funcol.all_reduce(x * 3, "sum", group))
    inplace = x.clone()
    torch.ops._c10d_functional.all_reduce_(inplace, "sum", group.group_name)
    torch.ops._c10d_functional.wait_tensor(inplace)
    late = funcol.all_reduce(x + 1, "sum", group)  # waited for when capture stops
    return {"doubled": doubled, "tripled": tripled, "inplace": inplace, "late": late}


def _functional_worker(rank: int, dump_path: str) -> None:
    plain = _functional_program(rank)
    with torchdebug.dump(dump_path):
        captured = _functional_program(rank)
    for key, value in plain.items():
        assert torch.equal(value, captured[key]), key


def test_functional_collective_outputs_hold_the_reduced_values(dumps):
    run = torchdebug.load(dumps / "functional")
    for rank, dump in sorted(run.ranks.items()):
        records = {r.name: r for r in dump.records() if r.kind == "tensor"}
        means = {name.removeprefix("forward/-/"): r.stats["mean"] for name, r in records.items()}
        assert [means[f"_c10d_functional.all_reduce.default#{call}/output.0"] for call in range(3)] == [7.0, 21.0, 9.0]
        assert means["_c10d_functional.all_reduce_.default#0/output.0"] == 7.0
        assert means["_c10d_functional.all_reduce_.default#0/input.0"] == 1.5 + 4 * rank  # before the reduction
        assert means["_c10d_functional._wrap_tensor_autograd.default#0/output.0"] == 7.0
        assert means["aten.view.default#0/input.0"] == means["aten.view.default#0/output.0"] == 7.0
        assert means["aten.mul.Tensor#0/input.0"] == 7.0 and means["aten.mul.Tensor#0/output.0"] == 14.0
        assert means["_c10d_functional.wait_tensor.default#0/input.0"] == 21.0
        assert means["_c10d_functional.wait_tensor.default#1/input.0"] == 7.0
        unwaited = [r for r in records.values() if r.extra.get("subclass") == "AsyncCollectiveTensor"]
        assert unwaited and all(r.stats["min"] >= 4.0 for r in unwaited), rank  # never a rank's own summand


# -- tensor parallelism: DTensor's functional collectives -----------------------------------------------


def _tensor_parallel_step(mesh, dump_path: str | None) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:  # noqa: ANN001
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = parallelize_module(MLPBlock(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    reduced = []
    model.down.register_forward_hook(lambda module, inputs, output: reduced.append(output))  # after RowwiseParallel's
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torchdebug.dump(dump_path) if dump_path else contextlib.nullcontext():
        loss = model(batch).square().mean()
        loss.backward()
    return loss, [p.grad.to_local() for p in model.parameters()], reduced[0]


def _tensor_parallel_worker(rank: int, dump_path: str, out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    loss, grads, _ = _tensor_parallel_step(mesh, None)
    captured_loss, captured_grads, reduced = _tensor_parallel_step(mesh, dump_path)
    assert torch.equal(loss, captured_loss) and all(map(torch.equal, grads, captured_grads))
    reduced = reduced.wait() if hasattr(reduced, "wait") else reduced
    Path(out_path, f"{rank}.json").write_text(json.dumps({"min": reduced.min().item(), "max": reduced.max().item()}))


def test_tensor_parallel_all_reduce_records_hold_the_reduced_output(dumps):
    run = torchdebug.load(dumps / "tensor_parallel")
    for rank, dump in sorted(run.ranks.items()):
        expected = json.loads((dumps / f"{rank}.json").read_text())
        forward = {r.name: r for r in dump.records() if r.phase == "forward"}
        # issued by RowwiseParallel's hook on `down`, after `down` returned: filed under `down`
        reduced = forward["forward/down/_c10d_functional.all_reduce.default#0/output.0"]
        assert (reduced.stats["min"], reduced.stats["max"]) == (expected["min"], expected["max"]), rank
        residual = forward["forward/<root>/aten.add.Tensor#0/input.0"]  # RowwiseParallel's output, plus the block's input
        assert residual.extra.get("subclass") == "AsyncCollectiveTensor" and residual.stats == reduced.stats


def _tensor_parallel_modules_worker(dump_path: str) -> None:
    """The GPT example's MLPs split by tensor parallelism, op and module records (``level="mix"``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from examples.gpt import GPT, GPTConfig, make_batch

    config = GPTConfig(n_layer=1, d_model=16, n_head=2, seq_len=8, vocab=32)
    torch.manual_seed(0)
    model = GPT(config)
    parallelize_module(model.layers[0].mlp, init_device_mesh("cpu", (2,)), {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    with torchdebug.dump(dump_path, level="mix"):
        model(*make_batch(config, batch=2)).backward()


def test_a_module_output_still_being_reduced_is_recorded_once_reduced(dumps):
    """RowwiseParallel hands the MLP's output out before its all-reduce is waited for (an
    AsyncCollectiveTensor): the MLP's module record holds the reduced output, the same on both
    ranks, not this rank's buffer while the collective still writes it."""
    run = torchdebug.load(dumps / "tensor_parallel_modules")
    outputs = []
    for rank, dump in sorted(run.ranks.items()):
        forward = {r.name.removeprefix("forward/layers.0.mlp"): r for r in dump.records() if r.phase == "forward"}
        module = forward["/module#0/output.0"]
        assert module.extra.get("subclass") == "AsyncCollectiveTensor", rank
        assert module.stats == forward[".out/_c10d_functional.all_reduce.default#0/output.0"].stats, rank
        outputs.append(module.stats)
    assert outputs[0] == outputs[1]


class _Work:
    """A collective's work as ``completed`` asks it: whether it completed, and its future."""

    def __init__(self, completed: bool, future: bool | None) -> None:
        self._completed, self._future = completed, future

    def is_completed(self) -> bool:
        return self._completed

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            raise RuntimeError("this work has no future")
        future: torch.futures.Future = torch.futures.Future()
        if self._future:
            future.set_result(None)
        return future


@pytest.mark.parametrize(
    ("work", "device", "expected"),
    [
        (_Work(True, False), "cpu", True),
        (_Work(False, True), "cpu", True),  # gloo: the future completes before the work
        (_Work(False, False), "cpu", False),
        (_Work(False, None), "cpu", False),  # a work with no future
        (_Work(False, True), "meta", False),  # a device's future tells nothing of the values
    ],
    ids=["completed", "future-done", "in-flight", "no-future", "device-future"],
)
def test_a_collective_is_complete_once_its_work_or_its_host_future_is(work: _Work, device: str, expected: bool) -> None:
    outputs = [[torch.zeros(2, device=device)], torch.zeros(1, device=device)]
    assert completed(work, outputs) is expected
