"""Dumps written before records were Arrow columns (``records.jsonl``) still read, convert and compare."""

from __future__ import annotations

import shutil

import torch

import torchdebug
from tests.store.old_format import OLD_DUMP
from torchdebug.cli import main
from torchdebug.store import _layout as layout

_LINES = next(OLD_DUMP.glob(f"*/*/{layout.RECORDS_JSON}"))


def test_an_old_dump_reads_every_record():
    dump = torchdebug.load(OLD_DUMP).ranks[0]
    records = dump.records()
    assert len(records) == len(_LINES.read_text().splitlines()) and dump.complete and not dump.truncated
    addmm = next(r for r in records if r.op == "aten.addmm.default" and r.io == "output")
    assert addmm.module == "0" and addmm.stats["nan"] == 0 and dump.stack(addmm)


def test_an_old_dump_converts_back_to_its_own_lines(tmp_path, capsys):
    out = tmp_path / "records.jsonl"
    assert main(["convert", str(OLD_DUMP), str(out)]) == 0
    assert out.read_bytes() == _LINES.read_bytes()
    assert "wrote 49 records" in capsys.readouterr().out


def test_an_old_dump_gives_the_arrow_table_of_a_new_one(tmp_path):
    table = torchdebug.load(OLD_DUMP).to_arrow()
    records = torchdebug.load(OLD_DUMP).ranks[0].records()
    assert table.num_rows == len(records) and table.column("name").to_pylist() == [r.name for r in records]


def test_an_old_dump_compares_with_itself(tmp_path):
    result = torchdebug.compare(OLD_DUMP, OLD_DUMP)
    assert result.counts()["error"] == 0 and result.counts()["unmatched"] == 0


def test_an_old_dump_cut_mid_line_drops_that_line(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(OLD_DUMP, copy)
    lines = next(copy.glob(f"*/*/{layout.RECORDS_JSON}"))
    text = lines.read_text()
    lines.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 30])
    dump = torchdebug.load(copy).ranks[0]
    assert dump.truncated and len(dump.records()) == len(text.splitlines()) - 1


def test_a_new_dump_converts_to_json_lines_that_read_back_as_its_records(tmp_path, tiny):
    import json

    from torchdebug.records import Record

    with torchdebug.dump(tmp_path / "dump", model=tiny):
        tiny(torch.randn(2, 4))
    assert main(["convert", str(tmp_path / "dump"), str(tmp_path / "out.jsonl")]) == 0
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [Record.from_json(json.loads(line)) for line in lines] == torchdebug.load(tmp_path / "dump").ranks[0].records()
