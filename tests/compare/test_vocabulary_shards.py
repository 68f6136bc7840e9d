"""A vocabulary-parallel embedding on plain local tensors (Megatron's layout, no DTensor) against one
process: the table's rows, its gradient and the optimizer's reads are merged from the ranks' blocks
(their twins in the single process are world-size times as large along one dimension); the local
ids and the unmasked lookups cannot be compared, and a wrong shard offset is found at the all-reduce
that makes the lookups whole, in the embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from tests import gloo
from tests.compare.vocab_shards import VocabShard
from torchdebug.compare import compare
from torchdebug.compare._shards import plain_shards
from torchdebug.records import Record, make_name

_IDS = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(1))


class _Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def _step(model: nn.Module, path: str) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(path, model=model, task="statistics"):
        model(_IDS).square().mean().backward()
        optimizer.step()


def _worker(rank: int, root: str) -> None:
    for name, offset in (("healthy", 0), ("offset", 1)):
        model = _Tokens()
        model.embed = VocabShard(model.embed.weight, rank, 2, offset)
        _step(model, f"{root}/{name}")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vocabulary_shards")
    gloo.spawn(_worker, root, str(root))
    _step(_Tokens(), str(root / "single"))
    return root


def test_a_vocabulary_split_over_plain_local_tensors_compares_without_errors(dumps):
    result = compare(dumps / "healthy", dumps / "single")
    assert result.counts()["error"] == 0 and result.first_divergence is None
    table = [row for row in result.rows if row.phase == "optimizer" and row.matched and row.shape_b == [16, 8]]
    assert table and all(row.verdict == "pass" and row.record_a.extra["merged_ranks"] == [0, 1] for row in table)
    local = {row.arg: row.message for row in result.rows if row.op == "aten.embedding.default" and row.verdict == "incomparable"}
    assert "ids of this rank's vocabulary shard" in local["1"] and "lookups in its vocabulary shard" in local["0"]


def test_a_wrong_vocabulary_shard_offset_is_found_at_the_all_reduce_of_the_lookups(dumps):
    first = compare(dumps / "offset", dumps / "single").first_divergence
    assert first is not None and first.module == "embed" and first.op.startswith("c10d.all")
    assert "could not be judged one by one" in first.message


def _slot(name: str, shape: list[int], phase: str = "optimizer", io: str = "input") -> Record:
    stats = {"min": -1.0, "max": 1.0, "mean": 0.0, "norm": float(shape[0])}
    return Record(
        make_name(phase, "-", "aten.add_.Tensor", 0, io, name), 0, 0, phase, "-", "aten.add_.Tensor", 0, 0, io, name,
        dtype="float32", shape=shape, stats=stats,
    )  # fmt: skip


def test_plain_shards_are_the_parameters_whose_twin_is_world_size_times_as_large_along_one_dimension():
    rows, activation = _slot("0", [8, 16]), _slot("0", [4, 16], phase="forward", io="output")
    square = _slot("1", [8, 8])  # as large as its twin: replicated
    twins = [_slot("0", [16, 16]), _slot("0", [8, 16], phase="forward", io="output"), _slot("1", [8, 8])]
    assert plain_shards([rows, activation, square], twins, world=2) == {rows.name: (16, 16)}
