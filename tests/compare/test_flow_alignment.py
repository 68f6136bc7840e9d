"""Alignment by data flow (dumps with value ids): pairs a walk by call index gets wrong."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import torchdebug
from torchdebug.compare._flow_alignment import aligned_op
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import execution_order
from torchdebug.records import MODULE_OP, Record


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


def test_a_value_one_side_passes_on_unchanged_is_paired_through_the_op_both_run(tmp_path):
    def program(divisor: float, extra: bool) -> None:
        x = torch.linspace(-1, 1, 4)
        g = x.exp() / divisor  # B divides by one: its div passes the exp's value on, A's makes a new one
        if extra:
            x.neg()  # A's neg#0: the consumer below is A's neg#1 and B's neg#0
        g.neg()

    a = _records(tmp_path / "a", lambda: program(4.0, True))
    b = _records(tmp_path / "b", lambda: program(1.0, False))
    assert _partners(a, b)["forward/-/aten.neg.default#1"] == ("forward/-/aten.neg.default#0", "aligned")


def _linear_of_batch(path: Path, batch: int) -> list[Record]:
    """One linear (a module call) then a relu, on a batch of ``batch`` rows."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 3)), torch.randn(batch, 4)
    with torchdebug.dump(path, model=model, task="statistics", level="mix"):  # ops and module calls
        model(x).relu()
    records = torchdebug.load(path).ranks[0].records()
    return [records[i] for i in execution_order(records)]


def test_a_module_call_of_another_batch_is_paired_with_its_namesake(tmp_path):
    pairs = match_records(_linear_of_batch(tmp_path / "a", 2), _linear_of_batch(tmp_path / "b", 6))
    module = [pair for pair in pairs if pair.a is not None and pair.a.op == MODULE_OP]
    assert module and all(pair.b is not None and pair.b.name == pair.a.name for pair in module)


def test_an_op_of_another_batch_reading_the_step_input_and_parameters_is_paired_with_its_namesake(tmp_path):
    found = _partners(_linear_of_batch(tmp_path / "a", 2), _linear_of_batch(tmp_path / "b", 6))
    assert found["forward/0/aten.addmm.default#0"] == ("forward/0/aten.addmm.default#0", "exact")
    assert found["forward/-/aten.relu.default#0"] == ("forward/-/aten.relu.default#0", "exact")


class _Projections(nn.Module):
    def __init__(self, reordered: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (nn.Linear(4, 4) for _ in range(3))
        self.reordered = reordered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        order = (self.v, self.k, self.q) if self.reordered else (self.q, self.k, self.v)
        outputs = {id(linear): linear(x) for linear in order}
        return outputs[id(self.q)] * outputs[id(self.k)] + outputs[id(self.v)]


def test_gradients_summed_in_another_order_are_one_sided_not_paired_by_name(tmp_path):
    for side, reordered in (("a", True), ("b", False)):
        model, x = _Projections(reordered), torch.randn(2, 4, requires_grad=True)
        torch.manual_seed(1)
        x = torch.randn(2, 4, requires_grad=True)
        with torchdebug.dump(tmp_path / side, model=model, task="statistics"):
            model(x).sum().backward()
    records = [torchdebug.load(tmp_path / side).ranks[0].records() for side in "ab"]
    sums = [pair for pair in match_records(*records) if pair.a is not None and aligned_op(pair.a.op) == "aten.add.Tensor"]
    k_sum = [pair for pair in sums if pair.a.phase == "backward" and pair.a.module == "k"]
    # A's k sums q's and k's gradients of x, B's k sums v's and k's: no call of B adds what A's does
    assert k_sum and all(pair.how == "only_a" for pair in k_sum)


class _NormBlock(nn.Module):
    """A residual around a layer norm, the norm written out or ``F.layer_norm``."""

    def __init__(self, by_hand: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.proj, self.by_hand = nn.Linear(8, 8), nn.Linear(8, 8), by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        if self.by_hand:
            mean = h.mean(-1, keepdim=True)
            normed = (h - mean) * torch.rsqrt((h - mean).pow(2).mean(-1, keepdim=True) + 1e-5)
        else:
            normed = F.layer_norm(h, (8,), eps=1e-5)
        return 8 * h + self.proj(normed)  # the residual's gradient outweighs the norm's parts


def test_a_hand_written_layer_norm_s_whole_gradient_is_paired_with_the_kernel_s_not_its_first_part(tmp_path):
    # autograd adds the hand-written norm's partial gradients of h to the residual's one by one;
    # F.layer_norm's backward makes the whole one, summed with the residual's by add#0
    for side, by_hand in (("a", True), ("b", False)):
        model, x = _NormBlock(by_hand), torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        with torchdebug.dump(tmp_path / side, model=model, task="statistics"):
            model(x).square().mean().backward()
    records = [torchdebug.load(tmp_path / side).ranks[0].records() for side in "ab"]
    sums_b = [r for r in records[1] if r.phase == "backward" and r.module == "<root>" and aligned_op(r.op) == "aten.add.Tensor"]
    first_sum = next(r.name for r in sums_b if r.io == "output")  # add#0, or add_#0 (summed in place: no dispatch mode)
    kernel_sum = next(pair for pair in match_records(*records) if pair.b is not None and pair.b.name == first_sum)
    assert kernel_sum.a is not None and kernel_sum.a.name != first_sum
    result = torchdebug.compare(tmp_path / "a", tmp_path / "b")
    assert result.first_divergence is None and result.counts()["error"] == 0


def test_a_view_that_only_passes_a_value_on_is_one_sided_and_its_reader_pairs_with_the_reshaping_view(tmp_path):
    def program(wrapped: bool) -> None:
        h = torch.linspace(-1, 1, 4).exp()
        if wrapped:  # DTensor.from_local's view of a local tensor: the shape kept, named like the view after it
            h = h.view(4)
        h.view(2, 2).neg()

    found = _partners(_records(tmp_path / "a", lambda: program(True)), _records(tmp_path / "b", lambda: program(False)))
    assert found["forward/-/aten.view.default#0"] == (None, "only_a")
    assert found["forward/-/aten.view.default#1"] == ("forward/-/aten.view.default#0", "aligned")
    assert found["forward/-/aten.neg.default#0"] == ("forward/-/aten.neg.default#0", "exact")
