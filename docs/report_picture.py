"""Redraw ``docs/compare_report.png``, the README's picture of the compare report.

    python docs/report_picture.py        # needs chromium, chromium-driver and selenium (the test extra)

Dumps the demo's fp32 run and its bf16 run with the planted bug (``examples/demo.py``), compares
them, opens the report in headless Chromium and saves the top of the page as it first shows: summary,
first divergence, error plot, module tree (opened down to the first divergence) and table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torchdebug  # noqa: E402
from examples.demo import dump_step  # noqa: E402
from tests.report.browser import browser, missing, open_compare_page  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compare_report.png", help="PNG to write")
    args = parser.parse_args()
    if missing():
        sys.exit(f"report_picture: {missing()}")
    out = args.out.resolve()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)  # short relative paths in the picture: demo_out/...
        reference = dump_step(Path("demo_out/fp32"), bf16=False)
        buggy = dump_step(Path("demo_out/bf16_bug"), bf16=True, bug=True)
        result = torchdebug.compare(buggy, reference)
        page = result.to_html(Path("compare.html")).resolve()
        with browser(width=1400, height=1560) as driver:
            open_compare_page(driver, page.as_uri())  # the rows unpacked and their first page drawn
            driver.save_screenshot(str(out))
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
