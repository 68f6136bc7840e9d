"""The report of a cross-rank check: one page for every rank, and a rank selector that keeps one."""

from __future__ import annotations

import pytest

from tests.compare.replicas import PERTURBED_RANK, WORLD_SIZE
from tests.report.browser import DOTS, browser, missing, open_compare_page
from torchdebug.compare import compare


@pytest.fixture(scope="module")
def report(replicas, tmp_path_factory):
    result = compare(replicas["perturbed"])
    return result, result.to_html(tmp_path_factory.mktemp("ranks") / "report.html")


def test_the_report_of_every_rank_offers_each_rank_and_marks_the_first_divergence(report):
    result, path = report
    html = path.read_text()
    for rank in range(WORLD_SIZE):
        assert f'<option value="{rank}">rank {rank}</option>' in html
    assert result.first_divergence.rank == PERTURBED_RANK
    number = result.rows.index(result.first_divergence) + 1
    assert f'<a class="mark mark-divergence" href="#row-{number}">' in html


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_the_rank_selector_keeps_one_rank_in_the_table_and_the_plot(report):
    from selenium.webdriver.support.select import Select

    result, path = report
    with browser() as driver:
        open_compare_page(driver, path.as_uri())
        dots = driver.execute_script(DOTS)
        Select(driver.find_element("id", "filter-rank")).select_by_visible_text(f"rank {PERTURBED_RANK}")
        ranks = driver.execute_script(
            "return Array.from(document.querySelectorAll('#rows tbody tr')).filter(r => !r.hidden).map(r => r.dataset.rank)"
        )
        assert set(ranks) == {str(PERTURBED_RANK)}
        assert len(ranks) == sum(1 for row in result.rows if row.rank == PERTURBED_RANK)
        assert 0 < driver.execute_script(DOTS) < dots
