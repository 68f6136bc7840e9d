"""An in-place op whose autograd kernel saves a clone of ``self`` before it runs (``h.mul_(w)`` with
``w`` requiring grad): the clone makes a node of its own first, and the backward ops of the
in-place op's node still take the in-place op's module and call, on both paths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchdebug


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 2.0))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.mul_(self.weight)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.scale = _Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.first(x)).sum()


@pytest.mark.parametrize("native", ["0", "1"], ids=["dispatch-mode", "native"])
def test_the_backward_of_an_in_place_op_that_saves_a_clone_takes_its_module(tmp_path, monkeypatch, native: str) -> None:
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    torch.manual_seed(0)
    model = _Model()
    with torchdebug.dump(tmp_path, model=model, task="structure", stack="none"):
        model(torch.randn(3, 4)).backward()
    records = [record for record in torchdebug.load(tmp_path).ranks[0].records() if record.phase == "backward"]
    of_mul = {record.fwd for record in records if record.module == "scale"}
    assert of_mul == {"forward/scale/aten.mul_.Tensor#0"}
    assert not [record.name for record in records if record.module == "-" and record.op != "aten.detach.default"]
