"""Distributed runs on the native path, record by record against the dispatch mode (issue 48, item 2).

Two gloo ranks each dump the same steps both ways, with statistics and fingerprints, and with
stacks: a model whose forward runs c10d collectives (``dist.all_reduce`` waited and not, list and
tensor all-gathers, broadcast, reduce-scatter, send and recv, one never waited for) and functional
collectives on plain tensors (one waited for, one written in place, one left to capture's stop); an
FSDP2 training step (two blocks and the root sharded, AdamW on the sharded DTensor parameters), one
computing in float16, and
one with the blocks under selective activation checkpointing, one with them checkpointed and
compiled in place (torchtitan's recipe); a
tensor-parallel one (``ColwiseParallel`` and ``RowwiseParallel``, AdamW on DTensor parameters); and
``DistributedDataParallel`` ones (small buckets, gradients as bucket views, a micro-batch accumulated
under ``no_sync``); four of them at level ``mix`` too (FSDP2 under selective checkpointing, FSDP2
compiled, tensor parallelism, DDP: module records among the ops'); six of them a third time with
every CPU tensor kept as an accelerator's and staged before writes (``_STAGED``). A
collective's outputs are recorded once its work completes on both paths; where an asynchronous
collective completes, and so where its outputs land among the records, is up to the threads' timing,
so the comparison puts each collective's outputs after its inputs first (``_outputs_after_inputs``).
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import torchdebug
import torchdebug.debugger
from tests import gloo
from tests.blocks import MLPBlock
from tests.capture.test_collectives import collective_calls
from tests.capture.test_native_capture import _assert_same_dumps, assert_same_saved_tensors
from torchdebug.capture import native_capture, native_records
from torchdebug.capture.native_capture import why_not_native
from torchdebug.native.observer import STAGED_FACTS_WIDTH, NativeObserver, StagedFacts, load_observer
from torchdebug.records import Record


class _Collectives(nn.Module):
    """A forward of collectives on each rank's own values (``rank + 1`` and the like)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        collective_calls(dist.get_rank())
        summand = torch.full((4,), float(dist.get_rank() + 1), dtype=torch.float16)  # statistics taken at the flush
        dist.all_reduce(summand)
        y = x * self.scale
        group = dist.group.WORLD.group_name
        functional = torch.ops._c10d_functional.all_reduce(x * 3, "sum", group)
        functional = torch.ops._c10d_functional.wait_tensor(functional) * 2
        in_place = x.clone()
        torch.ops._c10d_functional.all_reduce_(in_place, "sum", group)
        torch.ops._c10d_functional.wait_tensor(in_place)
        torch.ops._c10d_functional.all_reduce(x + 1, "sum", group)  # waited for when capture stops
        return y.sum() + functional.sum()


