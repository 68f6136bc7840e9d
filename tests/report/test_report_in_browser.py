"""The compare report in headless Chromium: the tree, the table and the plot render, clicks filter and link.

Skipped where no browser is installed (see ``browser.missing``); CI installs Debian's chromium.
``test_report_at_scale.py`` does the same on a page of 100,000 rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import torchdebug
from tests.report.browser import DOTS, SHOWN_COUNT, missing, open_compare_page, wait_for
from tests.report.hostile import HOSTILE, SCRIPT, dump
from tests.report.packed import unpack

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

_CHOSEN_MODULE = "return document.querySelector('#filter-module code').textContent"
"""The module the table is filtered to, as the page's chip shows it ('' for none)."""

_VISIBLE_ROWS = (
    "return Array.from(document.querySelectorAll('#rows tbody tr'))"
    ".filter(r => !r.hidden).map(r => [r.dataset.module, r.dataset.phase])"
)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    result = torchdebug.compare(dump(root / "a", 1.01), dump(root / "b", 1.0))
    return result, result.to_html(root / "report.html").as_uri()


@pytest.fixture
def page(driver, compared):
    """The report freshly loaded (no filter left from another test)."""
    result, uri = compared
    open_compare_page(driver, uri)
    return driver, result


def _click(driver, selector: str, text: str | None = None) -> None:
    """Click the element matching ``selector`` (and showing ``text``) as a user would."""
    from selenium.webdriver.common.by import By

    elements = driver.find_elements(By.CSS_SELECTOR, selector)
    element = next(e for e in elements if text is None or e.text == text)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def test_the_tree_the_table_and_the_plot_render_with_hostile_names_as_plain_text(page):
    from selenium.common.exceptions import NoAlertPresentException

    driver, result = page
    assert len(driver.execute_script(_VISIBLE_ROWS)) == len(result.rows)
    assert driver.find_element("id", "shown-count").text == f"{len(result.rows)} of {len(result.rows)} rows"
    names = driver.execute_script("return Array.from(document.querySelectorAll('#tree-body button.module'), b => b.textContent)")
    assert {HOSTILE, SCRIPT, "0"} <= set(names)  # "0": the child of SCRIPT, nested under it
    plot = driver.execute_script("const r = document.getElementById('plot').getBoundingClientRect(); return [r.width, r.height]")
    assert plot[0] > 300 and plot[1] > 100
    assert driver.execute_script(DOTS) > 0
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0  # no injected markup ran
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def test_the_plot_marks_the_first_divergence_and_links_it_to_its_row(page):
    driver, result = page
    href = driver.execute_script("return document.querySelector('#plot a.mark-divergence').getAttribute('href')")
    number = result.rows.index(result.first_divergence) + 1
    assert href == f"#row-{number}"
    _click(driver, "#plot a.mark-divergence text")
    wait_for(driver, "return location.hash", href)
    assert "target" in driver.find_element("id", f"row-{number}").get_attribute("class")


def test_clicking_a_module_in_the_tree_filters_the_table_and_the_plot(page):
    driver, result = page
    dots = driver.execute_script(DOTS)
    _click(driver, "#tree-body button.module", SCRIPT)
    wait_for(driver, _CHOSEN_MODULE, SCRIPT)
    shown = driver.execute_script(_VISIBLE_ROWS)
    expected = [row for row in result.rows if row.module == SCRIPT or row.module.startswith(SCRIPT + ".")]
    assert len(shown) == len(expected) and 0 < len(shown) < len(result.rows)
    assert all(module == SCRIPT or module.startswith(SCRIPT + ".") for module, _ in shown)
    assert 0 < driver.execute_script(DOTS) < dots
    assert driver.find_element("css selector", "#filter-module code").text == SCRIPT
    _click(driver, "#tree-body button.module", SCRIPT)  # a second click shows every module again
    wait_for(driver, _CHOSEN_MODULE, "")
    assert len(driver.execute_script(_VISIBLE_ROWS)) == len(result.rows)


def test_the_phase_selector_keeps_one_phase_in_the_table_and_the_tree(page):
    from selenium.webdriver.support.select import Select

    driver, result = page
    Select(driver.find_element("id", "filter-phase")).select_by_visible_text("backward")
    backward = sum(1 for row in result.rows if row.phase == "backward")
    wait_for(driver, SHOWN_COUNT, f"{backward} of {len(result.rows)} rows")
    shown = driver.execute_script(_VISIBLE_ROWS)
    assert {phase for _, phase in shown} == {"backward"}
    assert len(shown) == backward
    counted = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "'#tree-body > * > .node-line .count, #tree-body > details > summary .count'),"
        " c => parseInt(c.textContent)).reduce((a, b) => a + b, 0)"
    )
    assert counted == len(shown)  # the top-level nodes count the backward rows only


