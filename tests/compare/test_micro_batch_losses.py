"""A micro-batch's loss against the whole batch's, recorded at module level: its gradient is another
quantity, not an error.

4 micro-batches of 4 (each loss divided by 4 before ``backward``) against one batch of 16, a 2-layer
MLP whose loss is a module. Module records hold no op that divides the loss, so the gradient the
loss module's backward starts from (0.25 against 1) used to be an error "before any op did".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.fc2(torch.relu(self.fc1(x))), y)


def _train(path: Path, micro: int, level: str) -> Path:
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)
    batches = list(zip(x.chunk(micro), y.chunk(micro)))  # the loader's micro-batches
    with torchdebug.dump(path, model=model, task="statistics", level=level) as debugger:
        for xb, yb in batches:
            (model(xb, yb) / micro).backward()
        optimizer.step()
    return debugger.run_dir


@pytest.mark.parametrize("level", ["module", "mix"])
def test_the_gradient_of_a_micro_batch_loss_is_incomparable_not_an_error(tmp_path, level):
    result = torchdebug.compare(_train(tmp_path / "accum", 4, level), _train(tmp_path / "batch", 1, level))
    assert result.counts()["error"] == 0 and result.first_divergence is None
    seed = next(row for row in result.rows if row.name == "backward/loss/module#0/input.0")
    assert seed.verdict == "incomparable" and seed.shape_a == seed.shape_b == []
    assert "a gradient with respect to a value that cannot be compared (forward/loss/module#0/output.0)" in seed.message
    parameters = [row for row in result.rows if row.io == "parameter" and row.matched]
    assert parameters and all(row.verdict == "pass" for row in parameters)  # what the step starts from
    if level == "mix":  # the optimizer step, eager ops: the summed gradients and the updated parameters
        optimizer = [row for row in result.rows if row.phase == "optimizer" and row.matched and row.kind == "tensor"]
        assert optimizer and all(row.verdict == "pass" for row in optimizer)


def test_a_graph_dump_that_counts_steps_otherwise_is_said_to_hold_other_steps(tmp_path: Path) -> None:
    """The graph dump continues a step while gradients accumulate (a backward ran, no optimizer step
    followed, gradients held). An update by hand that clears the gradients in place leaves them held,
    so its two steps of two micro-batches are one step of the graph dump against the eager dump's two:
    the summary says how many steps each side holds and that they pair by number (the values were
    blamed with no word why)."""
    from tests.backends import graph_and_eager_dumps

    def step(model: nn.Module) -> None:
        generator = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 8, generator=generator), torch.randint(0, 4, (8,), generator=generator)
        for xb, yb in zip(x.chunk(2), y.chunk(2)):
            (model(xb, yb) / 2).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= 0.1 * parameter.grad
                parameter.grad.zero_()

    result = torchdebug.compare(*graph_and_eager_dumps(tmp_path, _Net, _Net, step, steps=2))
    said = [note for note in result.problems if "training steps" in note]
    assert said == [
        "A holds 1 training step (0–0), B holds 2 training steps (0–1): steps are paired by number, so a step may be"
        " paired with other work and the extra steps with nothing (a graph dump begins a step when the step's first"
        " graph runs again, unless gradients are accumulating: a backward ran, no torch.optim step followed and the"
        " parameters hold gradients, as they do when cleared in place rather than set to None)"
    ]
    assert not [note for note in torchdebug.compare(tmp_path / "eager", tmp_path / "eager").problems if "training steps" in note]
