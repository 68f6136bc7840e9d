"""The RMSE-ratio rule: eager's own rounding error is the budget."""

from __future__ import annotations

import math

import torch

from torchdebug.diagnose._accuracy import check


def test_check_passes_a_result_as_close_to_fp64_as_eager() -> None:
    fp64 = torch.randn(100, dtype=torch.float64)
    eager = fp64.float()
    assert check("x", fp64, eager, eager.clone()).passed


def test_check_fails_a_result_far_from_fp64_and_reports_the_budget() -> None:
    fp64 = torch.randn(100, dtype=torch.float64)
    verdict = check("x", fp64, fp64.float(), fp64.float() + 1)
    assert not verdict.passed and verdict.error > 0.9 and verdict.budget < 1e-3
    assert "eager budget" in verdict.describe()


def test_check_fails_nan_that_eager_does_not_make() -> None:
    fp64 = torch.ones(4, dtype=torch.float64)
    result = torch.tensor([1.0, math.nan, 1.0, 1.0])
    assert not check("x", fp64, fp64.float(), result).passed


def test_check_fails_a_shape_mismatch() -> None:
    fp64 = torch.ones(4, dtype=torch.float64)
    verdict = check("x", fp64, fp64.float(), torch.ones(5))
    assert not verdict.passed and "shape" in verdict.note


def test_check_compares_integer_tensors_exactly() -> None:
    fp64 = torch.arange(6)
    assert check("i", fp64, fp64, fp64.clone()).passed
    assert not check("i", fp64, fp64, fp64 + 1).passed
