"""Packed tables (report/packed.py): what goes in comes back, floats to 8 significant digits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.report.packed import unpack_text
from torchdebug.report.packed import pack


def test_strings_integers_and_floats_come_back_from_a_shared_string_table():
    floats = np.array([0.0, -2.5, 1 / 3, 1 - 1.2e-7, 1e-300, 3e300, math.inf, -math.inf, math.nan])
    tables = {
        "rows": {
            "name": ["a", "<b>", "a", "é", "", "a", "a", "a", "a"],
            "small": np.arange(9),
            "large": np.array([0, 70_000, 2**32 - 1, 5, 5, 5, 5, 5, 5]),
            "signed": np.array([-3, 2**31 - 1, -(2**31), 0, 0, 0, 0, 0, 0]),
            "value": floats,
        },
        "other": {"name": ["<b>", "c"]},
    }
    back = unpack_text(pack(tables))
    rows = back["rows"]
    assert rows["name"] == tables["rows"]["name"] and back["other"]["name"] == ["<b>", "c"]
    for column in ("small", "large", "signed"):
        assert rows[column] == tables["rows"][column].tolist()
    assert rows["value"] == pytest.approx(floats.tolist(), rel=1e-9, nan_ok=True)
    assert [f"{v:.8g}" for v in rows["value"]] == [f"{v:.8g}" for v in floats]  # a cosine's 8 digits


def test_an_empty_table_packs():
    assert unpack_text(pack({"rows": {"name": [], "value": np.zeros(0)}})) == {"rows": {"name": [], "value": []}}


def test_columns_of_different_lengths_or_integers_past_32_bits_are_refused():
    with pytest.raises(ValueError, match="'rows': columns of different lengths"):
        pack({"rows": {"a": ["x"], "b": np.zeros(2)}})
    with pytest.raises(ValueError, match="must fit int32 or uint32"):
        pack({"rows": {"a": np.array([-1, 2**32])}})
