"""Headless Chromium for report tests: Debian's ``chromium`` and ``chromedriver``, driven by selenium.

No browser download: the system binaries only (``apt-get install chromium chromium-driver``), with
a fresh profile and everything that would reach the network switched off.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--force-device-scale-factor=1",
)

DOTS = (
    "return Array.from(document.querySelectorAll('#dots path'), p => (p.getAttribute('d').match(/M/g) || []).length)"
    ".reduce((a, b) => a + b, 0)"
)
"""A script giving the number of dots a compare page's plot draws (each a subpath of its verdict's path)."""

SHOWN_COUNT = "return document.getElementById('shown-count').textContent"
"""A script giving a compare page's count of the rows its filters keep ("N of M rows")."""


def _binaries() -> tuple[str | None, str | None]:
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def missing() -> str | None:
    """Why no browser can run here, or ``None`` when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    chromium, driver = _binaries()
    if chromium is None or driver is None:
        return "no headless Chromium: install Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
    return None


@contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A selenium driver of headless Chromium with a ``width`` x ``height`` window, console logged."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _binaries()
    profile = tempfile.mkdtemp(prefix="torchdebug-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_compare_page(driver: Any, uri: str, timeout: float = 120.0) -> float:
    """Load a compare page at ``uri`` and wait until its rows are unpacked and the table's first page
    drawn; returns the seconds from navigation to then (the page's ``rows-ready`` mark)."""
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get(uri)
    state = WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.getElementById('rows').dataset.state")
    )
    assert state == "ready", driver.find_element("id", "rows").text
    return driver.execute_script("return performance.getEntriesByName('rows-ready')[0].startTime") / 1000


def wait_for(driver: Any, script: str, expected: Any, timeout: float = 30.0) -> None:
    """Wait until ``script`` returns ``expected``. A click, a key or a choice reaches the page as an
    input event, which a loaded machine may handle after the next script (seen in CI): read what it
    changed only once it shows."""
    from selenium.webdriver.support.wait import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script) == expected)
