"""Pack the ``tmp_path`` folders of the tests a pytest run failed into one archive:
``python tools/failed_tmp_paths.py PYTEST_LOG BASETEMP ARCHIVE`` (``tools/gpu_checks.sh`` runs it
after ``pytest -m gpu -rf --basetemp=BASETEMP``), so that the dumps of a failed GPU test can be read
after the machine that ran it is gone. pytest names a test's folder after the test: its name with
each character that is not a letter, digit or ``_`` replaced by ``_``, cut to 30 characters, then a
number (``_pytest.tmpdir``); with xdist each worker's folders sit under ``popen-gw<N>``. The folders
of tests whose names start alike (a long test's parametrisations) cannot be told apart: all come."""

from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

_NAME_CHARACTERS = 30
"""Characters of a test's name pytest keeps in its folder's name (``_pytest.tmpdir``'s ``MAXVAL``)."""


def failed_tests(log: str) -> list[str]:
    """The names (``test_x[param]``) of the tests a pytest log's ``-rf`` summary lists as failed."""
    return re.findall(r"^FAILED \S+::(\S+)", log, re.MULTILINE)


def failed_folders(base: Path, names: list[str]) -> list[Path]:
    """The ``tmp_path`` folders under ``base`` of the tests ``names``."""
    stems = {re.sub(r"\W", "_", name)[:_NAME_CHARACTERS] for name in names}

    def of_a_failed_test(folder: Path) -> bool:
        return any(folder.name.startswith(stem) and folder.name[len(stem) :].isdigit() for stem in stems)

    folders = [*base.glob("*"), *base.glob("popen-gw*/*")]
    return sorted(folder for folder in folders if folder.is_dir() and of_a_failed_test(folder))


def main(log: Path, base: Path, archive: Path) -> None:
    names = failed_tests(log.read_text())
    folders = failed_folders(base, names) if names else []
    if folders:
        with tarfile.open(archive, "w:gz") as packed:
            for folder in folders:
                packed.add(folder, arcname=str(folder.relative_to(base)))
    print(f"{len(names)} failed tests; their folders: {', '.join(f.name for f in folders) or 'none'}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python tools/failed_tmp_paths.py PYTEST_LOG BASETEMP ARCHIVE")
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
