"""Records as a pandas table and as Parquet: one row per record, statistics as columns."""

import json
import sys

import pytest
import torch

import torchdebug
from torchdebug.errors import MissingExtraError
from torchdebug.records import STAT_KEYS
from torchdebug.store._tables import RECORD_COLUMNS, records_frame, write_parquet

pd = pytest.importorskip("pandas")


@pytest.fixture
def run(tmp_path, tiny):
    with torchdebug.dump(tmp_path / "dump", model=tiny):
        tiny(torch.randn(2, 4)).sum().backward()
        torch.ones(3).pow(2)
    return torchdebug.load(tmp_path / "dump")


def test_a_run_becomes_one_row_per_record_with_statistics_as_columns(run):
    records = list(run.records())
    frame = run.to_pandas()
    assert tuple(frame.columns) == RECORD_COLUMNS and len(frame) == len(records)
    assert list(frame["name"]) == [r.name for r in records]
    assert set(frame["phase"]) == {"forward", "backward"} and set(frame["rank"]) == {0} and set(frame["step"]) == {0}
    first = next(i for i, r in enumerate(records) if r.stats)
    assert [frame[key][first] for key in STAT_KEYS] == pytest.approx([records[first].stats[key] for key in STAT_KEYS])
    assert frame["min"].dtype == "float64" and str(frame["nan"].dtype) == "Int64"


def test_a_count_a_record_predates_is_an_empty_integer_cell():
    from torchdebug.records import Record

    stats = {"min": 0.0, "max": 1.0, "mean": 0.5, "norm": 1.0, "nan": 0, "posinf": 0, "neginf": 0}
    old, new = (Record("a", 0, 0, "forward", "-", "op", 0, 0, "output", "0", stats=s) for s in (stats, {**stats, "zeros": 3}))
    frame = records_frame([old, new])
    assert str(frame["zeros"].dtype) == "Int64" and frame["zeros"].isna().tolist() == [True, False] and frame["zeros"][1] == 3


def test_a_rank_folder_gives_the_same_table_as_its_run(run):
    assert run.ranks[0].to_pandas().equals(run.to_pandas())


def test_non_tensor_arguments_are_json_text_and_have_no_statistics(run):
    frame = run.to_pandas()
    values = frame[frame["kind"] == "value"]
    assert len(values) and all(isinstance(json.loads(text), (int, float, list, str)) for text in values["value"])
    assert values["min"].isna().all() and values["nan"].isna().all()


def test_a_table_round_trips_through_parquet(run, tmp_path):
    pytest.importorskip("pyarrow")
    frame = run.to_pandas()
    back = pd.read_parquet(write_parquet(frame, tmp_path / "records.parquet"))
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    assert list(back["name"]) == list(frame["name"])
    assert back["norm"].equals(frame["norm"])
    assert [None if shape is None else list(shape) for shape in back["shape"]] == list(frame["shape"])


def test_without_pandas_the_error_names_the_extra_in_one_line(run, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    with pytest.raises(MissingExtraError, match=r"to_pandas needs pandas: pip install 'torchdebug\[pandas\]'") as error:
        records_frame(run.records())
    assert "\n" not in str(error.value) and isinstance(error.value, ImportError)


def test_every_record_field_has_a_column():
    import dataclasses

    from torchdebug.records import Record
    from torchdebug.store._tables import RECORD_COLUMNS

    spread = {"stats": "min", "tensor": "tensor_file"}  # fields spread over several columns
    for field in dataclasses.fields(Record):
        assert spread.get(field.name, field.name) in RECORD_COLUMNS, field.name
