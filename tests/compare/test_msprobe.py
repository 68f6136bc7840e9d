"""msprobe dumps as either side of a compare (fixtures written by msprobe 26.2.0, level mix)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import torchdebug
from torchdebug.errors import DumpError
from torchdebug.store import _msprobe as msprobe

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msprobe"  # real msprobe dumps: see its README


def test_msprobe_keys_become_stable_names_with_modules_from_construct_json():
    records = msprobe.load(FIXTURES / "statistics_fp32").ranks[0].records()
    names = {record.name for record in records}
    assert "forward/fc1/Functional.linear#0/output.0" in names
    assert "forward/fc1/module#0/parameter.weight" in names
    assert "backward/fc1/module#0/parameter_grad.weight" in names
    assert "forward/-/Functional.gelu#0/input.0" in names


def test_msprobe_stacks_and_source_lines_point_at_user_code():
    dump = msprobe.load(FIXTURES / "statistics_fp32").ranks[0]
    record = next(r for r in dump.records() if r.op == "Functional.linear")
    assert record.source.endswith("make_msprobe_fixtures.py:22 in forward")
    assert dump.stack(record)[0].startswith('File "/home/user/make_msprobe_fixtures.py"')


def test_msprobe_tensors_load_from_the_folder_holding_dump_json():
    dump = msprobe.load(FIXTURES / "tensor_bf16" / "step0").ranks[0]
    record = next(r for r in dump.records() if r.name == "forward/fc1/Functional.linear#0/output.0")
    assert tuple(dump.load_tensor(record).shape) == (4, 32)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_msprobe_bf16_against_fp32_has_no_error_rows(task):
    result = torchdebug.compare(FIXTURES / f"{task}_bf16", FIXTURES / f"{task}_fp32")
    assert result.counts()["error"] == 0
    assert result.counts()["unmatched"] == 0
    assert not result.diverged


def test_an_msprobe_dump_compared_with_itself_is_all_pass():
    result = torchdebug.compare(FIXTURES / "tensor_fp32", FIXTURES / "tensor_fp32")
    assert {row.verdict for row in result.rows} == {"pass"}
    assert "cosine" in next(row for row in result.rows if row.kind == "tensor").metrics


def test_an_msprobe_dump_json_cut_short_is_a_clear_dump_error(tmp_path):
    folder = tmp_path / "step0" / "proc1"
    shutil.copytree(next((FIXTURES / "statistics_fp32" / "step0").iterdir()), folder)
    text = (folder / "dump.json").read_text()
    (folder / "dump.json").write_text(text[: len(text) // 2])
    with pytest.raises(DumpError, match="truncated or damaged"):
        torchdebug.compare(tmp_path, FIXTURES / "statistics_fp32")


def test_two_process_folders_in_one_step_are_refused_with_the_fix(tmp_path):
    source = next((FIXTURES / "statistics_fp32" / "step0").iterdir())
    for name in ("proc1", "proc2"):
        shutil.copytree(source, tmp_path / "step0" / name)
    with pytest.raises(DumpError, match="ran twice into the same dump path"):
        msprobe.load(tmp_path)
