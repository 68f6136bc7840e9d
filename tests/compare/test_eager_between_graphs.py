"""Eager code between two compiled graphs (issue 46): the graph dump does not see it, so the second
graph's input is a value no op made on its side. Compare pairs that input's eager maker by value,
says that a difference first seen there was made where only the eager dump looks, and names an op
only the compiled side runs by what it changed, as one-sided, not as a node of the eager op it was
filed inside."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from tests.backends import graph_and_eager_dumps


@torch._dynamo.disable
def _between(h: torch.Tensor, scale: float) -> torch.Tensor:
    """Eager ops between the graphs (the planted bug ``between`` scales here)."""
    return torch.tanh((h * 2 + 1) * scale)


class _Model(nn.Module):
    def __init__(self, bug: str | None) -> None:
        super().__init__()
        self.bug = bug
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _between(torch.relu(self.fc1(x)), 1.05 if self.bug == "between" else 1.0)
        y = self.fc2(h)
        if self.bug == "graph":
            y = y * 1.05  # the second graph's last op: only eager code reads it
        return torch.sin(y).pow(2).mean()


def _step(model: nn.Module) -> None:
    model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).backward()


def _compare(tmp_path: Path, bug: str | None) -> torchdebug.CompareResult:
    """A graph dump (aot_eager) of ``_Model(bug)``'s step against an eager dump of the healthy one's."""
    return torchdebug.compare(*graph_and_eager_dumps(tmp_path, lambda: _Model(bug), lambda: _Model(None), _step))


def test_a_healthy_pair_with_eager_code_between_the_graphs_is_clean(tmp_path: Path) -> None:
    result = _compare(tmp_path, None)
    assert result.counts()["error"] == 0 and result.counts()["warning"] == 0
    second = next(row for row in result.rows if row.name_b == "forward/<root>/aten.tanh.default#0/output.0")
    assert second.match == "value" and second.verdict == "pass"  # graph 2's input, paired with its eager maker


@pytest.mark.parametrize("bug", ["between", "graph"])
def test_a_bug_near_the_graphs_edge_is_named_with_what_is_known_of_it(tmp_path: Path, bug: str) -> None:
    first = _compare(tmp_path, bug).first_divergence
    assert first is not None and first.verdict == "error"
    if bug == "between":  # made where only the eager dump looks: first seen at graph 2's input
        assert first.name_b == "forward/<root>/aten.tanh.default#0/output.0"
        assert "its inputs were not compared (none has a partner in the other dump)" in first.message
        assert "differ by only" not in first.message
    else:  # the op only the compiled graph runs: filed inside an eager op (the loss's), judged as one-sided
        assert first.name == "forward/<root>/aten.mul.Tensor#0/output.0"
        assert (first.match, first.name_b) == ("only_a", None)
        assert "only A runs this op (a structure difference)" in first.message and "inside" not in first.message
