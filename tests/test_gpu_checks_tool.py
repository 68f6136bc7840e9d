"""``tools/failed_tmp_paths.py``, which ``tools/gpu_checks.sh`` runs after ``pytest -m gpu`` on a lent
machine: from a real pytest run with workers, it packs the ``tmp_path`` of each failed test (a
parametrised one too) and none of another test's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "failed_tmp_paths.py"

_TESTS = """
import pytest

@pytest.mark.parametrize("case", ["a-1", "b"])
def test_a_long_name_of_a_test_that_writes_its_dump_and_fails(tmp_path, case):
    (tmp_path / "dump.txt").write_text(case)
    assert case == "b"

def test_passes(tmp_path):
    (tmp_path / "dump.txt").write_text("kept out")
"""


def _tool():
    spec = importlib.util.spec_from_file_location("failed_tmp_paths", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_failed_tests_folders_are_packed_and_no_others(tmp_path: Path) -> None:
    (tmp_path / "test_planted.py").write_text(textwrap.dedent(_TESTS))
    base, log = tmp_path / "base", tmp_path / "pytest.log"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rf",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            f"--basetemp={base}",
            "test_planted.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log.write_text(run.stdout)
    assert run.returncode == 1, run.stdout + run.stderr
    tool = _tool()
    assert tool.failed_tests(run.stdout) == ["test_a_long_name_of_a_test_that_writes_its_dump_and_fails[a-1]"]
    tool.main(log, base, tmp_path / "failed.tgz")
    with tarfile.open(tmp_path / "failed.tgz") as packed:
        dumps = [packed.extractfile(member).read() for member in packed.getmembers() if member.name.endswith("dump.txt")]
    # pytest cuts a folder's name to 30 characters: the passing parametrisation's folder is named
    # alike and comes too; the other test's does not
    assert sorted(dumps) == [b"a-1", b"b"]


def test_a_run_without_failures_packs_nothing(tmp_path: Path) -> None:
    log = tmp_path / "pytest.log"
    log.write_text("3 passed in 1.00s\n")
    _tool().main(log, tmp_path, tmp_path / "failed.tgz")
    assert not (tmp_path / "failed.tgz").exists()
