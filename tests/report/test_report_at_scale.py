"""The compare report of 100,000 rows in headless Chromium: it opens (in seconds: bench/scale.py), and the filters,
the search, the module tree, sorting, paging and the links work over every row.

The rows are made without a model (``synthetic.py``); skipped where no browser is installed.
"""

from __future__ import annotations

import pytest

from tests.report.browser import SHOWN_COUNT, missing, open_compare_page, wait_for
from tests.report.synthetic import SyntheticResult, synthetic_rows
from torchdebug.compare._rows import VERDICTS
from torchdebug.report.compare import PAGE_ROWS, render_compare

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

ROWS = 100_000
_SHOWN = "return [document.getElementById('shown-count').textContent, document.getElementById('page-range').textContent]"
_PAGE = "return Array.from(document.querySelectorAll('#rows tbody tr'), r => [r.id, r.dataset.verdict, r.dataset.module])"


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    result = SyntheticResult(synthetic_rows(ROWS))
    page = tmp_path_factory.mktemp("large") / "report.html"
    page.write_text(render_compare(result, VERDICTS), encoding="utf-8")
    return result, page.as_uri()


@pytest.fixture
def page(driver, large):
    """The page freshly loaded, and the seconds from navigation to its first page of rows drawn."""
    result, uri = large
    return driver, result, open_compare_page(driver, uri)


def test_a_page_of_100k_rows_opens_and_shows_one_page_of_them(page):
    driver, result, _ = page  # how fast: bench/scale.py's report stage
    assert driver.execute_script(_SHOWN) == [f"{ROWS} of {ROWS} rows", f"rows 1–{PAGE_ROWS} of {ROWS}"]
    assert [r[0] for r in driver.execute_script(_PAGE)] == [f"row-{i}" for i in range(1, PAGE_ROWS + 1)]
    assert [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"] == []


def test_the_verdict_filter_and_the_search_run_over_every_row(page):
    from selenium.webdriver.support.select import Select

    driver, result, _ = page
    errors = [i for i, row in enumerate(result.rows) if row.verdict == "error"]
    Select(driver.find_element("id", "filter-verdict")).select_by_visible_text("error")
    wait_for(driver, SHOWN_COUNT, f"{len(errors)} of {ROWS} rows")
    assert [r[0] for r in driver.execute_script(_PAGE)] == [f"row-{i + 1}" for i in errors[:PAGE_ROWS]]
    module = "model.layers.42.mlp.fc"
    driver.find_element("id", "filter-text").send_keys(module)
    expected = sum(row.verdict == "error" and row.module == module for row in result.rows)
    wait_for(driver, SHOWN_COUNT, f"{expected} of {ROWS} rows")
    assert {(r[1], r[2]) for r in driver.execute_script(_PAGE)} <= {("error", module)}


def test_a_module_of_the_tree_keeps_its_rows_and_the_pager_walks_them(page):
    driver, result, _ = page
    block = "model.layers.42"
    mine = [i for i, row in enumerate(result.rows) if row.module == block or row.module.startswith(block + ".")]
    assert len(mine) > PAGE_ROWS
    button = next(b for b in driver.find_elements("css selector", "#tree-body button.module") if b.text == "42")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()
    wait_for(driver, _SHOWN, [f"{len(mine)} of {ROWS} rows", f"rows 1–{PAGE_ROWS} of {len(mine)}"])
    driver.find_element("id", "page-next").click()
    wait_for(driver, "return document.querySelector('#rows tbody tr').id", f"row-{mine[PAGE_ROWS] + 1}")
    shown = driver.execute_script(_PAGE)
    assert [r[0] for r in shown] == [f"row-{i + 1}" for i in mine[PAGE_ROWS : 2 * PAGE_ROWS]]
    assert driver.execute_script(_SHOWN)[1].startswith(f"rows {PAGE_ROWS + 1}–")


def test_sorting_by_difference_orders_every_row_and_the_numbers_read_as_python_writes_them(page):
    driver, result, _ = page
    header = next(th for th in driver.find_elements("css selector", "#rows th") if th.text == "difference")
    header.click()
    wait_for(driver, "return document.querySelector('#rows th.sorted-asc')?.textContent", "difference")
    header.click()  # descending
    by_difference = sorted(range(ROWS), key=lambda i: -result.rows[i].difference)
    first = "const r = document.querySelector('#rows tbody tr'); return [r.id, r.cells[4].textContent]"
    wait_for(driver, first, [f"row-{by_difference[0] + 1}", f"{result.rows[by_difference[0]].difference:.4g}"])


def test_the_first_divergence_link_opens_the_page_holding_its_row(page):
    driver, result, _ = page
    number = result.rows.index(result.first_divergence) + 1
    assert number > PAGE_ROWS  # on a later page
    link = driver.find_element("css selector", "#divergence h2 a")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    link.click()
    wait_for(driver, "return location.hash", f"#row-{number}")
    row = driver.find_element("id", f"row-{number}")
    assert row.is_displayed() and "target" in row.get_attribute("class")


def test_the_search_finds_a_slot_across_its_op_call_and_argument(page):
    driver, result, _ = page
    driver.find_element("id", "filter-text").send_keys("GELU.default#7 output")  # any case
    expected = sum(row.op == "aten.gelu.default" and row.call == 7 and row.io == "output" for row in result.rows)
    assert expected > 0
    wait_for(driver, SHOWN_COUNT, f"{expected} of {ROWS} rows")
