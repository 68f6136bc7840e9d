"""The statistics of compiled graphs' values, taken inside the graph or by the host as the graph
runs, equal ``tensor_stats`` of the same values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import torchdebug
from torchdebug.compile import CompilerConfig, dump_pass, get_backend
from torchdebug.stats import tensor_stats


def _program(f32: torch.Tensor, f16: torch.Tensor, bf16: torch.Tensor, f64: torch.Tensor, i64: torch.Tensor, flags: torch.Tensor):
    return (f32 * 2, (f32 - f32) / (f32 - f32), f16 + 1, bf16 * 3, f64 - 1, i64 * 2, flags.logical_not(), f32.sqrt())


def _close(got: float | None, want: float | None, dtype: str) -> bool:
    if got is None or want is None:
        return got is want
    # inductor computes float16/bfloat16 in float32 and rounds only when it stores, so statistics
    # taken in the same kernel see the unrounded values: a difference of the dtype's rounding
    rel = 1e-2 if dtype in ("float16", "bfloat16") else 1e-5
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-6) or (math.isinf(got) and got == want)


@pytest.mark.parametrize("where", ["graph", "host"])
def test_dumped_statistics_match_eager_statistics_for_special_values_and_dtypes(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "graph":  # as on devices without the native kernel
        monkeypatch.setattr(dump_pass, "_host_stats", lambda value: False)
    elif not dump_pass._host_stats(torch.zeros(1)):
        pytest.skip("no native statistics kernel on this machine")
    config = CompilerConfig()
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.task = "tensor"
    backend = get_backend(config)
    f32 = torch.tensor([1.0, -2.0, float("nan"), float("inf"), -float("inf"), 0.5, float("nan")])
    inputs = (
        f32,
        torch.randn(64).half(),
        torch.randn(33).bfloat16(),
        torch.randn(5, 5, dtype=torch.float64),
        torch.arange(-3, 9),
        torch.tensor([True, False, True]),
    )
    torch.compile(_program, backend=backend)(*inputs)
    backend.data_dump.close()
    run = torchdebug.load(backend.data_dump.run_dir).ranks[0]
    records = [r for r in run.records() if r.tensor is not None]
    assert len({r.dtype for r in records}) == 6
    assert any(r.stats["nan"] == 7 for r in records)  # 0 / 0 and nan / nan: every element NaN, no values
    for record in records:
        want = tensor_stats(run.load_tensor(record))
        for key, value in want.items():
            assert _close(record.stats[key], value, record.dtype), (record.name, key, record.stats, want)
