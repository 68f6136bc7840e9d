"""Records as compare reads them back: every field as written, fields of a newer version kept,
blank lines skipped."""

from __future__ import annotations

import json
import shutil

import torchdebug
from tests.store.old_format import to_json_lines
from torchdebug.records import Record
from torchdebug.store import _reader as reader


def _copy(dumps, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dumps("mlp", task="statistics"), copy)
    return copy, to_json_lines(copy)  # as dumps were written before records were Arrow columns


def test_records_read_back_equal_their_json_lines(dumps, tmp_path):
    _, path = _copy(dumps, tmp_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert reader.load(path.parent).ranks[0].records() == [Record.from_json(line) for line in lines]


def test_a_field_unknown_to_this_version_is_kept_in_extra(dumps, tmp_path):
    copy, path = _copy(dumps, tmp_path)
    first, second, *rest = path.read_text().splitlines(keepends=True)
    first = first.replace('"capture":', '"future_field":7,"capture":')
    second = second.replace('"capture":', '"extra":{"note":"x"},"capture":')
    path.write_text("".join([first, second, *rest]))
    records = reader.load(copy).ranks[0].records()
    assert records[0].extra == {"future_field": 7} and records[1].extra == {"note": "x"}
    assert records[2].extra == {}


def test_blank_lines_in_the_records_file_are_skipped(dumps, tmp_path):
    copy, path = _copy(dumps, tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + "\n" + "".join(lines[3:]))
    blank = torchdebug.compare(copy, dumps("mlp", task="statistics"))
    plain = torchdebug.compare(dumps("mlp", task="statistics"), dumps("mlp", task="statistics"))
    assert [row.to_dict() for row in blank.rows] == [row.to_dict() for row in plain.rows]
    assert not blank.problems
