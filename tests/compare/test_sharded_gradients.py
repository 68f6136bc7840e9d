"""FSDP2's gradients, merged from the ranks' pieces, are judged against one process's on the whole
batch, though every activation they were made from holds half of it and cannot be compared: a
gradient divided twice or weight decay on the wrong parameters is named where it happens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchdebug
from tests import gloo
from tests.blocks import MLPBlock
from tests.compare.test_verdict_rules import _row, _stats
from torchdebug.compare import compare
from torchdebug.compare._verdicts import judge

_BATCH = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
_RUNS = {"healthy": {}, "divided": {"divide": True}, "decay_all": {"decay_all": True}}
"""The sharded runs: healthy, a gradient divided by the world size again, weight decay on the biases too."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(MLPBlock(), MLPBlock(), torch.nn.Linear(8, 4))


def _step(model: torch.nn.Module, batch: torch.Tensor, path: str, divide: bool = False, decay_all: bool = False) -> None:
    """One SGD step with weight decay on the weights (``decay_all``: on the biases too)."""
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    groups = [{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.1 if decay_all else 0.0}]
    optimizer = torch.optim.SGD(groups, lr=0.1)
    with torchdebug.dump(path, model=model, task="statistics"):
        model(batch).square().mean().backward()
        if divide:
            model[1].up.weight.grad.div_(2)  # FSDP2 averaged it over the ranks already
        optimizer.step()


def _worker(rank: int, root: str) -> None:
    from torch.distributed.fsdp import fully_shard

    for name, options in _RUNS.items():
        model = _model()
        for block in model[:2]:
            fully_shard(block)
        fully_shard(model)
        _step(model, _BATCH.chunk(2)[rank], f"{root}/{name}", **options)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sharded_gradients")
    gloo.spawn(_worker, root, str(root))
    _step(_model(), _BATCH, str(root / "single"))
    return root


def test_gradients_merged_from_the_ranks_of_half_the_batch_pass(dumps):
    result = compare(dumps / "healthy", dumps / "single")
    assert result.first_divergence is None and result.counts()["error"] == 0
    read = [row for row in result.rows if row.phase == "optimizer" and row.matched and row.record_a.extra.get("merged_ranks")]
    assert read and [row.name for row in read if row.verdict != "pass"] == []


def test_a_gradient_divided_twice_is_blamed_on_the_division(dumps):
    first = compare(dumps / "divided", dumps / "single").first_divergence
    assert first is not None and (first.op, first.io) == ("aten.div_.Tensor", "output")
    assert "the value entering it agrees" in first.message


def test_weight_decay_on_a_bias_is_blamed_on_its_decay(dumps):
    first = compare(dumps / "decay_all", dumps / "single").first_divergence
    assert first is not None and (first.phase, first.op, first.io) == ("optimizer", "aten.add.Tensor", "output")


def _merged_gradient(scale: float, error: float) -> tuple:
    """A merged gradient of A (no captured op made it: the ranks' collectives did) against B's, made
    from a value that cannot be compared (one piece of a split tensor), all of ``scale``."""
    piece = _row("output", 0.5, call=0, stats=_stats(scale), a={"extra": {"one_shard": "holds one S(0) piece of 2"}})
    merged = {"stats": _stats(scale * 1.01), "extra": {"merged_ranks": [0, 1]}}
    read = _row("input", error, call=1, op="aten.add_.Tensor", a=merged, b={"stats": _stats(scale)})
    judge([piece, read], growth=16)
    return read.verdict, read.attribution, read.message


def test_a_merged_gradient_that_cancels_below_atol_passes_and_one_beyond_growth_tolerances_is_blamed():
    verdict, attribution, message = _merged_gradient(1e-9, 0.03)  # a key bias's gradient: zero but for rounding
    assert (verdict, attribution) == ("pass", "inherited") and "a sum that cancels" in message
    verdict, attribution, message = _merged_gradient(1.0, 0.03)  # 0.03 > 16 tolerances of 1e-3
    assert (verdict, attribution) == ("error", "blamed") and "the difference enters here" in message
    assert "merged from every rank's pieces" in message
