"""The compare HTML report: self-contained, complete, small at any size, and safe with hostile names."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import torchdebug
from tests.report.hostile import HOSTILE, SCRIPT, dump
from tests.report.packed import unpack
from tests.report.synthetic import SyntheticResult, synthetic_rows
from torchdebug.compare._rows import VERDICTS
from torchdebug.report import compare as report_compare


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    result = torchdebug.compare(dump(root / "a", 1.01), dump(root / "b", 1.0))
    assert result.first_divergence is not None
    return result, result.to_html(root / "report.html").read_text()


@pytest.fixture(scope="module")
def report(compared) -> str:
    return compared[1]


def test_names_and_stacks_from_a_dump_are_escaped_or_packed(report):
    assert HOSTILE not in report and SCRIPT not in report
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in report  # the first divergence's stack
    assert "<script>alert(2)</script>" not in report
    modules = set(unpack(report)["rows"]["module"])  # the table's names reach the page packed, as data
    assert HOSTILE in modules and f"{SCRIPT}.0" in modules


def test_the_report_loads_nothing_from_the_network(report):
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", report)
    scripts = re.findall(r"<script[^>]*>", report)  # inline: tables, the packed rows (not run), navigation
    assert scripts == ["<script>", '<script type="application/octet-stream" id="packed">', "<script>"]


def test_the_report_shows_summary_first_divergence_table_and_plot(report):
    for part in ("Summary", "First divergence", '<table class="data"', "<svg", 'id="dots"', 'id="tree"', 'id="filter-phase"'):
        assert part in report
    assert "aten.mul.Tensor" in report


def test_the_packed_rows_hold_every_row_of_the_table(compared):
    result, report = compared
    rows = unpack(report)["rows"]
    assert rows["verdict"] == [row.verdict for row in result.rows]
    assert rows["module"] == [row.module for row in result.rows]
    assert rows["call"] == [row.call for row in result.rows]
    assert rows["message"] == [row.message for row in result.rows]
    differences = [row.difference for row in result.rows]
    absent = [bool(bits & 1) for bits in rows["absent"]]  # bit 0: difference
    assert absent == [difference is None for difference in differences]
    assert rows["difference"] == pytest.approx([math.nan if d is None else d for d in differences], rel=1e-9, nan_ok=True)


def test_the_plot_has_labelled_axes_and_marks_the_first_divergence_with_a_link_to_its_row(compared):
    result, report = compared
    assert "execution order (row of its rank)" in report and "difference (scale-relative, log scale)" in report
    mark = re.search(r'<a class="mark mark-divergence" href="#row-(\d+)">', report)
    assert mark is not None
    assert int(mark.group(1)) == result.rows.index(result.first_divergence) + 1
    assert unpack(report)["rows"]["verdict"][int(mark.group(1)) - 1] == "error"


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
    loud = sum(1 for row in result.rows if row.matched and row.difference is not None and row.verdict != "pass")
    monkeypatch.setattr(report_compare, "_MAX_POINTS", loud + 2)
    html = result.to_html(tmp_path / "report.html").read_text()
    verdicts = [result.rows[i].verdict for i in unpack(html)["dots"]["row"]]
    assert sum(verdict != "pass" for verdict in verdicts) == loud
    assert 0 < sum(verdict == "pass" for verdict in verdicts) <= 2
    assert "passing rows thinned out" in html


def test_every_verdict_compare_gives_has_a_colour_and_a_place_in_the_module_tree():
    from torchdebug.compare._rows import VERDICTS

    assert set(report_compare.COLORS) == set(VERDICTS)
    script = (Path(report_compare.__file__).parent / "templates" / "compare.js").read_text()
    tree_order = re.search(r"const VERDICTS = \[(.*?)\]", script).group(1)
    assert sorted(json.loads(f"[{tree_order}]")) == sorted(VERDICTS)


def test_a_page_of_100k_rows_takes_at_most_60_bytes_a_row(tmp_path):
    result = SyntheticResult(synthetic_rows(100_000))
    page = tmp_path / "report.html"
    page.write_text(report_compare.render_compare(result, VERDICTS), encoding="utf-8")
    assert list(tmp_path.iterdir()) == [page]  # one file: the whole report
    assert page.stat().st_size / len(result.rows) <= 60
    tables = unpack(page.read_text())
    assert len(tables["rows"]["verdict"]) == 100_000 and len(tables["dots"]["row"]) <= report_compare._MAX_POINTS
