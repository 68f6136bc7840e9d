"""``torchdebug compare``: exit status for CI, reports written with -o, one-line errors."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from tests.store.old_format import to_json_lines
from torchdebug.cli import main


def test_cli_exits_0_when_nothing_diverges(dumps, capsys):
    assert main(["compare", str(dumps("mlp")), str(dumps("mlp"))]) == 0
    assert "first divergence: none" in capsys.readouterr().out


def test_cli_exits_1_on_a_divergence_and_writes_the_reports(dumps, tmp_path, capsys):
    status = main(["compare", str(dumps("mlp", gain=1.001)), str(dumps("mlp")), "-o", str(tmp_path / "out")])
    assert status == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["compare.csv", "compare.html", "compare.json"]
    report = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert report["diverged"] and report["first_divergence"]["op"] == "aten.mul.Tensor"
    assert report["first_divergence"]["stack"]
    header = (tmp_path / "out" / "compare.csv").read_text().splitlines()[0]
    assert header.startswith("rank,step,phase,module,op") and "cosine" in header


def test_the_csv_and_json_write_the_difference_under_its_former_name_too_for_one_release(dumps, tmp_path):
    main(["compare", str(dumps("mlp", gain=1.001)), str(dumps("mlp")), "-o", str(tmp_path), "--format", "csv,json"])
    with (tmp_path / "compare.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(row["error"] == row["difference"] for row in rows)
    assert any(row["difference"] not in ("", "0.0") for row in rows)
    written = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [row["error"] for row in written] == [row["difference"] for row in written]


def test_cli_tolerance_option_relaxes_a_dtype(dumps):
    assert main(["compare", str(dumps("mlp", gain=1.001)), str(dumps("mlp")), "--tolerance", "float32=0.01"]) == 0


def test_cli_writes_only_the_formats_asked(dumps, tmp_path):
    main(["compare", str(dumps("mlp")), str(dumps("mlp")), "-o", str(tmp_path), "--format", "json"])
    assert [p.name for p in tmp_path.iterdir()] == ["compare.json"]


def test_cli_exits_2_with_one_line_for_a_missing_dump(dumps, tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope"), str(dumps("mlp"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such dump folder" in err


def test_cli_rejects_a_malformed_tolerance(dumps):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(dumps("mlp")), str(dumps("mlp")), "--tolerance", "bf16"])
    assert exit_info.value.code == 2


def test_a_corrupt_record_line_is_exit_2_with_the_line_number(dumps, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(dumps("mlp"), copy)
    records = to_json_lines(copy)  # a dump written before records were Arrow columns
    lines = records.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    records.write_text("".join(lines))
    assert main(["compare", str(copy), str(dumps("mlp"))]) == 2
    assert "records.jsonl:4: corrupt record line" in capsys.readouterr().err
