"""Runs whose inputs differ in shape: gradient accumulation over 4 micro-batches against one batch 4×
the size. Activations, losses and micro-batch gradients cannot be compared; the optimizer step can.

Weights, inputs and targets are small multiples of powers of two and the model is linear with a
ReLU, so every sum is exact in float32: the accumulated gradients equal the one batch's on any CPU,
whatever order the kernels add in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug
from torchdebug.cli import main


class Net(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.fc1 = nn.Linear(4, hidden)
        self.fc2 = nn.Linear(hidden, 2)
        with torch.no_grad():
            for parameter in self.parameters():  # multiples of 1/4 in [-1, 1]
                parameter.copy_(torch.randint(-4, 5, parameter.shape, generator=generator) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(x.shape[0], x.shape[1], 1)  # a tensor sized by the batch, made from no input
        return self.fc2(torch.relu(self.fc1(x)) * keep)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(-2, 3, (8, 4, 4), generator=generator).float()
    return x, torch.randint(-2, 3, (8, 4, 2), generator=generator).float()


def _train(path: Path, micro: int, *, hidden: int = 8, split_inside: bool = True, divide: bool = True) -> Path:
    """One SGD step over the batch of 8, in ``micro`` micro-batches (gradient accumulation); the
    batch is split inside the dump (an op cuts the data) or before it (the micro-batches are leaves)."""
    model = Net(hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = _data()
    batches = None if split_inside else list(zip(x.chunk(micro), y.chunk(micro)))
    with torchdebug.dump(path, model=model, task="statistics") as debugger:
        for xb, yb in batches or zip(x.chunk(micro), y.chunk(micro)):
            loss = nn.functional.mse_loss(model(xb), yb)
            (loss / micro if divide else loss).backward()
        optimizer.step()
    return debugger.run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("accumulation")
    made: dict[tuple, Path] = {}

    def get(micro: int, **options: object) -> Path:
        key = (micro, *sorted(options.items()))
        if key not in made:
            made[key] = _train(root / f"run{len(made)}", micro, **options)  # type: ignore[arg-type]
        return made[key]

    return get


@pytest.mark.parametrize("split_inside", [True, False], ids=["data-cut-in-the-dump", "micro-batches-as-inputs"])
def test_shapes_that_differ_because_the_inputs_do_are_incomparable_not_errors(run, split_inside):
    result = torchdebug.compare(run(4, split_inside=split_inside), run(1, split_inside=split_inside))
    reshaped = [row for row in result.rows if row.matched and row.kind == "tensor" and row.shape_a != row.shape_b]
    assert reshaped and all(row.verdict == "incomparable" for row in reshaped)
    assert all(row.message.startswith("not comparable") and row.difference is None for row in reshaped)
    where = "made from the runs' data alone, cut to other shapes" if split_inside else "the runs' data inputs differ in shape"
    assert any(where in row.message for row in reshaped)  # where the difference starts
    keep = next(row for row in result.rows if row.op == "aten.ones.default" and row.io == "output")
    assert keep.verdict == "incomparable"  # no input, but sized as the data are
    assert result.counts()["error"] == 0 and result.first_divergence is None and not result.diverged
    assert not any("differ in shape" in problem for problem in result.problems)


def test_values_computed_from_incomparable_ones_are_incomparable(run):
    result = torchdebug.compare(run(4), run(1))
    loss = next(row for row in result.rows if row.op == "aten.mse_loss.default" and row.io == "output")
    weight_grad = next(
        row for row in result.rows if (row.phase, row.module, row.op, row.io) == ("backward", "fc1", "aten.mm.default", "output")
    )
    for row in (loss, weight_grad):
        assert row.shape_a == row.shape_b
        assert row.verdict == "incomparable" and "computed from values that cannot be compared" in row.message


def test_the_summary_says_which_phases_were_compared(run, tmp_path):
    result = torchdebug.compare(run(4), run(1))
    phases = result.phases()
    assert phases["forward"]["incomparable"] > 0 and phases["backward"]["incomparable"] > 0
    optimizer = phases["optimizer"]
    assert optimizer["incomparable"] == 0 and optimizer["verdicts"] == {"pass": optimizer["compared"]}
    lines = result.summary().splitlines()
    assert lines[1].startswith("what could be compared")
    assert lines[4] == f"  optimizer: compared, {optimizer['compared']} rows ({optimizer['compared']} pass)"
    assert any(line.startswith("  forward: ") and "not comparable" in line for line in lines)
    data = json.loads(result.to_json(tmp_path / "compare.json").read_text())
    assert data["phases"]["optimizer"]["verdicts"] == {"pass": optimizer["compared"]}
    assert data["counts"]["incomparable"] == result.counts()["incomparable"] > 0
    assert main(["compare", str(run(4)), str(run(1)), "-q", "-o", str(tmp_path / "out")]) == 0
    assert "incomparable" in (tmp_path / "out" / "compare.csv").read_text()


def test_an_accumulation_bug_is_still_found_in_the_optimizer_step(run):
    # the loss is not divided by the number of micro-batches: the accumulated gradients are 4x
    result = torchdebug.compare(run(4, divide=False), run(1))
    first = result.first_divergence
    assert (first.phase, first.io) == ("optimizer", "input")
    assert "that only one side runs from values that cannot be compared" in first.message


@pytest.mark.parametrize("hidden", [16, 2], ids=["another-ratio", "the-batch-ratio"])
def test_a_layer_of_another_width_is_an_error_even_when_the_inputs_differ_too(run, hidden):
    # the batch changes 2 -> 8; the layer 16 -> 8 (a ratio the data do not show) or 2 -> 8 (the same
    # ratio: but a parameter's shape never follows the data)
    result = torchdebug.compare(run(4, hidden=hidden), run(1))
    weight = next(row for row in result.rows if row.module == "fc1" and row.op == "aten.t.default" and row.io == "input")
    assert (weight.verdict, weight.attribution) == ("error", "blamed")
    assert weight.message == f"shape differs: [{hidden}, 4] vs [8, 4]" and weight.difference == float("inf")
    assert result.first_divergence.message.startswith("shape differs")


def test_shapes_that_differ_with_the_same_inputs_are_errors(run):
    result = torchdebug.compare(run(1, hidden=16), run(1))
    assert result.counts()["incomparable"] == 0
    errors = [row for row in result.rows if row.verdict == "error"]
    assert errors and all(row.difference is not None and row.message for row in errors)
    assert result.first_divergence.message.startswith("shape differs")
