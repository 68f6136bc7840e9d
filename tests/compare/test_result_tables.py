"""CompareResult as a pandas table and as Parquet: the CSV's columns, one row per compared slot."""

import pytest
import torch

import torchdebug
from torchdebug.compare._result import CSV_COLUMNS

pd = pytest.importorskip("pandas")


def _dump(path, scale):
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    with torchdebug.dump(path, task="tensor"):
        (x * scale).exp().sum()


@pytest.fixture
def result(tmp_path):
    _dump(tmp_path / "a", 1.0)
    _dump(tmp_path / "b", 1.001)
    return torchdebug.compare(tmp_path / "a", tmp_path / "b")


def test_a_comparison_becomes_one_row_per_slot_with_the_csv_columns(result):
    frame = result.to_pandas()
    assert tuple(frame.columns) == CSV_COLUMNS and len(frame) == len(result.rows)
    assert frame["verdict"].value_counts().to_dict() == {k: v for k, v in result.counts().items() if v}
    assert list(frame["name"]) == [row.name for row in result.rows]
    assert frame.loc[frame["kind"] == "tensor", "cosine"].notna().all()


def test_a_comparison_round_trips_through_parquet(result, tmp_path):
    pytest.importorskip("pyarrow")
    back = pd.read_parquet(result.to_parquet(tmp_path / "rows.parquet"))
    frame = result.to_pandas()
    assert list(back.columns) == list(frame.columns) and list(back["verdict"]) == list(frame["verdict"])
    assert back["max_abs_err"].equals(frame["max_abs_err"])
