"""Compare's flow walk goes on across a graph break: the graph after it reads the values the graph
before it returned by their ids (graph_dump/_handover.py), so calls reordered after the break pair
by what they read (issue 46, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import execution_order
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.graph_dump._handover import Handover
from torchdebug.records import Record

_CHAIN = (torch.neg, torch.sin, torch.cos, torch.tanh, torch.abs, torch.sigmoid)


class _BrokenChains(nn.Module):
    """Two halves of a linear layer's output made before a graph break, then a chain of six ops on
    each after it, one chain after the other (``swapped``: the second half's first)."""

    def __init__(self, swapped: bool) -> None:
        super().__init__()
        self.swapped = swapped
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        halves = (h[:, :4].exp(), h[:, 4:].exp())
        torch._dynamo.graph_break()
        ends = {}
        for index in (1, 0) if self.swapped else (0, 1):
            value = halves[index]
            for op in _CHAIN:
                value = op(value)
            ends[index] = value
        return ends[0], ends[1]


def _compiled(path: Path, swapped: bool) -> list[Record]:
    """A graph dump (aot_eager's graphs, statistics of every node) of one forward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _BrokenChains(swapped)
    path.mkdir(parents=True)
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    backend = get_backend(config, model=model)
    torch.compile(model, backend=backend)(torch.linspace(-1, 1, 12).reshape(3, 4))
    backend.data_dump.close()
    torch._dynamo.reset()
    records = torchdebug.load(path).ranks[0].records()
    return [records[i] for i in execution_order(records)]


def _partners(a: list[Record], b: list[Record]) -> dict[str, str | None]:
    """Each forward call of A, as ``op#call``: the call of B its output slot was paired with, as
    ``op#call`` (``None``: one-sided)."""
    return {
        _op_call(pair.a): _op_call(pair.b) if pair.b is not None else None
        for pair in match_records(a, b, compiled=True)
        if pair.a is not None and pair.a.io == "output" and pair.a.phase == "forward"
    }


def _op_call(record: Record) -> str:
    """``aten.neg.default#0``: the call's op and index, without its module (the graph after a break
    is not traced from the module)."""
    return record.call_name.rsplit("/", 1)[-1]


def _reordered_pairs(tmp_path: Path) -> dict[str, bool]:
    """Per op of the chains: whether A's two calls (the chains run the other way round) were paired
    with B's calls on the same half."""
    found = _partners(_compiled(tmp_path / "a", swapped=True), _compiled(tmp_path / "b", swapped=False))
    right = {}
    for op in ("neg", "sin", "cos", "tanh", "abs", "sigmoid"):
        name = f"aten.{op}.default"
        right[op] = found.get(f"{name}#0") == f"{name}#1" and found.get(f"{name}#1") == f"{name}#0"
    return right


def test_calls_reordered_after_a_graph_break_pair_by_the_values_the_graph_before_handed_over(tmp_path: Path) -> None:
    right = _reordered_pairs(tmp_path)
    assert all(right.values()), right


def test_without_the_values_handed_over_the_reordered_calls_pair_wrongly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Handover, "received", lambda self, inputs, args: ({}, []))  # each graph input a value of its own
    assert not any(_reordered_pairs(tmp_path).values())
