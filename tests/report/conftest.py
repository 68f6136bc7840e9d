"""Shared fixtures of the report tests: one headless Chromium per test module."""

from __future__ import annotations

import pytest

from tests.report.browser import browser


@pytest.fixture(scope="module")
def driver():
    """A headless Chromium for the module's tests (the modules that use it skip where there is none)."""
    with browser() as opened:
        yield opened
