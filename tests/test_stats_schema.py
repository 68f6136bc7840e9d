"""The statistics schema: every path writes its columns, in its order, and the record's statistics
are its keys; the kernels are checked against it when they load."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchdebug.graph_dump._plan import ACCUMULATORS
from torchdebug.graph_dump._runtime import host_stats
from torchdebug.native import fused_stats
from torchdebug.stats import cpu_sums, device_sums, empty_stats, stats_from_sums, tensor_stats
from torchdebug.stats._schema import COLUMNS, COUNT_KEYS, IDENTITY, STAT_KEYS, VALUE_KEYS, WIDTH, stats_array_from_sums
from torchdebug.stats_table import _Table


def test_every_path_writes_one_column_per_accumulator():
    x = torch.randn(33)
    assert device_sums(x).shape == (WIDTH,)
    assert len(cpu_sums(x)) == WIDTH
    assert _Table(torch.device("cpu")).values.shape[1] == WIDTH
    assert ACCUMULATORS[:WIDTH] == COLUMNS and ACCUMULATORS[WIDTH:] == ("valid",)
    assert host_stats([x, torch.empty(0)]).shape == (2 * len(ACCUMULATORS),)
    if fused_stats.available():
        assert len(fused_stats.fused_stats(x)) == WIDTH


def test_statistics_are_the_schemas_keys_in_order():
    assert STAT_KEYS == (*VALUE_KEYS, *COUNT_KEYS)
    assert tuple(tensor_stats(torch.randn(5))) == STAT_KEYS
    assert tuple(empty_stats()) == STAT_KEYS
    assert empty_stats() == stats_from_sums(IDENTITY, 0)
    assert all(empty_stats()[key] is None for key in VALUE_KEYS) and all(empty_stats()[key] == 0 for key in COUNT_KEYS)


def test_sums_are_finished_into_mean_and_norm_of_the_values_that_are_not_nan():
    sums = dict.fromkeys(COLUMNS, 0.0) | {"min": -1.0, "max": 3.0, "sum": 4.0, "squares": 16.0, "nan": 2.0}
    stats = stats_from_sums([sums[c] for c in COLUMNS], numel=6)
    assert (stats["min"], stats["max"], stats["mean"], stats["norm"], stats["nan"]) == (-1.0, 3.0, 1.0, 4.0, 2)
    assert all(isinstance(stats[key], int) for key in COUNT_KEYS)
    integral = stats_from_sums([sums[c] for c in COLUMNS], numel=6, integral=True)
    assert (integral["min"], integral["max"]) == (-1, 3) and isinstance(integral["min"], int)


def test_a_native_library_that_writes_other_columns_is_refused(monkeypatch):
    if not fused_stats.available():
        pytest.skip("no C compiler: the native kernel is not built here")
    monkeypatch.setattr(fused_stats, "COLUMNS", (*COLUMNS, "absmax"))
    fused_stats._kernels.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="the schema has min,max"):
            fused_stats._kernels()
    finally:
        monkeypatch.undo()
        fused_stats._kernels.cache_clear()
    assert fused_stats.available()


def test_the_schema_and_the_record_import_without_torch():
    code = "import sys, torchdebug.records, torchdebug.stats._schema; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_stats_array_from_sums_finishes_as_stats_from_sums_does() -> None:
    """The flight recorder finishes a step's sums in one vectorised call: the same numbers as the
    dict, NaN for its ``None``, and NaN everywhere in a row never written."""
    rows = [
        ([-2.0, 3.0, 4.0, 29.0, 0, 0, 0, 1], 4),  # plain values, one zero
        ([-1.0, math.inf, math.inf, math.inf, 1, 1, 0, 0], 3),  # an Inf and a NaN
        ([math.nan, math.nan, 0.0, 0.0, 5, 0, 0, 0], 5),  # every element NaN: no value
        (list(IDENTITY), 0),  # an empty tensor
    ]
    sums = np.array([r for r, _ in rows] + [[math.nan] * len(IDENTITY)])
    numel = np.array([n for _, n in rows] + [0])
    finished = stats_array_from_sums(sums, numel)
    for (row, count), got in zip(rows, finished):
        want = stats_from_sums(row, count)
        assert [math.nan if want[k] is None else want[k] for k in STAT_KEYS] == pytest.approx(list(got), nan_ok=True)
    assert np.isnan(finished[-1]).all()
