"""Eager against compiled where a graph writes its input or returns views of it (issue 46): the
input is dumped as the ops before the write saw it, and the gradients autograd sums for the aliasing
outputs outside the graph reach the backward graph as an input no op made on its side, whose reader
is paired by its other inputs (``by_known_inputs``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from tests.backends import graph_and_eager_dumps


class _Doubling(nn.Module):
    """Writes the step's input in place and returns a view of it beside its projection."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.mul_(2)
        return self.fc(x), x.view(-1)


class _Aliasing(nn.Module):
    """A block (compiled alone) that writes its input, an activation, and returns two views of it."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.fc = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h.add_(1)
        if self.scale != 1.0:
            h.mul_(self.scale)  # the planted bug: an op only the buggy side runs
        return self.fc(h), h.view(-1), h[0]


class _WithBlock(nn.Module):
    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.inner = _Aliasing(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, flat, first = self.inner(self.pre(x) + 0.5)
        return y.sin().pow(2).mean() + flat.cos().mean() + first.exp().mean()


def _step(model: Callable[[torch.Tensor], object]) -> None:
    out = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)))
    loss = out if isinstance(out, torch.Tensor) else out[0].sin().mean() + out[1].tanh().mean()
    loss.backward()


def _compile_inner(model: nn.Module, backend: object) -> nn.Module:
    """The model with its ``inner`` block compiled alone."""
    model.inner.compile(backend=backend)
    return model


def _dumps(
    tmp_path: Path, build: Callable[[], nn.Module], compiled_build: Callable[[], nn.Module], block: bool
) -> tuple[Path, Path]:
    """A graph dump (aot_eager) of ``compiled_build()``'s step, the whole model compiled or
    (``block``) its ``inner`` block alone, and an eager dump of ``build()``'s."""
    return graph_and_eager_dumps(tmp_path, compiled_build, build, _step, compile=_compile_inner if block else None)


def test_a_graph_writing_the_steps_input_compares_clean_with_eager(tmp_path: Path) -> None:
    """The graph's input was dumped after the ``copy_`` that ends the graph had written it: the
    step's input doubled against eager's, a false first divergence at the ``randn`` that made it."""
    result = torchdebug.compare(*_dumps(tmp_path, _Doubling, _Doubling, block=False))
    assert result.counts()["error"] == 0 and result.counts()["warning"] == 0
    assert result.first_divergence is None


@pytest.mark.parametrize("scale", [1.0, 1.05])
def test_the_gradients_of_outputs_aliasing_a_blocks_input_are_summed_outside_its_graph(tmp_path: Path, scale: float) -> None:
    """Autograd sums the gradients of the two views with the ``add_`` the eager dump records; the
    compiled backward reads the sum as an input and adds the linear's gradient to it. That ``add``
    is eager's ``inner.fc`` ``add_`` (two false errors and three false warnings when it was paired
    with the ``inner`` one, which sums the views'). A planted in-place scale is named."""
    compiled, eager = _dumps(tmp_path, _WithBlock, lambda: _WithBlock(scale), block=True)
    result = torchdebug.compare(compiled, eager)
    summed = {row.name_b for row in result.rows if row.name.startswith("backward/inner/aten.add.Tensor#0/")}
    assert summed == {f"backward/inner.fc/aten.add_.Tensor#0/{slot}" for slot in ("input.0", "input.1", "output.0")}
    if scale == 1.0:
        assert result.counts()["error"] == 0 and result.counts()["warning"] == 0
    else:
        first = result.first_divergence
        assert first is not None and first.name == "forward/inner/aten.mul.Tensor#0/output.0"
        assert result.counts()["error"] == 1