def _collectives(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    model = _Collectives()
    x = torch.arange(4.0) + rank
    return model, lambda: model(x)


def _training(model: nn.Module, rank: int, *, foreach: bool = False) -> Callable[[], None]:
    """A training step of ``model`` (a sharded one) on a batch of its rank's own, with AdamW
    (``foreach``: each of its ops takes every parameter's tensors in one list)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=foreach)
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))

    def step() -> None:
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def _fsdp2(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(MLPBlock(), MLPBlock(), nn.Linear(8, 4))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    return model, _training(model, rank)


def _fsdp2_float16(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    """FSDP2 computing in float16 (``MixedPrecisionPolicy``): the unsharded parameters, float16, are
    kept by the callback and staged before the group's reshard frees their memory."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(MLPBlock(), MLPBlock(), nn.Linear(8, 4))
    policy = MixedPrecisionPolicy(param_dtype=torch.float16)
    for block in model[:2]:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model, _training(model, rank)


def _keep_matmuls(context: object, func: object, *args: object, **kwargs: object) -> object:
    from torch.utils.checkpoint import CheckpointPolicy

    return (
        CheckpointPolicy.MUST_SAVE
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        else CheckpointPolicy.PREFER_RECOMPUTE
    )


def _fsdp2_selective(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    """FSDP2 over blocks under selective activation checkpointing (their matmuls kept): a block's
    ``relu`` output, recomputed in the backward, is saved by its own node and by the next matmul's."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    torch.manual_seed(0)
    context = partial(create_selective_checkpoint_contexts, _keep_matmuls)
    blocks = [checkpoint_wrapper(MLPBlock(), checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=context) for _ in range(2)]
    model = nn.Sequential(*blocks, nn.Linear(8, 4))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    return model, _training(model, rank)


def _fsdp2_compiled(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    """torchtitan's recipe: blocks under activation checkpointing (``checkpoint_wrapper``), each
    compiled in place (inductor), then sharded with FSDP2; compiled by a step before capture starts."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*[checkpoint_wrapper(MLPBlock(), checkpoint_impl=CheckpointImpl.NO_REENTRANT) for _ in range(2)])
    model.append(nn.Linear(8, 4))
    for block in model[:2]:
        block.compile(backend="inductor")
        fully_shard(block)
    fully_shard(model)
    step = _training(model, rank)
    step()
    return model, step


def _tensor_parallel(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = parallelize_module(MLPBlock(), init_device_mesh("cpu", (2,)), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model, _training(model, rank, foreach=True)


def _overflowing(
    program: Callable[[int], tuple[nn.Module, Callable[[], object]]],
) -> Callable[[int], tuple[nn.Module, Callable[[], object]]]:
    """``program`` with its model's first linear weight (a DTensor shard where sharded) scaled to overflow
    float32 before the first step: an Inf, then NaNs, in every step."""

    def build(rank: int) -> tuple[nn.Module, Callable[[], object]]:
        model, step = program(rank)
        with torch.no_grad():
            next(module for module in model.modules() if isinstance(module, nn.Linear)).weight.mul_(1e37)
        return model, step

    return build


def _ddp_model(**options: bool) -> nn.Module:
    """DDP with buckets of a parameter or two: a bucket's all-reduce runs while the backward goes on,
    and the bucket's views are read at the backward's end (``gradient_as_bucket_view``: the gradients
    themselves, read by AdamW)."""
    torch.manual_seed(0)
    return nn.parallel.DistributedDataParallel(
        nn.Sequential(MLPBlock(), MLPBlock(), nn.Linear(8, 4)), bucket_cap_mb=1e-4, **options
    )


def _ddp(rank: int, **options: bool) -> tuple[nn.Module, Callable[[], object]]:
    model = _ddp_model(**options)
    return model, _training(model, rank)


def _ddp_accumulating(rank: int) -> tuple[nn.Module, Callable[[], object]]:
    """DDP accumulating a micro-batch's gradients under ``no_sync`` (no all-reduce) before the one reduced."""
    model = _ddp_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))

    def step() -> None:
        with model.no_sync():
            model(batch).square().mean().backward()
        model(batch * 2).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, step


_VALUES = {"task": "statistics", "checksum": True}
_STACKS = {"task": "structure", "stack": "all"}
_OVERFLOWS = {"task": "overflow_check", "overflow_nums": -1}
_PROGRAMS = {
    "statistics": (_collectives, _VALUES),
    "structure": (_collectives, _STACKS),
    "fsdp2-statistics": (_fsdp2, _VALUES),
    "fsdp2-structure": (_fsdp2, _STACKS),
    "fsdp2-float16-statistics": (_fsdp2_float16, _VALUES),
    "fsdp2-selective-statistics": (_fsdp2_selective, _VALUES),
    "fsdp2-compiled-statistics": (_fsdp2_compiled, {**_VALUES, "stack": "none"}),  # (compiled code's frames: made anew per run)
    "tp-statistics": (_tensor_parallel, _VALUES),
    "tp-structure": (_tensor_parallel, _STACKS),
    "fsdp2-selective-mix": (_fsdp2_selective, {**_VALUES, "level": "mix"}),
    "tp-mix": (_tensor_parallel, {**_STACKS, "level": "mix"}),
    "ddp-statistics": (_ddp, _VALUES),
    "ddp-view-statistics": (partial(_ddp, gradient_as_bucket_view=True), _VALUES),
    "ddp-accumulating-statistics": (_ddp_accumulating, _VALUES),
    "ddp-mix": (_ddp, {**_VALUES, "level": "mix"}),
    "fsdp2-compiled-mix": (_fsdp2_compiled, {**_VALUES, "stack": "none", "level": "mix"}),
    "fsdp2-overflow": (_overflowing(_fsdp2), _OVERFLOWS),
    "tp-overflow": (_overflowing(_tensor_parallel), _OVERFLOWS),
}

_STAGED = (
    "statistics",
    "fsdp2-statistics",
    "fsdp2-selective-statistics",
    "fsdp2-compiled-statistics",
    "tp-statistics",
    "ddp-view-statistics",
)
"""Programs dumped a third time on the native path with every CPU tensor kept as an accelerator's
(``NativeObserver.defer_cpu``) and staged only before writes: the path ``DEVICE_STATISTICS`` opens,
where FSDP2's reshard frees the memory of kept parameters (staged at its scope first) and compiled
code's kernels write its buffers unseen (staged at each op there)."""


def _worker(rank: int, root: str) -> None:
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torchdebug.debugger")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    for path in ("python", "native", "staged"):
        native = path != "python"
        torchdebug.debugger.why_not_native = why_not_native if native else (lambda config, model: "held on the dispatch mode")
        native_records.SWEEP_AFTER_BYTES = 0  # freed tensors let go at every op (sweeps): the records stay the same
        if path == "staged":
            native_capture.STAGE_AFTER_BYTES = -1
            load_observer().defer_cpu(True)
        for name, (program, options) in _PROGRAMS.items():
            if path == "staged" and name not in _STAGED:
                continue
            model, step = program(rank)
            with torchdebug.Debugger(f"{root}/{name}-{path}", **options) as debugger:
                for _ in range(2):
                    debugger.start(model)
                    step()
                    debugger.step()
    Path(root, f"said-{rank}.json").write_text(json.dumps([text for text in said if "op capture" in text]))
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    Path(root, f"ddp-{rank}.json").write_text(json.dumps(why_not_native(torchdebug.DebuggerConfig(), ddp)))
    Path(root, f"tensor-{rank}.json").write_text(json.dumps(why_not_native(torchdebug.DebuggerConfig(task="tensor"), ddp)))


def _outputs_after_inputs(records: list[Record]) -> list[Record]:
    """Each collective call's output records right after its inputs (in their order)."""
    collective = [r for r in records if r.op.split(".")[0] in ("c10d", "_c10d_functional") and r.io == "output"]
    outputs: dict[tuple, list[Record]] = {}
    for record in collective:
        outputs.setdefault((record.step, record.call_name), []).append(record)
    moved = {id(record) for record in collective}
    ordered: list[Record] = []
    for index, record in enumerate(records):
        if id(record) in moved:
            continue
        ordered.append(record)
        key = (record.step, record.call_name)
        following = records[index + 1] if index + 1 < len(records) else None
        if key in outputs and (following is None or (following.step, following.call_name) != key or id(following) in moved):
            ordered += outputs.pop(key)
    return ordered


def _tensor_records(folder: Path, rank: int) -> list[Record]:
    return [record for record in torchdebug.load(folder).ranks[rank].records() if record.kind == "tensor"]


@pytest.mark.slow
def test_distributed_runs_dump_the_same_records_on_both_paths(tmp_path: Path) -> None:
    gloo.spawn(_worker, tmp_path, str(tmp_path))
    for rank in (0, 1):
        on_the_mode = "torchdebug: op capture through the dispatch mode: held on the dispatch mode"
        on_the_native_path = "torchdebug: op capture on the native path"
        said = json.loads((tmp_path / f"said-{rank}.json").read_text())
        assert said == [on_the_mode] * len(_PROGRAMS) + [on_the_native_path] * (len(_PROGRAMS) + len(_STAGED))
        assert json.loads((tmp_path / f"ddp-{rank}.json").read_text()) is None
        assert "task='tensor' in a distributed run" in json.loads((tmp_path / f"tensor-{rank}.json").read_text())
        for name, path in [*((name, "native") for name in _PROGRAMS), *((name, "staged") for name in _STAGED)]:
            python, native = (
                _outputs_after_inputs(_tensor_records(tmp_path / f"{name}-{side}", rank)) for side in ("python", path)
            )
            # inductor's buffers; an overflow check records the calls found alone: a view's base no recorded
            # call made is the value last made in its memory on the native path (a reused buffer)
            _assert_same_dumps(python, native, joins=name.startswith("fsdp2-compiled") or name.endswith("-overflow"))
            if name.endswith("-overflow"):  # the calls found, each step, with their tensors bit for bit
                assert {record.step for record in native} == {0, 1}
                folders = (tmp_path / f"{name}-python", tmp_path / f"{name}-native")
                assert assert_same_saved_tensors(*folders, python, native, rank) > 0
        records = {r.name: r for r in torchdebug.load(tmp_path / "statistics-native").ranks[rank].records() if r.step == 0}
        mean = {name.split("/", 2)[2]: record.stats["mean"] for name, record in records.items() if record.stats}
        assert mean["c10d.allreduce_.default#0/input.0.0"] == rank + 1  # this rank's summand
        assert mean["c10d.allreduce_.default#0/output.0.0"] == 3.0  # the sum, not yet multiplied by 10
        assert mean["c10d.allgather_.default#0/output.0.0.1"] == 1.0  # rank 1's
        assert mean["c10d._reduce_scatter_base_.default#0/output.0"] == [1.0, 5.0][rank]  # halves of [0, 2, 4, 6]
        assert mean["c10d.recv_.default#0/output.0.0" if rank else "c10d.send.default#0/input.0.0"] == 7.0
        assert mean["_c10d_functional.all_reduce.default#0/output.0"] == 3 * 4.0
        assert mean["_c10d_functional.all_reduce_.default#0/output.0"] == 4.0
        assert mean["_c10d_functional.all_reduce.default#1/output.0"] == 6.0  # waited for at capture's stop
        assert mean["c10d.allreduce_.default#2/output.0.0"] == 2.0  # never waited by the user
        assert mean["c10d.allreduce_.default#3/input.0.0"] == rank + 1  # float16: kept, copied before the collective wrote it
        assert mean["c10d.allreduce_.default#3/output.0.0"] == 3.0
        _assert_read_at_the_op(tmp_path, rank)
        compiled = _tensor_records(tmp_path / "fsdp2-compiled-statistics-native", rank)
        assert {"0", "1"} <= {r.module for r in compiled if r.phase == "forward"}  # the compiled blocks' ops, named after them
    for name in ("ddp-statistics", "ddp-view-statistics", "ddp-accumulating-statistics"):
        for path in ("python", "native"):
            _assert_reduced_alike(tmp_path / f"{name}-{path}")


def _summing_once_copied(rank: int, root: str) -> None:
    """A float16 summand (kept: its statistics wait for the staging) all-reduced in place, with every
    CPU tensor staged only before writes: the observer copies it before the collective writes it, and
    reads it again once the collective completes, at the same version; the write that follows stages
    them together. Every staged tensor's count of writes is given as 0, as where the copy's storage
    takes the address of a freed storage that a collective wrote once, whose count it inherits
    (``storage_writes`` is by address): the copy and the summand's final value then agree in key,
    version and writes."""
    native_capture.STAGE_AFTER_BYTES = -1
    observer = load_observer()
    observer.defer_cpu(True)
    facts = type(observer).staged_facts

    def without_writes(self: NativeObserver, count: int) -> array:
        given = facts(self, count)
        given[StagedFacts._fields.index("writes") :: STAGED_FACTS_WIDTH] = array("q", [0]) * count
        return given

    type(observer).staged_facts = without_writes
    try:
        with torchdebug.dump(root, task="statistics"):
            for _ in range(3):
                summand = torch.full((4,), float(rank + 1), dtype=torch.float16)
                dist.all_reduce(summand)
                summand.add_(1)  # (a write: what is kept on its memory is staged first)
    finally:
        type(observer).staged_facts = facts
        observer.defer_cpu(False)


@pytest.mark.slow
def test_a_tensor_copied_before_a_collective_writes_it_is_not_read_as_its_result(tmp_path: Path) -> None:
    """A copy the observer takes before a write holds the values from before it: it is never staged
    as the same values as a slot of its tensor's at the same version (a collective's output, read
    after the collective moved no version). Before, the staging read the two once, and the
    collective's output took the summand's own values where the counts met by chance (twice in 360
    runs of a rank, two cores under load, torch 2.11: the flaky failure of the test above)."""
    gloo.spawn(_summing_once_copied, tmp_path, str(tmp_path / "dump"))
    for rank in (0, 1):
        records = _tensor_records(tmp_path / "dump", rank)
        means = {r.name.split("/", 2)[2]: r.stats["mean"] for r in records if r.op.startswith(("c10d.", "aten.add_."))}
        for call in range(3):
            assert means[f"c10d.allreduce_.default#{call}/input.0.0"] == rank + 1
            assert means[f"c10d.allreduce_.default#{call}/output.0.0"] == 3.0
            assert means[f"aten.add_.Tensor#{call}/input.0"] == 3.0


def _optimizer_records(folder: Path, rank: int) -> dict[str, Record]:
    return {r.name: r for r in torchdebug.load(folder).ranks[rank].records() if r.step == 0 and r.phase == "optimizer"}


def _assert_read_at_the_op(root: Path, rank: int) -> None:
    """The optimizer's in-place ops on DTensors are read at the op: the first AdamW step's ``mul_``
    (weight decay) reads an FSDP2 parameter, then writes it; with ``foreach`` (tensor parallelism),
    ``_foreach_sqrt`` reads the squared averages ``_foreach_addcmul_`` wrote, where a DTensor's
    handlers move no version (the dispatch mode once read the zeros they were made with)."""
    records = _optimizer_records(root / "fsdp2-statistics-native", rank)
    decayed = records["optimizer/-/aten.mul_.Tensor#0/input.0"], records["optimizer/-/aten.mul_.Tensor#0/output.0"]
    assert [r.extra["subclass"] for r in decayed] == ["DTensor", "DTensor"]
    assert decayed[0].stats["norm"] > decayed[1].stats["norm"] > 0 and decayed[0].checksum != decayed[1].checksum
    for path in ("python", "native"):
        averaged = _optimizer_records(root / f"tp-statistics-{path}", rank)["optimizer/-/aten._foreach_sqrt.default#0/input.0.0"]
        assert averaged.extra["subclass"] == "DTensor" and averaged.stats["norm"] > 0, path


def _assert_reduced_alike(folder: Path) -> None:
    """What DDP reads after its all-reduces is equal on both ranks: its buckets' views at the backward's
    end (gloo completes a bucket's future before its work, and the reducer views the bucket meanwhile),
    and the gradients AdamW reads (with ``gradient_as_bucket_view``, the views the reduction wrote
    without moving their versions)."""
    reduced = [
        {
            (r.step, r.name): (r.stats, r.checksum)
            for r in _tensor_records(folder, rank)
            if r.phase == "optimizer" or r.op == "aten.as_strided.default"
        }
        for rank in (0, 1)
    ]
    assert reduced[0] and reduced[0] == reduced[1], folder.name
