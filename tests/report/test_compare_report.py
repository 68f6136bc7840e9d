"""The compare HTML report: self-contained, complete, and safe with hostile names."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import torchdebug

HOSTILE = "<img src=x onerror=alert(1)>"


class _Hostile(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.add_module(HOSTILE, nn.Linear(4, 4))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, HOSTILE)(x) * self.scale  # </script><script>alert(2)</script>


def _dump(path, scale: float, task: str = "tensor"):
    torchdebug.seed_all(0)
    model = _Hostile(scale)
    with torchdebug.dump(path, model=model, task=task):
        model(torch.randn(2, 4)).sum().backward()
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hostile")
    result = torchdebug.compare(_dump(root / "a", 1.01), _dump(root / "b", 1.0))
    assert result.first_divergence is not None
    return result.to_html(root / "report.html").read_text()


def test_names_and_stacks_from_a_dump_are_escaped(report):
    assert HOSTILE not in report
    assert "&lt;img src=x onerror=alert(1)&gt;" in report
    assert "<script>alert(2)</script>" not in report


def test_the_report_loads_nothing_from_the_network(report):
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", report)
    assert report.count("<script>") == 1  # the inline table script, nothing else


def test_the_report_shows_summary_first_divergence_table_and_plot(report):
    for part in ("Summary", "First divergence", "<table class=\"data\"", "<svg", "<circle", "data-filter"):
        assert part in report
    assert "aten.mul.Tensor" in report


def test_a_statistics_only_report_renders_without_tensor_metrics(tmp_path):
    result = torchdebug.compare(_dump(tmp_path / "a", 1.01, "statistics"), _dump(tmp_path / "b", 1.0, "statistics"))
    html = result.to_html(tmp_path / "report.html").read_text()
    assert "First divergence" in html and "cosine 1" not in html


def test_a_report_without_divergence_says_so(tmp_path):
    path = _dump(tmp_path / "a", 1.0, "statistics")
    html = torchdebug.compare(path, path).to_html(tmp_path / "report.html").read_text()
    assert "none: every difference is within tolerance" in html
