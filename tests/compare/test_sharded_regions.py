"""Inside a tensor-parallel region, against one process: the local tensors between DTensor ops are
read as pieces of the whole through views and transposes (a projection's columns seen as local
heads), so a bug there is found where it is; a vocabulary-sharded embedding's unmasked lookups are
not taken for values of the single process (``DTensor.from_local``'s own view: test_flow_alignment)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdebug
from tests import gloo
from torchdebug.compare import compare
from torchdebug.compare._shard_slots import unreduced_summands
from torchdebug.compare._shards import ShardedRank, layouts
from torchdebug.records import Record, make_name
from torchdebug.store import _reader as reader

# -- records alone ------------------------------------------------------------------------------------


def _slot(call: int, op: str, io: str, arg: str, shape: list[int] | None, stats: dict | None, **fields) -> Record:
    return Record(
        make_name("forward", "attn", op, call, io, arg), 0, 0, "forward", "attn", op, call, call, io, arg,
        dtype="float32" if shape is not None else None, shape=shape, stats=stats, **fields,
    )  # fmt: skip


_STATS = {"min": -1.0, "max": 2.0, "mean": 0.25, "norm": 9.0}
_DTENSOR = {"subclass": "DTensor", "mesh": [2], "mesh_coordinate": [0]}


def test_local_columns_viewed_as_local_heads_and_transposed_stay_pieces_of_the_whole():
    made = _slot(
        0,
        "aten.view.default",
        "output",
        "0",
        [8, 6, 16],
        _STATS,
        extra={**_DTENSOR, "placements": ["S(2)"], "local_shape": [8, 6, 8]},
    )
    heads = [
        _slot(1, "aten.view.default", "input", "0", [8, 6, 8], _STATS),
        _slot(1, "aten.view.default", "output", "0", [8, 6, 1, 8], _STATS),
    ]
    moved = [
        _slot(2, "aten.transpose.int", "input", "0", [8, 6, 1, 8], _STATS),
        _slot(2, "aten.transpose.int", "input", "1", None, None, kind="value", value=1),
        _slot(2, "aten.transpose.int", "input", "2", None, None, kind="value", value=2),
        _slot(2, "aten.transpose.int", "output", "0", [8, 1, 6, 8], _STATS),
    ]
    back = [
        _slot(3, "aten.reshape.default", "input", "0", [8, 6, 1, 8], _STATS),
        _slot(3, "aten.reshape.default", "output", "0", [8, 48], _STATS),
    ]
    found = layouts([made, *heads, *moved, *back])
    assert (found[id(heads[1])].placements, found[id(heads[1])].shape) == (("S(2)",), (8, 6, 2, 8))
    assert (found[id(moved[3])].placements, found[id(moved[3])].shape) == (("S(1)",), (8, 2, 6, 8))
    assert id(back[1]) not in found  # heads merged with the positions before them: no block of the whole


def test_views_of_one_saved_tensor_keep_each_its_own_layout():
    """A tensor dump saves a piece and its views as one tensor (one key): each slot takes the layout
    of its own shape."""
    saved = {"tensor": {"file": "t.safetensors", "key": "k"}}
    made = _slot(
        0,
        "aten.view.default",
        "output",
        "0",
        [8, 6, 16],
        _STATS,
        extra={**_DTENSOR, "placements": ["S(2)"], "local_shape": [8, 6, 8]},
        **saved,
    )
    heads = [
        _slot(1, "aten.view.default", "input", "0", [8, 6, 8], _STATS, **saved),
        _slot(1, "aten.view.default", "output", "0", [8, 6, 1, 8], _STATS, **saved),
    ]
    columns = _slot(2, "aten.relu.default", "input", "0", [8, 6, 8], _STATS, **saved)
    found = layouts([made, *heads, columns])
    assert found[id(heads[1])].shape == (8, 6, 2, 8) and found[id(columns)].shape == (8, 6, 16)


def test_a_vocabulary_sharded_embeddings_unmasked_lookups_cannot_be_compared():
    lookups = _slot(
        0,
        "aten.embedding.default",
        "output",
        "0",
        [4, 6, 16],
        _STATS,
        extra={**_DTENSOR, "placements": ["MaskP(sum, torch.Size([16, 16]), 0)"], "local_shape": [4, 6, 16]},
    )

    class _Rank:
        rank, path, world_size = 0, Path("."), 2

        def records(self) -> list[Record]:
            return [lookups]

    (read,) = ShardedRank(reader.Run(Path("."), {0: _Rank()}), 0).records()
    assert "lookups in its vocabulary shard" in read.extra["one_shard"] and read.stats == _STATS


# -- tensor and sequence parallelism on two gloo ranks against one process --------------------------

_X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))


class _Attention(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(8, 8) for _ in range(4))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[:2]
        q, k, v = (t.view(batch, seq, -1, 4).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        y = F.scaled_dot_product_attention(q, k, v) * self.scale  # on this rank's heads under tensor parallelism
        return self.out(y.transpose(1, 2).reshape(batch, seq, -1))


class _Block(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.attn, self.head = nn.LayerNorm(8), _Attention(scale), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.attn(self.norm(x)))


def _step(model: nn.Module, x: torch.Tensor, path: str) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(path, model=model, task="statistics"):
        model(x).square().mean().backward()
        optimizer.step()


def _worker(rank: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2,))
    for name, scale in (("healthy", 1.0), ("heads_scaled", 1.05)):
        model = _Block(scale)
        plan = {f"attn.{p}": ColwiseParallel() for p in ("q", "k", "v")}
        plan.update(
            {
                "norm": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attn.out": RowwiseParallel(output_layouts=Shard(1)),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            }
        )
        parallelize_module(model, mesh, plan)
        _step(model, _X.chunk(2, dim=1)[rank], f"{root}/{name}")  # sequence parallel: this rank's positions
    model = _Block(1.0)
    plan = {f"attn.{p}": ColwiseParallel() for p in ("q", "k", "v")}
    parallelize_module(model, mesh, {**plan, "attn.out": RowwiseParallel(output_layouts=Partial())})  # no all-reduce
    _step(model, _X, f"{root}/unreduced")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded_regions")
    gloo.spawn(_worker, root, str(root))
    _step(_Block(1.0), _X, str(root / "single"))
    return root


def test_a_sequence_parallel_attention_on_local_heads_compares_without_errors(dumps):
    result = compare(dumps / "healthy", dumps / "single")
    assert result.counts()["error"] == 0 and result.first_divergence is None
    sdpa = [row for row in result.rows if row.op.startswith("aten._scaled_dot_product") and row.io == "output" and row.arg == "0"]
    assert sdpa and all(row.verdict == "pass" and row.record_a.extra.get("merged_ranks") for row in sdpa)


def test_a_scale_on_the_local_heads_is_found_where_it_is(dumps):
    first = compare(dumps / "heads_scaled", dumps / "single").first_divergence
    assert first is not None and (first.module, first.op, first.io) == ("attn", "aten.mul.Tensor", "output")
    assert math.isclose(first.difference, 0.05, rel_tol=0.1)


def test_a_summand_left_unreduced_is_found_in_the_layer_that_returns_it(dumps):
    first = compare(dumps / "unreduced", dumps / "single").first_divergence
    assert first is not None and first.module == "attn.out" and "a missing all-reduce" in first.message


def test_a_summand_is_reduced_when_a_collective_reads_it_and_unreduced_when_combined_first():
    summand = {**_DTENSOR, "placements": ["P(sum)"], "local_shape": [4, 8]}
    made = _slot(0, "aten.mm.default", "output", "0", [4, 8], _STATS, extra=summand)
    split = [
        _slot(1, "aten.split.Tensor", "input", "0", [4, 8], _STATS),
        _slot(1, "aten.split.Tensor", "output", "0", [2, 8], _STATS),
    ]
    reduced = _slot(2, "_c10d_functional.reduce_scatter_tensor.default", "input", "0", [2, 8], _STATS)
    assert unreduced_summands([made, *split, reduced], layouts([made])) == {}
    other = {**_STATS, "mean": 0.5}
    added = [_slot(2, "aten.add.Tensor", "input", "0", [4, 8], other), _slot(2, "aten.add.Tensor", "input", "1", [4, 8], _STATS)]
    assert unreduced_summands([made, *added], layouts([made])) == {id(made): added[0].call_name}
