"""A graph dump counts training steps as eager capture does, gradient accumulation included.

A step begins when the step's first graph runs again, unless gradients are accumulating: a
backward ran, no optimizer step followed and the parameters hold gradients. Each case below pairs
the graph dump with the eager dump of the same loop, one ``Debugger.step()`` per training step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from tests.backends import ResidualBlock
from tests.graph_dump import training

MICRO_BATCHES, STEPS = 3, 2


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ResidualBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def _model() -> Model:
    torch.manual_seed(0)
    return Model()


def _batch(step: int, micro: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + micro))


def _accumulating(optimizers: dict[int, torch.optim.Optimizer]) -> training.Train:
    """Three micro-batches' gradients, then an AdamW step and ``zero_grad()``."""

    def train(model: nn.Module, run: nn.Module, step: int) -> None:
        optimizer = optimizers.setdefault(id(model), torch.optim.AdamW(model.parameters(), lr=1e-2))
        for micro in range(MICRO_BATCHES):
            (run(_batch(step, micro)) / MICRO_BATCHES).backward()
        optimizer.step()
        optimizer.zero_grad()

    return train


def _by_hand(clear: Callable[[nn.Module], None]) -> training.Train:
    """One batch, an update written by hand (no ``torch.optim``), then ``clear``."""

    def train(model: nn.Module, run: nn.Module, step: int) -> None:
        run(_batch(step, 0)).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
        clear(model)

    return train


def _skipped(model: nn.Module, run: nn.Module, step: int) -> None:
    """A step whose optimizer step was skipped (a gradient scaler's on an overflow): ``zero_grad()`` alone."""
    run(_batch(step, 0)).backward()
    model.zero_grad()


def _inference(model: nn.Module, run: nn.Module, step: int) -> None:
    with torch.no_grad():
        run(_batch(step, 0))


@pytest.mark.parametrize("spelling", ["whole", "method"])
def test_micro_batches_of_gradient_accumulation_are_one_step(tmp_path: Path, spelling: str) -> None:
    records = training.compiled_dump(tmp_path / "graph", _model(), _accumulating({}), STEPS, spelling=spelling)
    assert {record.step for record in records} == set(range(STEPS)), "a step per optimizer step, not per micro-batch"
    last = f"forward/layers.1.inner.fc2/aten.addmm.default#{MICRO_BATCHES - 1}/output.0"
    assert last in {record.name for record in records if record.step == 1}, "micro-batches count on within the step"

    eager = training.eager_dump(tmp_path / "eager", _model(), _accumulating({}), STEPS)
    result = torchdebug.compare(tmp_path / "graph", eager)
    assert not [row.name for row in result.rows if row.verdict == "error"], result.summary()
    assert not [note for note in result.problems if "training steps" in note], result.problems
    assert result.coverage()["a"]["matched"] >= 0.9 * result.coverage()["a"]["rows"], result.summary()


@pytest.mark.parametrize(
    "train",
    [
        pytest.param(_by_hand(lambda model: model.zero_grad()), id="update-by-hand"),
        pytest.param(_skipped, id="optimizer-step-skipped"),
        pytest.param(_inference, id="inference"),
    ],
)
def test_a_step_without_accumulation_is_a_step(tmp_path: Path, train: training.Train) -> None:
    """No gradient held when the first graph runs again: a step, with or without ``torch.optim``."""
    records = training.compiled_dump(tmp_path / "graph", _model(), train, 3)
    assert {record.step for record in records} == {0, 1, 2}
    assert all("#1/" not in record.name for record in records if record.phase == "forward"), "each step's calls start at #0"


def test_a_loop_that_keeps_its_gradients_without_an_optimizer_is_one_step_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Gradients cleared in place, no ``torch.optim``: each run reads as the next micro-batch, and
    the dump says so when it closes; with an optimizer, accumulation is said nothing of."""
    zeroed = _by_hand(lambda model: [parameter.grad.zero_() for parameter in model.parameters()])
    with caplog.at_level("WARNING", logger="torchdebug.graph_dump._step_clock"):
        records = training.compiled_dump(tmp_path / "zeroed", _model(), zeroed, 3)
    assert {record.step for record in records} == {0}
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1 and "counted 2 runs of the step's first graph as micro-batches" in warned[0], warned

    caplog.clear()
    with caplog.at_level("WARNING", logger="torchdebug.graph_dump._step_clock"):
        training.compiled_dump(tmp_path / "accumulated", _model(), _accumulating({}), STEPS)
    assert not caplog.records
