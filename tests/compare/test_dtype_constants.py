"""A constant made for the dtype (``torch.finfo(dtype).min`` as an attention bias) is not an error.

The model is built so that every value but that constant is exact in bf16, fp16 and fp32 (small
integers and halves), so what differs between the autocast run and the fp32 run is the constant and
what is computed from it — on any CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchdebug

DTYPES = {"bf16": (torch.bfloat16, "torch.finfo(torch.bfloat16).min"), "fp16": (torch.float16, "torch.finfo(torch.float16).min")}


class MaskedScores(nn.Module):
    """Scores of a sequence with itself plus a causal bias of ``torch.finfo(dtype).min``, where
    ``dtype`` is the scores' (bf16 under autocast), as T5 and many Hugging Face models build it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.tensor([[1.0, 0, -1, 0], [0, 0.5, 0, 1], [1, 1, 0, 0], [0, -0.5, 1, 0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        scores = (h @ h.transpose(-1, -2)).float()
        bias = torch.full(scores.shape[-2:], torch.finfo(h.dtype).min).triu(1)  # the dtype's constant
        return (scores + bias).clamp(min=-100.0)  # the masked positions are -100 on both sides


def _dump(path: Path, dtype: torch.dtype | None) -> Path:
    model = MaskedScores()
    x = torch.tensor([[1.0, 0, 1, -1], [0, 1, 1, 0], [-1, 1, 0, 1]])
    with torchdebug.dump(path, model=model, task="statistics") as debugger:
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = model(x)
        out.sum().backward()
    return debugger.run_dir


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("constants")
    reference = _dump(root / "fp32", None)
    return {name: torchdebug.compare(_dump(root / name, dtype), reference) for name, (dtype, _) in DTYPES.items()}


def _constant_row(result: torchdebug.compare.CompareResult) -> torchdebug.compare.Row:
    return next(row for row in result.rows if row.op == "aten.full.default" and row.io == "output")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_constant_made_for_the_dtype_passes_and_says_why(compared, dtype):
    row = _constant_row(compared[dtype])
    assert row.difference > row.tolerance  # it does differ: bf16's and fp16's min are not float32's
    assert (row.verdict, row.attribution) == ("pass", "dtype")
    assert f"{DTYPES[dtype][1]} vs torch.finfo(torch.float32).min" in row.message
    assert "differs because the runs' dtypes differ" in row.message
    fill = next(r for r in compared[dtype].rows if r.op == "aten.full.default" and r.arg == "1")
    assert (fill.verdict, fill.attribution) == ("pass", "dtype")  # the fill value argument too


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_what_is_computed_from_the_constant_is_not_blamed(compared, dtype):
    result = compared[dtype]
    constant = _constant_row(result)
    carried = [row for row in result.rows if "carries the constant made for the dtype" in row.message]
    assert {row.op for row in carried} >= {"aten.triu.default", "aten.add.Tensor"}
    assert all(row.verdict == "pass" and constant.name in row.message for row in carried)
    assert result.counts()["error"] == 0 and result.first_divergence is None
    assert not result.diverged
