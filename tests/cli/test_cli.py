"""The command line: show, convert, config, exit statuses."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import torchdebug
from torchdebug.cli import main


@pytest.fixture
def tensor_dump(tmp_path):
    with torchdebug.dump(tmp_path / "dump", task="tensor"):
        torch.ones(2, 3).exp()
        torch.ones(4, dtype=torch.bfloat16).neg()
    return tmp_path / "dump"


def test_show_prints_matching_records_with_statistics_and_stack(tensor_dump, capsys):
    assert main(["show", str(tensor_dump), "--name", "aten.exp", "--step", "0"]) == 0
    out = capsys.readouterr().out
    assert "forward/-/aten.exp.default#0/output.0" in out
    assert "min 2.71828" in out and "stack (most recent call last):" in out
    assert "aten.neg" not in out


def test_show_says_when_nothing_matches(tensor_dump, capsys):
    assert main(["show", str(tensor_dump), "--name", "no-such-op"]) == 0
    assert "no records match" in capsys.readouterr().out


def test_show_on_a_missing_dump_exits_2_with_one_line(tmp_path, capsys):
    assert main(["show", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_convert_to_npy_widens_bfloat16_and_writes_an_index(tensor_dump, tmp_path):
    out = tmp_path / "npy"
    assert main(["convert", str(tensor_dump), str(out), "--to", "npy", "--name", "aten.neg"]) == 0
    index = json.loads((out / "index.json").read_text())
    entry = next(e for name, e in index.items() if name.endswith("aten.neg.default#0/output.0@step0"))
    assert entry["dtype"] == "bfloat16" and entry["saved_as"] == "float32"
    assert np.load(out / entry["file"]).tolist() == [-1.0] * 4


def test_convert_to_pt_keeps_the_dtype(tensor_dump, tmp_path):
    out = tmp_path / "pt"
    assert main(["convert", str(tensor_dump), str(out), "--to", "pt", "--name", "aten.neg"]) == 0
    index = json.loads((out / "index.json").read_text())
    tensor = torch.load(out / next(iter(index.values()))["file"], weights_only=True)
    assert tensor.dtype == torch.bfloat16


def test_convert_without_saved_tensors_is_a_usage_error(tmp_path, capsys):
    with torchdebug.dump(tmp_path / "dump"):
        torch.ones(2).exp()
    assert main(["convert", str(tmp_path / "dump"), str(tmp_path / "out"), "--to", "npy"]) == 2
    assert "no saved tensors" in capsys.readouterr().err


def test_config_schema_prints_json(capsys):
    assert main(["config", "schema"]) == 0
    assert "sample_stride" in json.loads(capsys.readouterr().out)["properties"]


def test_config_check_names_the_bad_key_in_one_line(tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L2"}))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "torchdebug config check: error: level: got 'L2', expected one of 'op', 'module', 'mix'"


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "torchdebug", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "show" in result.stdout


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "x", "y", "--to", "csv"])
    assert exit_info.value.code == 2


def test_no_tensors_compares_statistics():
    from torchdebug.cli import build_parser

    parser = build_parser()
    assert not parser.parse_args(["compare", "a", "b", "--no-tensors"]).tensors
    assert parser.parse_args(["compare", "a", "b"]).tensors
