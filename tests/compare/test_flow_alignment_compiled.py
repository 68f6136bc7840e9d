"""Alignment by data flow for compiled dumps: graph dumps carry value ids, so eager against compiled
and compiled against compiled pairs are walked by what each call reads (issue 46, item 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import torchdebug
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import execution_order
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.records import Record

_CHAIN = (torch.exp, torch.neg, torch.sin, torch.cos, torch.tanh, torch.abs, torch.sigmoid)


class _Halves(nn.Module):
    """The two halves of a linear layer's output, used in one order or the other (``swapped``)."""

    def __init__(self, swapped: bool) -> None:
        super().__init__()
        self.swapped = swapped
        self.fc = nn.Linear(4, 8)

    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return h[:, :4], h[:, 4:]


class _Chains(_Halves):
    """Two independent chains of seven ops on the halves, run one after the other (``swapped``: the
    second half's chain first)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = self.halves(x)
        ends = {}
        for index, start in ((1, second), (0, first)) if self.swapped else ((0, first), (1, second)):
            for op in _CHAIN:
                start = op(start)
            ends[index] = start
        return ends[0], ends[1]


class _Zeros(_Halves):
    """Each half plus a zero tensor made alike (the same dtype, shape and statistics), in another
    order (``swapped``): A's ``add#0`` is B's ``add#1``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = self.halves(x)
        zero_first, zero_second = x * 0.0, x * 0.0
        if self.swapped:
            sine = second.add(zero_second).sin()
            return first.add(zero_first).cos(), sine
        return first.add(zero_first).cos(), second.add(zero_second).sin()


def _ordered(records: list[Record]) -> list[Record]:
    return [records[i] for i in execution_order(records)]


def _compiled(path: Path, model: nn.Module, x: torch.Tensor) -> list[Record]:
    """A graph dump (aot_eager's graphs, statistics of every node) of one forward of ``model``."""
    torch._dynamo.reset()
    path.mkdir(parents=True)
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    backend = get_backend(config)
    torch.compile(model, backend=backend)(x)
    backend.data_dump.close()
    torch._dynamo.reset()
    return _ordered(torchdebug.load(path).ranks[0].records())


def _eager(path: Path, model: nn.Module, x: torch.Tensor) -> list[Record]:
    with torchdebug.dump(path, model=model, task="statistics"):
        model(x)
    return _ordered(torchdebug.load(path).ranks[0].records())


def _built(make: Callable[[bool], nn.Module], changed: bool) -> nn.Module:
    torch.manual_seed(0)
    return make(changed)


def _partners(a: list[Record], b: list[Record]) -> dict[str, tuple[str | None, str]]:
    """Each call of A: the call of B its output slot was paired with (``None``: one-sided), and how;
    a pair of calls first, else the slot's pair at a decomposed op's boundary (``value``, ``group``)."""
    outputs = [pair for pair in match_records(a, b, compiled=True) if pair.a is not None and pair.a.io == "output"]
    found: dict[str, tuple[str | None, str]] = {}
    for pair in sorted(outputs, key=lambda pair: pair.how in ("value", "group")):
        assert pair.a is not None
        found.setdefault(pair.a.call_name, (pair.b.call_name if pair.b is not None else None, pair.how))
    return found


def _graph_ids_dropped(records: list[Record]) -> list[Record]:
    """The records as graph dumps held them before they carried value ids: such pairs are matched
    by names and call indices (eager records keep theirs)."""
    for record in records:
        if record.capture == "graph":
            record.value_id = record.version = record.view_of = None
    return records


X = torch.linspace(-1, 1, 12).reshape(3, 4)


@pytest.mark.parametrize("side_a", ["compiled", "eager"])
def test_two_independent_chains_run_in_another_order_are_paired_link_by_link(tmp_path: Path, side_a: str) -> None:
    dump_a = _compiled if side_a == "compiled" else _eager
    a = dump_a(tmp_path / "a", _built(_Chains, True), X)
    b = _compiled(tmp_path / "b", _built(_Chains, False), X)
    found = _partners(a, b)
    for op in ("exp", "neg", "sin", "cos", "tanh", "abs", "sigmoid"):  # each A#0 is B#1, however deep
        assert found[f"forward/<root>/aten.{op}.default#0"] == (f"forward/<root>/aten.{op}.default#1", "aligned"), op
        assert found[f"forward/<root>/aten.{op}.default#1"] == (f"forward/<root>/aten.{op}.default#0", "aligned"), op
    by_names = _partners(_graph_ids_dropped(a), _graph_ids_dropped(b))
    assert by_names["forward/<root>/aten.sigmoid.default#0"] != ("forward/<root>/aten.sigmoid.default#1", "aligned")


def test_independent_ops_reordered_reading_two_zero_tensors_are_paired_by_what_they_read(tmp_path: Path) -> None:
    a = _eager(tmp_path / "a", _built(_Zeros, True), X)
    b = _compiled(tmp_path / "b", _built(_Zeros, False), X)
    found = _partners(a, b)
    assert found["forward/<root>/aten.add.Tensor#0"] == ("forward/<root>/aten.add.Tensor#1", "aligned")
    assert found["forward/<root>/aten.add.Tensor#1"] == ("forward/<root>/aten.add.Tensor#0", "aligned")
    assert found["forward/<root>/aten.sin.default#0"] == ("forward/<root>/aten.sin.default#0", "exact")
    by_names = _partners(_graph_ids_dropped(a), _graph_ids_dropped(b))
    assert by_names["forward/<root>/aten.add.Tensor#0"] != ("forward/<root>/aten.add.Tensor#1", "aligned")
