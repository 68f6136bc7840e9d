"""Alignment by data flow (dumps with value ids): pairs a walk by call index gets wrong."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchdebug
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import execution_order
from torchdebug.records import Record


def _records(path: Path, program) -> list[Record]:
    with torchdebug.dump(path, task="statistics"):
        program()
    records = torchdebug.load(path).ranks[0].records()
    return [records[i] for i in execution_order(records)]


def _partners(a: list[Record], b: list[Record]) -> dict[str, tuple[str | None, str]]:
    """Each call of A: the call of B its output slot was paired with (``None``: one-sided), and how."""
    return {
        pair.a.call_name: (pair.b.call_name if pair.b is not None else None, pair.how)
        for pair in match_records(a, b)
        if pair.a is not None and pair.a.io == "output"
    }


def test_an_op_of_the_same_kind_inserted_on_one_side_does_not_shift_the_pairs(tmp_path):
    def program(inserted: bool) -> None:
        x = torch.linspace(-1, 1, 4)
        h = x.exp()
        if inserted:
            x.mul(3.0)  # a refactor's extra mul, before the one both run: A's mul#1 is B's mul#0
        h.mul(2.0).neg()

    a = _records(tmp_path / "a", lambda: program(True))
    b = _records(tmp_path / "b", lambda: program(False))
    found = _partners(a, b)
    assert found["forward/-/aten.mul.Tensor#1"] == ("forward/-/aten.mul.Tensor#0", "aligned")
    assert found["forward/-/aten.mul.Tensor#0"] == (None, "only_a")
    assert found["forward/-/aten.neg.default#0"] == ("forward/-/aten.neg.default#0", "exact")


def _two_zero_biases(swapped: bool) -> None:
    x, y = torch.linspace(-1, 1, 4), torch.ones(4)
    first, second = torch.zeros(4), torch.zeros(4)  # the same dtype, shape and statistics
    if swapped:  # independent ops in another order: A's add#0 is B's add#1
        y.add(second).sin()
        x.add(first).cos()
    else:
        x.add(first).cos()
        y.add(second).sin()


def test_independent_ops_reordered_reading_two_zero_tensors_are_paired_by_what_they_read(tmp_path):
    a = _records(tmp_path / "a", lambda: _two_zero_biases(True))
    b = _records(tmp_path / "b", lambda: _two_zero_biases(False))
    found = _partners(a, b)
    assert found["forward/-/aten.add.Tensor#0"] == ("forward/-/aten.add.Tensor#1", "aligned")
    assert found["forward/-/aten.add.Tensor#1"] == ("forward/-/aten.add.Tensor#0", "aligned")
    assert found["forward/-/aten.sin.default#0"] == ("forward/-/aten.sin.default#0", "exact")


def test_a_value_passed_on_by_an_op_one_side_runs_is_read_through_it(tmp_path):
    def program(detached: bool) -> None:
        x = torch.linspace(-1, 1, 4)
        h = x.exp()
        x.neg().neg()  # another neg#1 on each side: by index, A's inserted detach would not move it
        (h.detach() if detached else h).neg()

    a = _records(tmp_path / "a", lambda: program(True))
    b = _records(tmp_path / "b", lambda: program(False))
    found = _partners(a, b)
    assert found["forward/-/aten.neg.default#2"] == ("forward/-/aten.neg.default#2", "exact")
    assert found["forward/-/aten.detach.default#0"] == (None, "only_a")


class _Attention(nn.Module):
    def __init__(self, hand: bool) -> None:
        super().__init__()
        self.hand = hand
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(2, 3, 2, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.hand:
            attended = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1) @ v
        else:
            attended = F.scaled_dot_product_attention(q, k, v)
        return self.out(attended.transpose(1, 2).reshape(2, 3, 8))


def test_a_hand_written_attention_against_sdpa_pairs_the_projections_around_it(tmp_path):
    for side, hand in (("a", True), ("b", False)):
        torch.manual_seed(0)
        model, x = _Attention(hand), torch.randn(2, 3, 8)
        with torchdebug.dump(tmp_path / side, task="statistics"):
            model(x).square().mean().backward()
    result = torchdebug.compare(tmp_path / "a", tmp_path / "b")
    assert result.first_divergence is None
    rows = {row.name: row for row in result.rows}
    assert rows["forward/out/aten.addmm.default#0/output.0"].match == "exact"
    assert rows["forward/<root>/aten._softmax.default#0/output.0"].match == "only_a"
    assert any(row.match == "only_b" and "scaled_dot_product" in row.op for row in result.rows)
    # the values of the two attentions meet where the heads are transposed back: paired by flow
    assert rows["forward/<root>/aten.transpose.int#4/output.0"].name_b == "forward/<root>/aten.transpose.int#3/output.0"


_CHAIN = (torch.exp, torch.neg, torch.sin, torch.cos, torch.tanh, torch.abs, torch.sigmoid)


def _branches(swapped: bool) -> None:
    x, y = torch.linspace(-1, 1, 4), torch.linspace(0, 2, 4)
    for start in (y, x) if swapped else (x, y):  # two independent chains, run one after the other
        for op in _CHAIN:
            start = op(start)


def test_two_independent_chains_run_in_another_order_are_paired_link_by_link(tmp_path):
    a = _records(tmp_path / "a", lambda: _branches(True))
    b = _records(tmp_path / "b", lambda: _branches(False))
    found = _partners(a, b)
    for op in ("exp", "neg", "sin", "cos", "tanh", "abs", "sigmoid"):  # each A#0 is B#1, however deep
        assert found[f"forward/-/aten.{op}.default#0"] == (f"forward/-/aten.{op}.default#1", "aligned"), op
        assert found[f"forward/-/aten.{op}.default#1"] == (f"forward/-/aten.{op}.default#0", "aligned"), op


def test_two_equal_parameters_updated_in_another_order_are_told_apart_by_their_first_readers(tmp_path):
    def program(path: Path, swapped: bool) -> list[Record]:
        first, second = torch.ones(4), torch.ones(4)  # parameters made before the dump: no op made them
        with torchdebug.dump(path, task="statistics"):
            torch.linspace(-1, 1, 4).mul(first).add(second)  # read in one order on both sides
            for parameter in (second, first) if swapped else (first, second):  # updated in another order
                parameter.mul_(0.9)
        records = torchdebug.load(path).ranks[0].records()
        return [records[i] for i in execution_order(records)]

    found = _partners(program(tmp_path / "a", True), program(tmp_path / "b", False))
    assert found["forward/-/aten.mul_.Tensor#0"] == ("forward/-/aten.mul_.Tensor#1", "aligned")
    assert found["forward/-/aten.mul_.Tensor#1"] == ("forward/-/aten.mul_.Tensor#0", "aligned")
