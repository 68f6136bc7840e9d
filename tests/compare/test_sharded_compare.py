"""Sharded runs (FSDP2, tensor parallelism) compare with a single process: the pieces of each
DTensor are merged into whole-tensor records when the sharded dump is read."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

import torchdebug
from tests import gloo
from tests.blocks import MLPBlock
from torchdebug.compare import compare
from torchdebug.compare._shards import ShardedRank, layouts
from torchdebug.records import Record
from torchdebug.store import _reader as reader

# -- merging statistics, from records alone ---------------------------------------------------------


def _record(rank: int, name: str, value: torch.Tensor, placement: str, shape: list[int], **extra) -> Record:
    stats = {
        "min": value.min().item(),
        "max": value.max().item(),
        "mean": value.double().mean().item(),
        "norm": value.double().norm().item(),
        "nan": 0,
        "posinf": 0,
        "neginf": 0,
    }
    info = {"subclass": "DTensor", "placements": [placement], "mesh": [2], "mesh_coordinate": [rank]}
    info["local_shape"] = list(value.shape)
    return Record(
        f"optimizer/-/aten.add_.Tensor#0/{name}", 0, rank, "optimizer", "-", "aten.add_.Tensor", 0, 0,
        name.split(".")[0], name.split(".")[1], dtype="float32", shape=shape, stats=stats, extra={**info, **extra},
    )  # fmt: skip


class _Rank:
    def __init__(self, rank: int, records: list[Record]) -> None:
        self.rank, self.path, self.world_size, self._records = rank, Path("."), 2, records

    def records(self) -> list[Record]:
        return self._records


def test_shards_merge_into_the_whole_tensors_statistics_and_partial_sums_keep_only_the_mean():
    whole = torch.randn(7, 3, generator=torch.Generator().manual_seed(0)) * 3
    pieces = whole.chunk(2)  # uneven: 4 and 3 rows, as DTensor shards them
    summands = [whole.double() * 0.25, whole.double() * 0.75]
    run = reader.Run(
        Path("."),
        {
            rank: _Rank(
                rank,
                [
                    _record(rank, "input.0", pieces[rank], "S(0)", [7, 3]),
                    _record(rank, "input.1", summands[rank], "P(sum)", [7, 3], partial=True),
                    _record(rank, "input.2", whole, "R", [7, 3]),
                ],
            )
            for rank in (0, 1)
        },
    )
    shard, partial, replicated = ShardedRank(run, 0).records()
    expected = {"min": whole.min(), "max": whole.max(), "mean": whole.double().mean(), "norm": whole.double().norm()}
    assert shard.shape == [7, 3] and shard.extra["merged_ranks"] == [0, 1] and shard.tensor is None
    for key, value in expected.items():
        assert math.isclose(shard.stats[key], value.item(), rel_tol=1e-12), key
    assert math.isclose(partial.stats["mean"], whole.double().mean().item(), rel_tol=1e-12)
    assert partial.stats["min"] is partial.stats["max"] is partial.stats["norm"] is None
    assert replicated is run.ranks[0].records()[2]  # the local tensor is the whole one


def test_counts_of_the_pieces_add_up_and_a_piece_written_before_a_count_existed_leaves_it_unknown():
    whole = torch.relu(torch.randn(8, 3, generator=torch.Generator().manual_seed(2)))
    pieces = whole.chunk(2)
    records = {rank: _record(rank, "input.0", pieces[rank], "S(0)", [8, 3]) for rank in (0, 1)}
    for rank, record in records.items():
        record.stats["zeros"] = int((pieces[rank] == 0).sum())
    merged = ShardedRank(reader.Run(Path("."), {rank: _Rank(rank, [r]) for rank, r in records.items()}), 0).records()
    assert merged[0].stats["zeros"] == int((whole == 0).sum()) and merged[0].stats["nan"] == 0
    del records[1].stats["zeros"]  # a rank's dump from before zeros existed
    merged = ShardedRank(reader.Run(Path("."), {rank: _Rank(rank, [r]) for rank, r in records.items()}), 0).records()
    assert merged[0].stats["zeros"] is None and merged[0].stats["nan"] == 0


def test_a_piece_whose_other_pieces_are_not_in_the_dump_is_marked_not_merged():
    piece = torch.arange(4.0)
    run = reader.Run(Path("."), {0: _Rank(0, [_record(0, "input.0", piece, "S(0)", [8])])})
    (record,) = ShardedRank(run, 0).records()
    assert record.stats["max"] == 3.0 and "1 of 2 found" in record.extra["one_shard"]


def test_plain_slots_holding_a_local_shard_follow_its_layout_through_shape_keeping_ops():
    local = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    made = _record(0, "output.0", local, "S(1)", [4, 16])
    plain_in = Record("forward/0/aten.relu.default#0/input.0", 0, 0, "forward", "0", "aten.relu.default", 0, 1, "input", "0")
    plain_in.dtype, plain_in.shape, plain_in.stats = "float32", [4, 8], dict(made.stats)
    plain_out = Record("forward/0/aten.relu.default#0/output.0", 0, 0, "forward", "0", "aten.relu.default", 0, 1, "output", "0")
    plain_out.dtype, plain_out.shape, plain_out.stats = "float32", [4, 8], {**made.stats, "min": 0.0}
    found = layouts([made, plain_in, plain_out])
    assert found[id(plain_in)].placements == ("S(1)",) and found[id(plain_out)].shape == (4, 16)


# -- FSDP2 and tensor parallelism on two gloo ranks against one process ----------------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(MLPBlock(), MLPBlock(), torch.nn.Linear(8, 4))


def _train(model: torch.nn.Module, batch: torch.Tensor, dump: str) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    debugger = torchdebug.Debugger(dump, task="statistics")
    for _ in range(2):
        debugger.start(model)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        debugger.step()
    debugger.close()
    return loss.item()


_BATCH = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
"""The global batch: FSDP's ranks take half each, tensor parallelism's both take all of it."""


def _worker(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = _model()
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    _train(model, _BATCH.chunk(2)[rank], f"{root}/fsdp")
    model = _model()
    mesh = init_device_mesh("cpu", (2,))
    for block in model[:2]:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    _train(model, _BATCH, f"{root}/tp")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    gloo.spawn(_worker, root, str(root))
    _train(_model(), _BATCH, str(root / "single"))
    return root


def _matched_share(result) -> float:
    """The share of the single process's tensor slots (side B) that found their counterpart: the
    sharded side's own ops (collectives, FSDP's copies and views of flat parameters) have none."""
    coverage = result.coverage()["b"]
    return coverage["matched"] / coverage["rows"]


@pytest.mark.slow
def test_one_rank_of_an_fsdp2_run_compares_with_a_single_process_run_of_the_global_batch(dumps):
    result = compare(dumps / "fsdp", dumps / "single", tensors=False)
    assert _matched_share(result) >= 0.9
    assert [row.name for row in result.rows if row.verdict == "error"] == []
    assert result.first_divergence is None
    merged = [row for row in result.rows if row.record_a is not None and row.record_a.extra.get("merged_ranks")]
    assert merged and all(row.verdict == "pass" for row in merged if row.matched)  # parameters, gradients, AdamW state
    assert {row.phase for row in merged} >= {"optimizer"}


@pytest.mark.slow
def test_a_tensor_parallel_run_compares_with_a_single_process_run(dumps):
    result = compare(dumps / "tp", dumps / "single", tensors=False)
    assert _matched_share(result) >= 0.9
    assert not [row for row in result.rows if row.shape_a != row.shape_b and row.matched]
    partial = [row for row in result.rows if "partial value (P(sum))" in row.message]
    assert partial and all(row.verdict == "pass" for row in partial)  # RowwiseParallel's matmul: its mean combines
    # the activations between the two layers are plain local shards, merged like DTensors
    assert any(row.op == "aten.relu.default" and row.record_a.extra.get("merged_ranks") for row in result.rows)
    # what a functional collective returns (DTensor's all-reduce, the AsyncCollectiveTensor wrapping
    # it) is captured once the collective completes, and agrees
    waited = [row for row in result.rows if row.matched and row.record_a.extra.get("subclass") == "AsyncCollectiveTensor"]
    assert waited and all(row.verdict == "pass" for row in waited)
    # the backward's all-reduce of the input gradient makes Partial pieces whole: what reads its
    # result is compared as it is, not merged as partial sums
    assert [row.name for row in result.rows if row.verdict == "error"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsdp", "tp"])
def test_ranks_of_a_sharded_run_hold_different_pieces_without_errors(dumps, kind):
    result = compare(dumps / kind)
    assert result.rows and result.first_divergence is None
    assert not [row for row in result.rows if row.record_a is not None and row.record_a.extra.get("placements") == ["S(0)"]]


def test_a_shards_record_and_a_plain_record_of_its_local_shape_compare_as_the_local_tensor():
    """An eager DTensor record (this rank's shard, under the global shape) against a compiled
    graph's plain record of the shard (a compiled graph computes on local tensors): no shape error,
    the statistics compared; a plain record of another shape still differs in shape."""
    from torchdebug.compare._rows import Row
    from torchdebug.compare._verdicts import judge

    piece = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    eager = _record(0, "input.0", piece, "S(0)", [8, 3])
    compiled = dataclasses.replace(eager, shape=[4, 3], extra={})
    other = dataclasses.replace(compiled, shape=[3, 4])
    rows = [Row.from_records(0, a, b, "exact", 0.0) for a, b in ((eager, compiled), (compiled, eager), (eager, other))]
    for row in rows:
        row.difference, row.tolerance = 0.0, 1e-6  # equal statistics
    judge(rows, growth=16)
    assert [(row.shape_a, row.shape_b) for row in rows[:2]] == [([4, 3], [4, 3])] * 2
    assert [row.verdict for row in rows[:2]] == ["pass", "pass"]
    assert rows[2].verdict == "error" and "shape differs: [8, 3] vs [3, 4]" in rows[2].message