def test_the_first_divergence_box_shows_its_row_even_when_a_filter_hides_it(page):
    from selenium.webdriver.support.select import Select

    driver, result = page
    number = result.rows.index(result.first_divergence) + 1
    Select(driver.find_element("id", "filter-verdict")).select_by_visible_text("pass")
    passed = sum(1 for row in result.rows if row.verdict == "pass")
    wait_for(driver, SHOWN_COUNT, f"{passed} of {len(result.rows)} rows")
    assert driver.find_elements("id", f"row-{number}") == []  # filtered out: not in the table
    _click(driver, "#divergence h2 a")
    wait_for(driver, "return location.hash", f"#row-{number}")
    row = driver.find_element("id", f"row-{number}")
    assert row.get_attribute("hidden") is None and row.is_displayed()
    assert len(driver.execute_script(_VISIBLE_ROWS)) == len(result.rows)  # the filters were cleared


def test_clicking_a_dot_of_the_plot_goes_to_its_row(page):
    from selenium.webdriver.common.action_chains import ActionChains

    driver, result = page
    number = result.rows.index(result.first_divergence) + 1
    tables = unpack(Path(driver.current_url.removeprefix("file://")).read_text())
    dot = tables["dots"]["row"].index(number - 1)
    driver.execute_script("document.getElementById('plot').scrollIntoView({block: 'center'})")
    x, y = driver.execute_script(
        "const p = new DOMPoint(arguments[0], arguments[1]).matrixTransform(document.getElementById('plot').getScreenCTM());"
        "return [Math.round(p.x), Math.round(p.y)]",
        tables["dots"]["x"][dot],
        tables["dots"]["y"][dot],
    )
    actions = ActionChains(driver)
    actions.w3c_actions.pointer_action.move_to_location(x, y).click()
    actions.perform()
    wait_for(driver, "return location.hash", f"#row-{number}")
    assert "target" in driver.find_element("id", f"row-{number}").get_attribute("class")


_TABLE_FIT = """
const wrap = document.querySelector('.table-wrap');
const right = wrap.getBoundingClientRect().right;
const heads = Array.from(document.querySelectorAll('#rows thead th'));
return {
  overflow: wrap.scrollWidth - wrap.clientWidth,
  page: document.documentElement.scrollWidth - window.innerWidth,
  cut: heads.filter(th => th.getBoundingClientRect().right > right + 0.5).map(th => th.textContent),
  metrics: heads.map(th => th.textContent)
    .filter(t => ['difference', 'tol.', 'cosine', 'max abs', 'rel L2', 'max ULP'].includes(t)),
};
"""

_WIDEST = """
for (const tr of document.querySelectorAll('#rows tbody tr')) {
  for (const i of [4, 5, 7, 8]) tr.cells[i].textContent = '-1.234e-05';
  tr.cells[6].textContent = '0.99999988'; tr.cells[9].textContent = '1.234e+04';
  tr.cells[10].firstChild.textContent = 'float8_e4m3fn / bfloat16';
}
"""


def test_the_compare_table_fits_a_1400_pixel_window_with_every_metric_in_view(page):
    driver, _ = page
    assert driver.get_window_size()["width"] == 1400
    fit = driver.execute_script(_TABLE_FIT)
    assert fit["metrics"] == ["difference", "tol.", "cosine", "max abs", "rel L2", "max ULP"]
    assert fit["overflow"] <= 0 and fit["page"] <= 0 and fit["cut"] == [], fit
    driver.execute_script(_WIDEST)  # the widest numbers and dtypes a row can show: still no scrolling
    fit = driver.execute_script(_TABLE_FIT)
    assert fit["overflow"] <= 0 and fit["cut"] == [], fit


@pytest.fixture(scope="module")
def dump_page(tmp_path_factory):
    from torchdebug.cli import main

    root = tmp_path_factory.mktemp("dump-page")
    assert main(["report", str(dump(root / "dump", 1.0, "statistics")), "-o", str(root / "dump.html")]) == 0
    return (root / "dump.html").as_uri()


def test_the_dump_page_renders_its_plot_and_tables_within_the_window(driver, dump_page):
    driver.get(dump_page)
    shown = driver.execute_script(
        "const r = document.getElementById('module-plot-0').getBoundingClientRect();"
        "return {plot: [r.width, r.height], dots: document.querySelectorAll('#module-plot-0 circle').length,"
        " modules: document.querySelectorAll('#modules-0 tbody tr').length,"
        " page: document.documentElement.scrollWidth - window.innerWidth}"
    )
    assert shown["plot"][0] > 500 and shown["plot"][1] > 100 and shown["dots"] > 0
    assert shown["modules"] >= 3 and shown["page"] <= 0
    assert driver.execute_script("return document.querySelectorAll('img').length") == 0  # hostile names stay text
    assert [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"] == []


def test_a_header_click_sorts_the_module_table(driver, dump_page):
    driver.get(dump_page)
    records = "return Array.from(document.querySelectorAll('#modules-0 tbody tr'), r => parseInt(r.cells[2].textContent))"
    _click(driver, "#modules-0 th", "records")
    ascending = sorted(driver.execute_script(records))
    wait_for(driver, records, ascending)
    _click(driver, "#modules-0 th", "records")
    wait_for(driver, records, ascending[::-1])
