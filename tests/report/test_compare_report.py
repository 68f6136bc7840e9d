"""The compare HTML report: self-contained, complete, and safe with hostile names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import torchdebug
from tests.report.hostile import HOSTILE, SCRIPT, dump
from torchdebug.report import compare as report_compare


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hostile")
    result = torchdebug.compare(dump(root / "a", 1.01), dump(root / "b", 1.0))
    assert result.first_divergence is not None
    return result.to_html(root / "report.html").read_text()


def test_names_and_stacks_from_a_dump_are_escaped(report):
    assert HOSTILE not in report and SCRIPT not in report
    assert "&lt;img src=x onerror=alert(1)&gt;" in report
    assert "&lt;/script&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in report
    assert "<script>alert(2)</script>" not in report


def test_the_report_loads_nothing_from_the_network(report):
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", report)
    assert re.findall(r"<script[^>]*>", report) == ["<script>", "<script>"]  # inline: tables, then navigation


def test_the_report_shows_summary_first_divergence_table_and_plot(report):
    for part in ("Summary", "First divergence", '<table class="data"', "<svg", "<circle", 'id="tree"', 'id="filter-phase"'):
        assert part in report
    assert "aten.mul.Tensor" in report


def test_the_plot_has_labelled_axes_and_marks_the_first_divergence_with_a_link_to_its_row(report):
    assert "execution order (row of its rank)" in report and "error (scale-relative, log scale)" in report
    mark = re.search(r'<a class="mark mark-divergence" href="#row-(\d+)">', report)
    assert mark is not None
    row = re.search(rf'<tr id="row-{mark.group(1)}"[^>]*>', report).group(0)
    assert 'data-verdict="error"' in row


def test_a_statistics_only_report_renders_without_tensor_metrics(tmp_path):
    result = torchdebug.compare(dump(tmp_path / "a", 1.01, "statistics"), dump(tmp_path / "b", 1.0, "statistics"))
    html = result.to_html(tmp_path / "report.html").read_text()
    assert "First divergence" in html and "cosine 1" not in html


def test_a_report_without_divergence_says_so(tmp_path):
    path = dump(tmp_path / "a", 1.0, "statistics")
    html = torchdebug.compare(path, path).to_html(tmp_path / "report.html").read_text()
    assert "none: every difference is within tolerance" in html


def test_a_plot_past_its_point_cap_thins_passing_rows_and_keeps_every_other_one(tmp_path, monkeypatch):
    result = torchdebug.compare(dump(tmp_path / "a", 1.01), dump(tmp_path / "b", 1.0))
    loud = sum(1 for row in result.rows if row.matched and row.error is not None and row.verdict != "pass")
    monkeypatch.setattr(report_compare, "_MAX_POINTS", loud + 2)
    html = result.to_html(tmp_path / "report.html").read_text()
    verdicts = re.findall(r'<circle class="dot"[^>]*><title>[^<]*\((\w+)\)</title>', html)
    assert sum(verdict != "pass" for verdict in verdicts) == loud
    assert 0 < sum(verdict == "pass" for verdict in verdicts) <= 2
    assert "passing rows thinned out" in html


def test_every_verdict_compare_gives_has_a_colour_and_a_place_in_the_module_tree():
    from torchdebug.compare.rows import VERDICTS

    assert set(report_compare.COLORS) == set(VERDICTS)
    script = (Path(report_compare.__file__).parent / "templates" / "compare.js").read_text()
    tree_order = re.search(r"const VERDICTS = \[(.*?)\]", script).group(1)
    assert sorted(json.loads(f"[{tree_order}]")) == sorted(VERDICTS)
