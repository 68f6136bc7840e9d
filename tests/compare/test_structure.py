"""Structure differences: ops only one side runs, listed as blocks and named when they change a value.

A tiny attention block (projections, attention, output projection, residual) trained for one step
on each side. Side A either runs a forward hook side B lacks (the op it adds is one-sided) or
computes attention with ``F.scaled_dot_product_attention`` where B writes it out by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdebug

_DIM, _HEADS, _SEQ, _BATCH = 8, 2, 4, 3


class _Attention(nn.Module):
    def __init__(self, by_hand: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.out = (nn.Linear(_DIM, _DIM) for _ in range(4))
        self.by_hand = by_hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).view(_BATCH, _SEQ, _HEADS, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.by_hand:
            y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(_DIM // _HEADS), dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return x + self.out(y.transpose(1, 2).reshape(_BATCH, _SEQ, _DIM))


def _scaled(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output * 1.03  # the planted hook


def _copied(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.clone()  # a hook that leaves the value equal


def _dump(path: Path, by_hand: bool = False, hook=None) -> Path:  # noqa: ANN001
    model = _Attention(by_hand)
    if hook is not None:
        model.out.register_forward_hook(hook)
    x = torch.randn(_BATCH, _SEQ, _DIM, generator=torch.Generator().manual_seed(1))
    with torchdebug.dump(path, model=model) as debugger:
        model(x).square().mean().backward()
    return debugger.run_dir


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("structure")
    return {
        "plain": _dump(root / "plain"),
        "scaled": _dump(root / "scaled", hook=_scaled),
        "copied": _dump(root / "copied", hook=_copied),
        "by_hand": _dump(root / "by_hand", by_hand=True),
    }


def test_a_hook_only_one_side_runs_that_scales_an_output_is_the_first_divergence(dumps, tmp_path):
    result = torchdebug.compare(dumps["scaled"], dumps["plain"])
    first = result.first_divergence
    assert first is not None and first.op == "aten.mul.Tensor" and first.match == "only_a"
    assert first.source is not None and "test_structure.py" in first.source and "_scaled" in first.source
    assert "only A runs this op (a structure difference) and the value entering it agrees" in first.message
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]
    reader = next(row for row in result.rows if row.matched and first.name in row.message and row.io == "input")
    assert reader.attribution == "inherited" and "which changed the value" in reader.message
    [block] = [block for block in result.structure_differences if block.verdict == "error"]
    assert block.cause == first.name and [(op.side, op.op) for op in block.ops] == [("A", "aten.mul.Tensor")]
    assert block.leaving == [reader.name] and block.entering
    assert "1 change a value" in result.summary() and block.describe() in result.summary()
    exported = json.loads(result.to_json(tmp_path / "compare.json").read_text())["structure_differences"]
    assert [entry["cause"] for entry in exported if entry["verdict"] == "error"] == [first.name]
    page = result.to_html(tmp_path / "compare.html").read_text()
    listed = page.split('id="structure-table"', 1)[1].split("</table>", 1)[0]
    assert '<td class="verdict-error">error</td>' in listed and f"<code>{first.name}</code>" in listed
    assert "<code>aten.mul.Tensor</code> in <code>out</code>" in listed and f"<code>{first.source}</code>" in listed


def test_a_hook_only_one_side_runs_that_leaves_the_value_equal_is_listed_and_passes(dumps):
    result = torchdebug.compare(dumps["copied"], dumps["plain"])
    assert result.first_divergence is None and result.counts()["error"] == 0
    [block] = [block for block in result.structure_differences if block.leaving]
    assert block.verdict == "pass" and [op.op for op in block.ops] == ["aten.clone.default"]
    clone = [row for row in result.rows if row.op == "aten.clone.default"]
    assert clone and all(row.verdict == "unmatched" and row.block is block for row in clone)


def test_sdpa_against_a_hand_written_attention_has_no_error_and_its_blocks_pass(dumps):
    result = torchdebug.compare(dumps["plain"], dumps["by_hand"])
    assert result.first_divergence is None
    assert result.counts()["error"] == 0, [row.name for row in result.rows if row.verdict == "error"]
    judged = [block for block in result.structure_differences if block.verdict != "unjudged"]
    # the key bias's gradient is zero but for round-off (softmax ignores a shift): summed in another
    # order, statistics cannot tell its difference from a made one
    assert [block.verdict for block in judged].count("pass") >= len(judged) - 1
    assert all(block.verdict in ("pass", "undecided") for block in judged)
    sdpa = [block for block in judged if any("scaled_dot_product" in op.op for op in block.ops)]
    assert [block.phase for block in sdpa] == ["forward", "backward"] and all(block.verdict == "pass" for block in sdpa)
    assert sdpa[0].sides == "A+B" and "aten._softmax.default" in [op.op for op in sdpa[0].ops if op.side == "B"]


class _TwoScales(nn.Module):
    """``tanh(fc1(x)) * 0.1`` into ``fc2``; ``planted`` multiplies by 1.05 first, a call of the same op."""

    def __init__(self, planted: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.planted = nn.Linear(8, 16), nn.Linear(16, 4), planted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if self.planted:
            h = h * 1.05
        return self.fc2(h * 0.1).pow(2).mean()


@pytest.mark.parametrize("planted_side", ["a", "b"])
def test_a_call_inserted_before_a_call_of_the_same_op_is_the_one_sided_op(tmp_path: Path, planted_side: str) -> None:
    """Calls of one op on the same value used to pair whatever their scalar arguments: eager's
    ``mul(h, 0.1)`` with the planted ``mul(h, 1.05)``, blamed as 'difference 9.5' with the argument
    flagged. The call that reads the planted one's output and holds the other side's arguments is
    the partner; the planted call is one-sided and the first divergence."""
    paths = {}
    for side in ("a", "b"):
        model = _TwoScales(planted=side == planted_side)
        with torchdebug.dump(tmp_path / side, model=model) as debugger:
            model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).backward()
        paths[side] = debugger.run_dir
    result = torchdebug.compare(paths["a"], paths["b"])
    first = result.first_divergence
    assert first is not None and first.match == f"only_{planted_side}" and first.op == "aten.mul.Tensor"
    assert first.name == "forward/<root>/aten.mul.Tensor#0/output.0" and "runs this op (a structure difference)" in first.message
    assert [row.name for row in result.rows if row.verdict == "error"] == [first.name]
    muls = [row for row in result.rows if row.matched and row.phase == "forward" and row.op == "aten.mul.Tensor"]
    factors = [row.record_a.value for row in muls if row.kind == "value"]
    assert factors == [0.1], "the scale both sides run is paired"
