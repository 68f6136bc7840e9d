"""Is a result as accurate as eager? The RMSE-ratio rule of ``torch._dynamo.utils.same``.

A result ``res`` passes when it is close to the eager result ``ref`` (``allclose`` at ``tolerance``), or
when its RMSE against an fp64 reference is at most ``multiplier * rmse(ref, fp64) + tolerance / 10``:
eager's own rounding error sets the budget, so a reordering of float sums passes and a wrong value
does not. ``multiplier`` is 3 for fp16/bf16 results and tensors under 1000 elements, else 2 (as
``same``). Complex tensors are judged on the modulus of the difference. Integer and bool tensors
pass when they differ from fp64 in no more elements than eager does (twice as many, plus one, for
comparisons that flip on rounding ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torchdebug.diagnose._config import DEFAULT_TOLERANCE


@dataclass(frozen=True, slots=True)
class Check:
    """The verdict on one tensor: ``error`` against fp64 and the eager ``budget`` it had to meet."""

    name: str
    passed: bool
    error: float
    """RMSE of the result against fp64 (mismatching elements for integer tensors)."""
    budget: float
    """The largest ``error`` allowed: ``multiplier * eager error + tolerance / 10``."""
    shape: tuple[int, ...] = ()
    note: str = ""

    def describe(self) -> str:
        """``rmse 2.821 vs fp64, eager budget 1.2e-07`` (plus any note)."""
        unit = "mismatches" if self.note == "integral" else "rmse"
        text = f"{unit} {self.error:.4g} vs fp64, eager budget {self.budget:.3g}"
        return text if self.note in ("", "integral") else f"{text} ({self.note})"


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Root mean square of ``a - b`` in double precision (of ``|a - b|`` for complex tensors)."""
    if not a.numel():
        return 0.0
    if a.is_complex() or b.is_complex():
        return torch.sqrt(torch.mean(torch.square((a.to(torch.complex128) - b.to(torch.complex128)).abs()))).item()
    return torch.sqrt(torch.mean(torch.square(a.double() - b.double()))).item()


def check(name: str, fp64: torch.Tensor, ref: torch.Tensor, res: torch.Tensor, tolerance: float = DEFAULT_TOLERANCE) -> Check:
    """Judge ``res`` against ``fp64`` with eager ``ref`` as the baseline (see the module docstring)."""
    shape = tuple(res.shape)
    if tuple(fp64.shape) != shape:
        return Check(name, False, math.inf, 0.0, shape, f"shape {shape}, expected {tuple(fp64.shape)}")
    fp64, ref, res = fp64.detach().cpu(), ref.detach().cpu(), res.detach().cpu()
    if not (res.is_floating_point() or res.is_complex()):
        wrong = int((res != fp64.to(res.dtype)).sum())
        allowed = 2 * int((ref != fp64.to(ref.dtype)).sum()) + 1 if res.dtype == torch.bool else 0
        return Check(name, wrong <= allowed, float(wrong), float(allowed), shape, "integral")
    res_nan, ref_nan = res.isnan().any().item(), ref.isnan().any().item()
    if res_nan and not ref_nan:
        return Check(name, False, math.nan, 0.0, shape, "NaN where eager has none")
    if torch.allclose(ref.to(res.dtype), res, atol=tolerance, rtol=tolerance, equal_nan=True):
        return Check(name, True, _rmse(fp64, res), math.inf, shape)
    finite = torch.isfinite(fp64) & torch.isfinite(res) & torch.isfinite(ref)
    if not torch.equal(torch.isfinite(res), torch.isfinite(ref)):
        return Check(name, False, math.inf, 0.0, shape, "Inf/NaN where eager differs")
    res_error, ref_error = _rmse(fp64[finite], res[finite]), _rmse(fp64[finite], ref[finite])
    multiplier = 3.0 if res.dtype in (torch.float16, torch.bfloat16) or res.numel() < 1000 else 2.0
    budget = multiplier * ref_error + tolerance / 10.0
    return Check(name, res_error <= budget, res_error, budget, shape)
