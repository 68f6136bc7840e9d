"""README.md and docs/*.md name only what exists: every ``torchdebug.x.y`` path, every
``Class.attribute`` of torchdebug's classes, every repository file and every ``--flag`` they quote.
A rename that forgets the docs fails here, so the docs cannot go stale silently."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

from torchdebug.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "torchdebug"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# names the docs quote as former spellings, removed: each must stay gone (or leave this list)
FORMER_NAMES = {"torchdebug.DiagnoseReport", "torchdebug.capture.watcher"}
FORMER_FLAGS = {"--forward-only", "--mode", "--statistics-only", "--stats-only"}
# flags of other programs the docs show beside ours, with the program
OTHER_PROGRAMS_FLAGS = {
    "--nproc-per-node": "torchrun",
    "--nnodes": "torchrun",
    "--node-rank": "torchrun",
    "--rdzv-backend": "torchrun",
    "--rdzv-endpoint": "torchrun",
    "--check": "ruff format",
}

DOTTED = re.compile(r"(?<![\w./])torchdebug(?:\.[A-Za-z_]\w*)+")
ATTRIBUTE = re.compile(r"(?<![\w.])([A-Z][A-Za-z0-9]+)\.([a-z_]\w*)")
FILE = re.compile(r"(?<![\w./:-])((?:src/)?(?:torchdebug|tests|bench|examples|docs|native)/[\w./-]*\w)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w-])")
URL = re.compile(r"https?://\S+")
# a section named after its file, as in "docs/<file>.md, \"Title\"" or "docs/<file>.md's *Title*"
SECTION = re.compile(r"((?:docs|bench)/[A-Za-z_]+\.md)`?(?:,|'s)? \(?[\"*]([^\"*]{3,80})[\"*]")


def _quoted(path: Path) -> list[str]:
    """The text of ``path`` inside backticks and code blocks, where names are quoted, without URLs."""
    text = URL.sub("", path.read_text())
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    prose = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.DOTALL)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _found(pattern: re.Pattern[str], group: int = 0) -> dict[str, set[str]]:
    """``name -> docs quoting it`` for every match of ``pattern`` in the quoted text of the docs."""
    found: dict[str, set[str]] = {}
    for path in DOCS:
        for quote in _quoted(path):
            for match in pattern.finditer(quote):
                found.setdefault(match.group(group), set()).add(path.name)
    return found


def _module_file(module: str) -> Path | None:
    """The file of the torchdebug module ``module``, if there is one."""
    package = PACKAGE.parent / Path(*module.split("."))
    for candidate in (package / "__init__.py", package.parent / f"{package.name}.py"):
        if candidate.exists():
            return candidate
    return None


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a torchdebug module, or a name reached from one by attributes."""
    parts = dotted.split(".")
    module = next(".".join(parts[:end]) for end in range(len(parts), 0, -1) if _module_file(".".join(parts[:end])))
    value = importlib.import_module(module)
    for name in parts[len(module.split(".")) :]:
        if not _has_attribute(value, name):
            return False
        value = getattr(value, name, None)
    return True


def _has_attribute(value: object, name: str) -> bool:
    """``hasattr``, and for a class also its dataclass fields and annotated attributes."""
    if hasattr(value, name):
        return True
    if not isinstance(value, type):
        return False
    if dataclasses.is_dataclass(value) and name in {field.name for field in dataclasses.fields(value)}:
        return True
    return any(name in vars(base).get("__annotations__", {}) for base in value.__mro__)


@cache
def _classes() -> dict[str, list[str]]:
    """``class name -> modules defining it`` for every class in src/torchdebug."""
    classes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(module)
    return classes


def _cli_flags() -> set[str]:
    """Every long flag of ``torchdebug`` and its subcommands, former spellings included."""
    flags: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(flag for flag in action.option_strings if flag.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return flags


def _bench_flags() -> set[str]:
    """The long flags the scripts of bench/ and docs/ declare (string literals ``"--..."``)."""
    scripts = [*(ROOT / "bench").glob("*.py"), *(ROOT / "docs").glob("*.py")]
    return {
        node.value
        for script in scripts
        for node in ast.walk(ast.parse(script.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and FLAG.fullmatch(node.value)
    }


def test_every_torchdebug_name_the_docs_quote_exists():
    names = _found(DOTTED)
    missing = {name: docs for name, docs in names.items() if name not in FORMER_NAMES and not _resolves(name)}
    assert missing == {}


def test_the_former_names_the_docs_quote_are_gone():
    assert {name for name in FORMER_NAMES if _module_file(name) or _resolves(name)} == set()


def test_every_attribute_of_a_torchdebug_class_the_docs_quote_exists():
    missing = {}
    for quoted, docs in _found(ATTRIBUTE).items():
        owner, name = ATTRIBUTE.fullmatch(quoted).groups()
        modules = _classes().get(owner)
        if modules is None:  # not a torchdebug class (torch's, a model's)
            continue
        if not any(_has_attribute(getattr(importlib.import_module(m), owner), name) for m in modules):
            missing[quoted] = docs
    assert missing == {}


def test_every_repository_file_the_docs_quote_exists():
    def exists(path: str) -> bool:
        return (ROOT / path).exists() or (ROOT / "src" / path).exists()

    assert {path: docs for path, docs in _found(FILE, group=1).items() if not exists(path)} == {}


def test_every_flag_the_docs_quote_is_one_a_command_takes():
    known = _cli_flags() | _bench_flags() | set(OTHER_PROGRAMS_FLAGS)
    flags = _found(FLAG)
    assert {flag: docs for flag, docs in flags.items() if flag not in known | FORMER_FLAGS} == {}


@pytest.mark.parametrize("flag", sorted(FORMER_FLAGS))
def test_the_former_flags_the_docs_quote_are_gone(flag):
    assert flag not in _cli_flags()


def _headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if re.match(r"#+ ", line)]


def test_every_section_the_docs_and_the_code_point_to_exists():
    """A section the docs, the code and the tests point to (``docs/<file>.md, "Title"``) is a heading of
    that file, or the start of one (``"Rerun"`` for *Rerun: an op's own error*)."""
    sources = [*DOCS, ROOT / "bench" / "RESULTS.md", *PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    missing = set()
    for source in sources:
        text = " ".join(source.read_text().split())  # a reference may break across lines
        for path, title in SECTION.findall(text):
            if not any(heading.startswith(title) for heading in _headings(ROOT / path)):
                missing.add((source.name, path, title))
    assert missing == set()


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    """``.ci/run`` runs the README's ``make test`` and no other make target."""
    readme_commands = re.findall(r"^(make test)\b", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    ci_commands = re.findall(r"^\s*(make\b.*)$", (ROOT / ".ci" / "run").read_text(), flags=re.MULTILINE)
    assert readme_commands == ["make test"]
    assert ci_commands == ["make test"]


def test_the_checks_see_the_names_the_docs_are_made_of():
    """The patterns find what the docs quote most: a check that finds nothing would pass forever."""
    assert {"torchdebug.compare", "torchdebug.scope.data_dump"} <= set(_found(DOTTED))
    assert {"--across-ranks", "--workers", "--rerun"} <= set(_found(FLAG))
    assert "docs/format.md" in _found(FILE, group=1)
    assert any(quoted.startswith("CompareConfig.") for quoted in _found(ATTRIBUTE))
    assert ("docs/compare.md", "Sharded runs") in SECTION.findall((ROOT / "docs" / "capture.md").read_text())
