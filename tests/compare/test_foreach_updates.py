"""A foreach optimizer's update returns nothing; its records' outputs are what it wrote
(``docs/format.md``), so compare names the update where it diverges, and pairs a foreach step with
a for-loop one without a false error."""

from __future__ import annotations

from pathlib import Path

import torch

import torchdebug
from torchdebug.compare import compare


def _sgd_step(folder: Path, *, foreach: bool, lr: float) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, foreach=foreach)
    batch = torch.randn(3, 4)
    with torchdebug.Debugger(folder, task="statistics") as debugger:
        debugger.start(model)
        model(batch).sum().backward()
        optimizer.step()
        debugger.step()


def test_a_diverging_foreach_update_is_the_first_divergence(tmp_path):
    _sgd_step(tmp_path / "a", foreach=True, lr=0.5)
    _sgd_step(tmp_path / "b", foreach=True, lr=0.6)
    first = compare(tmp_path / "a", tmp_path / "b").first_divergence
    assert first is not None
    assert (first.op, first.io, first.attribution) == ("aten._foreach_add_.List", "output", "blamed")


def test_a_foreach_step_and_a_for_loop_step_compare_clean(tmp_path):
    _sgd_step(tmp_path / "a", foreach=True, lr=0.5)
    _sgd_step(tmp_path / "b", foreach=False, lr=0.5)
    result = compare(tmp_path / "a", tmp_path / "b")
    assert result.first_divergence is None
    assert not [row.name for row in result.rows if row.verdict in ("error", "warning")]
