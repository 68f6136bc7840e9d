"""docs/glossary.md names every config key and command-line flag, each once, with where it is used:
a new option, or an old word put to a new use, fails here until the glossary says what it means."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections import defaultdict
from pathlib import Path

import torchdebug.compare._config
import torchdebug.compile._config
import torchdebug.config
import torchdebug.diagnose._config
import torchdebug.monitor._config  # noqa: F401 - every config class is an Options subclass once imported
from torchdebug.cli import build_parser
from torchdebug.options import Options

GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
EVERY_COMMAND = "every command"


def _glossary_rows() -> dict[str, set[str]]:
    """``word -> places`` from the glossary's table (a word listed twice fails: it has one row)."""
    rows: dict[str, set[str]] = {}
    for line in GLOSSARY.read_text().splitlines():
        found = re.match(r"^\| `([a-z_]+)` \| ([^|]+) \|", line)
        if found:
            word, places = found.groups()
            assert word not in rows, f"{word} has two rows in docs/glossary.md"
            rows[word] = {place.strip() for place in places.split(",")}
    return rows


def _subclasses(kind: type) -> list[type]:
    return [each for sub in kind.__subclasses__() for each in (sub, *_subclasses(sub))]


def _used() -> dict[str, set[str]]:
    """``word -> places`` from the code: each config class's keys, each command's long flags."""
    used: dict[str, set[str]] = defaultdict(set)
    for config in _subclasses(Options):
        if not config.__module__.startswith("torchdebug."):  # a test's own config class
            continue
        for key in dataclasses.fields(config):
            used[key.name].add(config.__name__)
    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    shared = {flag for action in parser._actions for flag in action.option_strings}
    for command, subparser in commands.items():
        for action in subparser._actions:
            if action.help == argparse.SUPPRESS:  # a former spelling
                continue
            for flag in action.option_strings:
                if flag.startswith("--"):
                    word = flag[2:].removeprefix("no-").replace("-", "_")
                    used[word].add(EVERY_COMMAND if flag in shared or word == "help" else command)
    return used


def test_every_config_key_and_flag_has_one_row_in_the_glossary_naming_where_it_is_used():
    rows, used = _glossary_rows(), _used()
    assert sorted(set(used) - set(rows)) == [], "add these words to docs/glossary.md's table"
    assert sorted(set(rows) - set(used)) == [], "these glossary rows name nothing the code has"
    assert {word: places for word, places in rows.items() if places != used[word]} == {}


def test_the_glossary_reads_words_as_the_code_spells_them():
    """The check parses rows as ``| `word` | places | meaning |``: at least the words everybody meets."""
    rows = _glossary_rows()
    assert {"task", "step", "rank", "dump_path", "tolerances", "replay"} <= set(rows)
