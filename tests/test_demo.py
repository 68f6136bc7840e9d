"""The README's demo runs and tells what it promises: a healthy bf16 run without errors, and the
planted kernel bug named as the first divergence with its module and source line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.report.packed import unpack

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three training steps of a 4-layer GPT in a fresh process: 5-14 s on 2 cores
def test_demo_names_the_planted_bug(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    healthy, buggy = result.stdout.split("Comparing the bf16 run with a planted bug")
    assert " 0 error" in healthy and "first divergence: none" in healthy
    assert "first divergence (rank 0, step 0, forward): forward/layers.2.mlp.fc/aten.addmm.default#0/output.0" in buggy
    assert "examples/gpt.py:56 in forward" in buggy and "this op makes the difference" in buggy
    for page in ("compare.html", "compare_bug.html"):  # the reports the demo tells the user to open
        assert "layers.2.mlp.fc" in unpack((tmp_path / page).read_text(encoding="utf-8"))["rows"]["module"], page
