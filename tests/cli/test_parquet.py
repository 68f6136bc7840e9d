"""``convert DUMP out.parquet`` and ``compare A B -o out.parquet``: tables for analysts."""

import sys

import pytest
import torch

import torchdebug
from torchdebug.cli import main

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


def _dump(path, scale=1.0):
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    with torchdebug.dump(path):
        (x * scale).exp().neg()
    return path


def test_convert_to_a_parquet_file_writes_every_record(tmp_path, capsys):
    dump = _dump(tmp_path / "dump")
    assert main(["convert", str(dump), str(tmp_path / "out" / "records.parquet")]) == 0
    table = pd.read_parquet(tmp_path / "out" / "records.parquet")
    assert list(table["name"]) == [r.name for r in torchdebug.load(dump).records()]
    assert "wrote" in capsys.readouterr().out


def test_convert_to_parquet_keeps_only_the_named_records(tmp_path):
    dump = _dump(tmp_path / "dump")
    assert main(["convert", str(dump), str(tmp_path / "neg.parquet"), "--name", "aten.neg"]) == 0
    assert set(pd.read_parquet(tmp_path / "neg.parquet")["op"]) == {"aten.neg.default"}


def test_convert_to_a_folder_without_a_format_is_a_usage_error(tmp_path, capsys):
    assert main(["convert", str(_dump(tmp_path / "dump")), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--to" in err and ".parquet" in err and len(err.splitlines()) == 1


def test_compare_writes_its_rows_to_a_parquet_file(tmp_path):
    a, b = _dump(tmp_path / "a"), _dump(tmp_path / "b")
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "rows.parquet")]) == 0
    table = pd.read_parquet(tmp_path / "rows.parquet")
    assert len(table) and set(table["verdict"]) == {"pass"}
    assert not (tmp_path / "rows.parquet" / "compare.csv").exists()


def test_compare_to_parquet_without_pandas_fails_first_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    assert main(["compare", str(tmp_path / "missing"), str(tmp_path / "missing"), "-o", str(tmp_path / "rows.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'torchdebug[pandas]'" in err and len(err.splitlines()) == 1
