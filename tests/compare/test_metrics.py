"""Float64 metrics and per-dtype tolerances."""

from __future__ import annotations

import math

import pytest
import torch

from torchdebug.compare._metrics import stats_metrics, tensor_metrics
from torchdebug.compare._tolerances import Tolerance, lower_precision, parse_tolerances, tolerance_for


def test_identical_tensors_have_zero_error_and_unit_cosine():
    x = torch.randn(1000)
    metrics = tensor_metrics(x, x.clone(), low_dtype="float32", atol=1e-5)
    assert metrics["error"] == metrics["max_abs_err"] == 0.0
    assert metrics["cosine"] == pytest.approx(1.0)
    assert metrics["within_1e-3"] == 1.0


def test_bf16_rounding_is_at_most_half_an_ulp():
    x = torch.randn(10000)
    metrics = tensor_metrics(x.to(torch.bfloat16), x, low_dtype="bfloat16", atol=1e-5)
    assert metrics["max_ulp"] <= 0.5
    assert metrics["error"] < tolerance_for("bfloat16", "float32").rtol


def test_metrics_match_a_direct_float64_computation():
    a, b = torch.randn(5000), torch.randn(5000)
    metrics = tensor_metrics(a, b, low_dtype="float32", atol=1e-5)
    a64, b64 = a.double(), b.double()
    assert metrics["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(a64, b64, dim=0)), rel=1e-9)
    assert metrics["rmse"] == pytest.approx(float((a64 - b64).pow(2).mean().sqrt()), rel=1e-9)
    assert metrics["max_abs_err"] == pytest.approx(float((a64 - b64).abs().max()))


def test_nan_and_inf_positions_are_compared_explicitly():
    a = torch.tensor([1.0, float("nan"), float("-inf"), 2.0])
    same = tensor_metrics(a, a.clone(), low_dtype="float32", atol=1e-5)
    other = tensor_metrics(a, torch.tensor([1.0, float("nan"), 0.0, 2.0]), low_dtype="float32", atol=1e-5)
    assert same["nonfinite_mismatch"] == 0 and same["error"] == 0
    assert other["nonfinite_mismatch"] == 1


def test_a_near_zero_mean_does_not_inflate_the_statistics_error():
    b = {"min": -2.0, "max": 2.0, "mean": 1e-10, "norm": 40.0}
    a = {"min": -2.001, "max": 2.0, "mean": 9e-10, "norm": 40.01}
    metrics = stats_metrics(a, b, numel=400, atol=1e-5)
    assert metrics["mean_rel"] == pytest.approx(8.0)  # what msprobe calls 800 %
    assert metrics["error"] < 1e-3


def test_statistics_report_nan_on_one_side():
    metrics = stats_metrics({"min": 0.0, "max": math.nan}, {"min": 0.0, "max": 1.0}, numel=4, atol=1e-5)
    assert metrics["nonfinite_mismatch"] == 1


def test_tolerance_follows_the_less_precise_dtype():
    assert lower_precision("bfloat16", "float32") == "bfloat16"
    assert tolerance_for("float32", "torch.float16").rtol == 1e-3
    assert tolerance_for("int64", "int64").rtol == 0


def test_tolerance_overrides_accept_numbers_and_dicts():
    overrides = parse_tolerances({"bfloat16": 0.05, "float32": {"rtol": 1e-4, "atol": 1e-6}})
    assert overrides["bfloat16"] == Tolerance(0.05, 1e-5)
    assert overrides["float32"] == Tolerance(1e-4, 1e-6)


def test_tolerance_overrides_reject_nonsense_with_the_field_name():
    with pytest.raises(ValueError, match="tolerances.float32: got 'loose'"):
        parse_tolerances({"float32": "loose"})
