"""Damaged tensor files: show and check name them (check's exit status stays about NaN/Inf), convert
skips them and converts the rest, report lists them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

import torchdebug
from torchdebug.cli import main
from torchdebug.cli.tensor_files import check_file


def _two_steps(path: Path, second: float = 2.0) -> Path:
    """A tensor dump of two steps, one safetensors file each; returns the rank folder."""
    debugger = torchdebug.Debugger(dump_path=path, task="tensor")
    for value in (2.0, second):
        debugger.start()
        torch.full((4, 4), value).neg()
        debugger.stop()
        debugger.step()
    debugger.close()
    (rank,) = torchdebug.load(path).ranks.values()
    return rank.path


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture
def damaged(tmp_path):
    """The dump with step 0's file cut in its data."""
    rank = _two_steps(tmp_path / "dump")
    file = rank / "tensors" / "step0-0000.safetensors"
    _truncate(file, file.stat().st_size - 10)
    return tmp_path / "dump"


def test_show_names_a_truncated_tensor_file_and_marks_its_records(damaged, capsys):
    assert main(["show", str(damaged), "--no-stack"]) == 0
    out, err = capsys.readouterr()
    assert "damaged tensor file tensors/step0-0000.safetensors (truncated: " in err
    assert "tensors in it cannot be read" in err and "step1" not in err
    (record,) = [
        r for r in torchdebug.load(damaged).ranks[0].records() if r.name == "forward/-/aten.neg.default#0/output.0" and not r.step
    ]
    assert f"[{record.tensor['key']}] (unreadable, damaged file: truncated" in out  # (a native dump's key: saved.<n>)


def test_check_warns_about_a_damaged_file_and_keeps_its_exit_status_about_nan_and_inf(damaged, tmp_path, capsys):
    assert main(["check", str(damaged)]) == 0
    out, err = capsys.readouterr()
    assert "no NaN or Inf" in out and "tensors/step0-0000.safetensors (truncated" in err

    rank = _two_steps(tmp_path / "nan", second=float("nan"))
    file = rank / "tensors" / "step0-0000.safetensors"
    _truncate(file, 4)
    assert main(["check", str(tmp_path / "nan")]) == 1
    out, err = capsys.readouterr()
    assert "first NaN/Inf at step 1" in out
    assert "tensors/step0-0000.safetensors (truncated: 4 bytes, no header)" in err


def test_quiet_silences_the_warning(damaged, capsys):
    assert main(["check", str(damaged), "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_convert_skips_a_damaged_file_naming_it_and_converts_the_others(damaged, tmp_path, capsys):
    out_dir = tmp_path / "npy"
    assert main(["convert", str(damaged), str(out_dir), "--to", "npy"]) == 0
    out, err = capsys.readouterr()
    assert "damaged tensor file tensors/step0-0000.safetensors (truncated" in err and "skipped" in err
    assert "skipped" in out
    index = json.loads((out_dir / "index.json").read_text())
    assert index and all(name.endswith("@step1") for name in index)


def test_convert_with_every_file_damaged_is_an_error_saying_why(damaged, tmp_path, capsys):
    (rank,) = torchdebug.load(damaged).ranks.values()
    (rank.path / "tensors" / "step1-0000.safetensors").unlink()
    assert main(["convert", str(damaged), str(tmp_path / "npy"), "--to", "pt"]) == 2
    err = capsys.readouterr().err
    assert "tensors/step1-0000.safetensors (missing)" in err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith("no saved tensor could be read: the 6 selected are in damaged files (see the warnings)")
    )


def test_report_lists_the_damaged_files(damaged, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", str(damaged), "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert 'id="damaged-0"' in html and "<code>tensors/step0-0000.safetensors</code>: truncated" in html


def _safetensors(path: Path, header: bytes, data: bytes) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_check_file_tells_what_is_wrong_from_the_header_alone(tmp_path):
    header = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    assert check_file(_safetensors(tmp_path / "ok.safetensors", header, b"\0" * 8)) is None
    assert check_file(_safetensors(tmp_path / "short.safetensors", header, b"\0" * 5)) == (
        f"truncated: {8 + len(header) + 5} of {8 + len(header) + 8} bytes"
    )
    assert check_file(_safetensors(tmp_path / "long.safetensors", header, b"\0" * 9)).startswith("1 bytes past the last tensor")
    assert check_file(_safetensors(tmp_path / "junk.safetensors", b"{not json", b"")) == "header is not valid JSON"
    assert check_file(tmp_path / "absent.safetensors") == "missing"
    (tmp_path / "cut.safetensors").write_bytes(struct.pack("<Q", 4096) + b"{}")
    assert check_file(tmp_path / "cut.safetensors").startswith("truncated in its header")


def test_the_files_torchdebug_writes_pass_the_check(tmp_path):
    rank = _two_steps(tmp_path / "dump")
    files = sorted((rank / "tensors").glob("*.safetensors"))
    assert len(files) == 2 and [check_file(file) for file in files] == [None, None]
