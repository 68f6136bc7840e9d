"""Activation checkpointing around a block compiled on its own: the block's forward graph runs again
in the backward. The graph dump records that run as eager capture records a recomputation (phase
``recompute``, each call naming the forward call it repeats), and the backward of every block reads
its own forward's values, so compare pairs the two dumps as it pairs two eager ones (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchdebug
from tests.backends import dump_backend, graph_and_eager_dumps
from torchdebug.records import Record


class _Block(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.scale != 1.0:
            h = h * self.scale  # the planted bug
        return x + self.fc2(h)


class _Model(nn.Module):
    """Three blocks of one class, the last one checkpointed (the second and third share a compiled
    graph: the first reads an input that needs no gradient). Its backward runs first, so a
    recomputation taken for a new forward run would be the one the second block's backward reads."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block(scale if index == 2 else 1.0) for index in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if index == 2 else block(x)
        return x.pow(2).mean()


def _step(model: nn.Module) -> None:
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).backward()


def _compile_blocks(model: nn.Module, backend: object) -> nn.Module:
    """The model with each block compiled on its own."""
    for block in model.blocks:
        block.compile(backend=backend)
    return model


def _dumps(tmp_path: Path, scale: float) -> tuple[Path, Path]:
    """A graph dump (aot_eager, each block compiled on its own) of ``_Model(scale)``'s step and an
    eager dump of the healthy model's."""
    return graph_and_eager_dumps(tmp_path, lambda: _Model(scale), _Model, _step, compile=_compile_blocks)


def _records(path: Path) -> list[Record]:
    return [r for r in torchdebug.load(path).ranks[0].records() if r.kind == "tensor"]


def test_the_forward_graph_run_again_in_the_backward_is_recorded_as_a_recomputation(tmp_path: Path) -> None:
    compiled, eager = _dumps(tmp_path, 1.0)
    records = _records(compiled)
    recomputed = {(r.name.rsplit("/", 1)[0], r.fwd) for r in records if r.phase == "recompute"}
    assert ("recompute/blocks.2.fc1/aten.addmm.default#0", "forward/blocks.2.fc1/aten.addmm.default#0") in recomputed
    assert {name.split("/")[1] for name, _ in recomputed} <= {"blocks.2", "blocks.2.fc1", "blocks.2.fc2"}
    assert not any(r.phase == "forward" and r.call > 0 and r.module.startswith("blocks.2") for r in records)
    # each block's backward belongs to its own forward (the recomputation took no block's place)
    backward = {r.module.split(".")[1] for r in records if r.phase == "backward" and r.module.startswith("blocks.")}
    assert backward == {"0", "1", "2"}
    backward_fwd = [(r.fwd, r.module) for r in records if r.phase == "backward" and r.fwd is not None]
    assert all(fwd.split("/")[1].split(".")[:2] == module.split(".")[:2] for fwd, module in backward_fwd)
    eager_recomputed = {r.name.rsplit("/", 1)[0] for r in _records(eager) if r.phase == "recompute"}
    assert "recompute/blocks.2.fc1/aten.addmm.default#0" in eager_recomputed


@pytest.mark.parametrize("scale", [1.0, 1.05])
def test_a_checkpointed_compiled_block_compares_with_eager_as_two_eager_dumps_do(tmp_path: Path, scale: float) -> None:
    result = torchdebug.compare(*_dumps(tmp_path, scale))
    assert not result.coverage()["b"]["other_phases"]  # eager's recomputation is paired, not left aside
    if scale == 1.0:
        assert result.counts()["error"] == 0 and result.counts()["warning"] == 0
    else:
        first = result.first_divergence
        assert first is not None and first.name == "forward/blocks.2/aten.mul.Tensor#0/output.0"


def test_a_graph_that_first_runs_in_the_backward_is_no_recomputation(tmp_path: Path) -> None:
    """A compiled update run from a gradient hook (an optimizer step in the backward) runs while the
    autograd engine does, but repeats no forward run: it keeps its phase."""
    torch._dynamo.reset()
    backend = dump_backend(tmp_path, backend="aot_eager")
    weight = torch.randn(4, requires_grad=True)
    update = torch.compile(lambda param: param.grad.mul(0.5).neg(), backend=backend)
    updates = []
    weight.register_post_accumulate_grad_hook(lambda param: updates.append(update(param)))
    (torch.compile(lambda x: (x * weight).sin().sum(), backend=backend)(torch.randn(4))).backward()
    backend.data_dump.close()
    torch._dynamo.reset()
    records = _records(tmp_path)
    assert len(updates) == 1 and any(r.op == "aten.neg.default" for r in records)
    assert not any(r.phase == "recompute" for r in records)
