"""Module docstrings say what a module is for in a few lines and point to the docs (issue 50): the
details live on the functions and classes that do them, the guides and rules in docs/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "torchdebug"
MOST_LINES = 19
"""Fewer than the 20-line essays that repeated the docs."""


def _long_docstrings(root: Path) -> dict[str, int]:
    """``{module path: lines}`` of the modules under ``root`` whose docstring is over the limit."""
    long = {}
    for path in root.rglob("*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if docstring and len(docstring.splitlines()) > MOST_LINES:
            long[str(path.relative_to(root))] = len(docstring.splitlines())
    return long


def test_every_module_docstring_is_a_few_lines():
    long = _long_docstrings(PACKAGE)
    assert not long, f"module docstrings over {MOST_LINES} lines (say what the module is for, point to docs/): {long}"


def test_an_essay_is_caught(tmp_path):
    (tmp_path / "short.py").write_text('"""One line."""\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "essay.py").write_text('"""' + "\n".join(f"line {i}" for i in range(25)) + '"""\n')
    assert _long_docstrings(tmp_path) == {"sub/essay.py": 25}
