"""The eager dump page: an overview aggregated from the records (never one row per record), the
largest magnitudes, per-module statistics with a plot, and the NaN/Inf slots capped."""

from __future__ import annotations

import math
import re

from tests.report.hostile import HOSTILE
from torchdebug.records import Record, make_name
from torchdebug.report import dump as page


def _record(
    seq: int, module: str, *, phase="forward", io="output", value=1.0, dtype="float32", step=0, op="aten.mul.Tensor", **stats
):
    """A record whose tensor holds values between -``value`` and ``value`` (statistics as given)."""
    name = make_name(phase, module, op, seq, io, "0")
    full = {"min": -value, "max": value, "mean": 0.0, "norm": abs(value), "nan": 0, "posinf": 0, "neginf": 0, **stats}
    return Record(name, step, 0, phase, module, op, seq, seq, io, "0", dtype=dtype, shape=[2, 2], stats=full)


def _rank(records: list[Record]) -> dict:
    overflows, more = page.overflow_rows(records)
    return {
        "rank": 0,
        "task": "statistics",
        "complete": True,
        "records": len(records),
        "first": None,
        "overflows": overflows,
        "more_overflows": more,
        "damaged": [],
        "overview": page.overview(records),
    }


def test_phases_count_records_op_calls_and_slots_with_nan_or_inf():
    records = [
        _record(0, "fc", io="input"),
        _record(0, "fc"),
        _record(1, "fc", posinf=1, value=math.inf),
        _record(2, "fc", phase="backward"),
        _record(3, "-", phase="optimizer"),
    ]
    records[0].stats = None  # a slot without statistics still counts as a record
    phases = {row["phase"]: row for row in page.overview(records)["phases"]}
    assert list(phases) == ["forward", "backward", "optimizer"]
    assert (phases["forward"]["records"], phases["forward"]["calls"], phases["forward"]["stats"]) == (3, 2, 2)
    assert phases["forward"]["nonfinite"] == 1 and phases["forward"]["largest"] == math.inf
    assert phases["backward"]["records"] == phases["optimizer"]["records"] == 1


def test_largest_magnitudes_are_finite_floating_distinct_tensors_biggest_first():
    records = [
        _record(0, "a", value=3.0),
        _record(1, "a", io="input", value=3.0),  # the same tensor read by the next op: listed once
        _record(2, "a", io="output", value=3.0, op="aten.view.default"),  # a view of it: reshaped below
        _record(1, "a", value=500.0),
        _record(2, "b", value=math.inf, posinf=1),  # listed with the NaN/Inf slots instead
        _record(3, "b", value=7000.0, dtype="int64"),  # token ids, not magnitudes
        _record(4, "b", value=20.0, dtype="bfloat16"),
        _record(5, "b", value=20.0, min=-1.0, max=20.0),
    ]
    records[2].shape = [4]
    largest = page.overview(records)["largest"]
    assert [(slot["name"], slot["magnitude"]) for slot in largest] == [
        (records[3].name, 500.0),
        (records[6].name, 20.0),
        (records[7].name, 20.0),
        (records[0].name, 3.0),
    ]


def test_largest_magnitudes_keep_the_top_ones_only():
    records = [_record(seq, "m", value=float(seq + 1)) for seq in range(100)]
    largest = page.overview(records, largest=5)["largest"]
    assert [slot["magnitude"] for slot in largest] == [100.0, 99.0, 98.0, 97.0, 96.0]


def test_modules_in_order_of_first_use_with_their_largest_values_per_phase():
    records = [
        _record(0, "enc", value=2.0),
        _record(1, "dec", value=8.0, norm=11.0),
        _record(2, "dec", phase="backward", value=0.5),
        _record(3, "enc", phase="backward", value=4.0, nan=1),
    ]
    modules = page.overview(records)["modules"]
    assert [row["module"] for row in modules] == ["enc", "dec"]
    enc, dec = modules
    assert enc["records"] == 2 and enc["calls"] == 2 and enc["phases"] == {"forward": 1, "backward": 1}
    assert enc["largest"]["backward"] == {"value": 4.0, "slot": records[3].name} and enc["nonfinite"] == 1
    assert dec["largest"]["forward"]["value"] == 8.0 and dec["norm"] == {"value": 11.0, "slot": records[1].name}


def test_modules_past_the_cap_are_counted_not_listed(monkeypatch):
    monkeypatch.setattr(page, "MAX_MODULES", 3)
    overview = page.overview([_record(seq, f"m{seq}") for seq in range(10)])
    assert len(overview["modules"]) == 3 and overview["more_modules"] == 7


def test_nan_and_inf_slots_are_listed_up_to_a_cap_and_counted_beyond():
    records = [_record(seq, "m", nan=1) for seq in range(30)]
    rows, more = page.overflow_rows(records, limit=10)
    assert len(rows) == 10 and more == 20 and rows[0]["nan"] == 1


def test_the_page_size_follows_the_modules_not_the_records():
    def html(calls: int) -> str:
        records = [_record(seq, f"layers.{seq % 20}", value=1.0 + seq % 7) for seq in range(calls)]
        return page.render_dump(path="dump", ranks=[_rank(records)])

    small, large = html(1_000), html(50_000)
    assert abs(len(large) - len(small)) < 2_000  # a few wider numbers, no more rows
    assert len(re.findall(r"aten\.mul\.Tensor#\d+", large)) < 100


def test_the_page_shows_phases_largest_magnitudes_and_the_module_plot_and_table():
    records = [_record(seq, f"layers.{seq}", value=10.0**seq) for seq in range(4)]
    records.append(_record(9, "layers.0", phase="backward", value=0.25))
    html = page.render_dump(path="dump", ranks=[_rank(records)])
    for part in ('id="phases-0"', 'id="largest-0"', 'id="module-plot-0"', 'id="modules-0"', "Largest finite magnitudes"):
        assert part in html
    assert len(re.findall(r'<circle class="dot-forward"', html)) == 4
    assert len(re.findall(r'<circle class="dot-backward"', html)) == 1
    assert ">1e3</text>" in html and ">1e-1</text>" in html  # the log axis spans the values
    assert "no NaN or Inf in the statistics of this rank" in html and "overflows-0" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html) and "<script src=" not in html


def test_an_infinite_module_value_sits_on_a_labelled_top_line():
    records = [_record(0, "attn", value=math.inf, neginf=1), _record(1, "mlp", value=2.0)]
    html = page.render_dump(path="dump", ranks=[_rank(records)])
    assert ">inf</text>" in html and 'id="overflows-0"' in html
    assert "1 slot holds an infinity an op was given" in html  # first is None: given, not made


def test_a_page_of_zeros_and_values_without_numbers_renders():
    records = [_record(0, "a", value=0.0), _record(1, "b", min=None, max=None, mean=None, norm=None, nan=4)]
    html = page.render_dump(path="dump", ranks=[_rank(records)])
    assert 'id="module-plot-0"' in html


def test_module_and_slot_names_reach_the_page_escaped():
    records = [_record(0, HOSTILE, value=5.0)]
    html = page.render_dump(path=HOSTILE, ranks=[_rank(records)])
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
