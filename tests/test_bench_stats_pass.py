"""``bench/stats_pass.py --view transposed``: the layout it times is the one its docstring names
(attention's transposed keys, whose fingerprint walk has rows of 64 elements), and sizes it cannot
lay out so are refused before anything runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from torchdebug.native import fused_stats


def _bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "stats_pass.py"
    spec = importlib.util.spec_from_file_location("stats_pass", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_transposed_view_is_read_in_rows_of_64_out_of_logical_order():
    bench = _bench()
    flat = torch.arange(2 * bench.TRANSPOSED_BLOCK, dtype=torch.float32)
    assert bench.VIEWS["contiguous"](flat) is flat
    view = bench.VIEWS["transposed"](flat)
    assert view.shape == (2, 64, 128) and not view.is_contiguous()
    assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()  # no copy: the walk reads the view
    sizes, strides, positions = fused_stats._ordered_runs(view)
    assert (sizes[-1], strides[-1], positions[-1]) == (64, 1, 128)  # rows of 64 in memory, 128 apart in logical order


def test_a_size_the_transposed_view_cannot_take_is_refused(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["stats_pass.py", "--view", "transposed", "--sizes", "1000"])
    with pytest.raises(SystemExit):
        bench.main()
    assert f"--view transposed: every size must be a multiple of {bench.TRANSPOSED_BLOCK} elements" in capsys.readouterr().err
