"""Verdicts and attribution on hand-made rows."""

from __future__ import annotations

from fractions import Fraction

import pytest

from torchdebug.compare._rows import Row
from torchdebug.compare._verdicts import first_divergence, judge
from torchdebug.records import Record, make_name


def _row(
    io: str,
    error: float | None,
    *,
    seq: int = 0,
    kind: str = "tensor",
    value: object = None,
    value_b: object = None,
    failed: str | None = None,
    op: str = "aten.mul.Tensor",
) -> Row:
    def record(v: object, err: str | None) -> Record:
        name = make_name("forward", "m", op, seq, io, "0")
        return Record(
            name=name,
            step=0,
            rank=0,
            phase="forward",
            module="m",
            op=op,
            call=seq,
            seq=seq,
            io=io,
            arg="0",
            kind=kind,
            dtype="float32",
            shape=[4],
            value=v,
            capture_error=err,
        )

    row = Row.from_records(0, record(value, None), record(value_b if value_b is not None else value, failed), "exact", seq)
    row.difference, row.tolerance = error, (1e-3 if error is not None else None)
    if error is not None:
        row.metrics["max_rel_err"] = error
    return row


def test_an_output_whose_inputs_explain_its_error_is_inherited():
    rows = [_row("input", 0.01), _row("output", 0.05)]
    judge(rows, growth=16)
    assert [(r.verdict, r.attribution) for r in rows] == [("error", "blamed"), ("warning", "inherited")]


def test_an_output_that_grows_the_error_beyond_its_inputs_is_blamed():
    rows = [_row("input", 0.0), _row("output", 0.05)]
    judge(rows, growth=16)
    assert rows[1].attribution == "blamed" and rows[1].verdict == "error"
    assert first_divergence(rows) is rows[1]


def test_errors_within_tolerance_pass():
    rows = [_row("input", 0.0), _row("output", 5e-4)]
    judge(rows)
    assert {r.verdict for r in rows} == {"pass"}


def test_object_reprs_that_differ_only_by_address_are_equal():
    rows = [_row("input", None, kind="value", value="<Generator at 0x7f01>", value_b="<Generator at 0x7f99>")]
    judge(rows)
    assert rows[0].verdict == "pass"


def test_a_different_argument_value_is_a_warning():
    rows = [_row("input", None, kind="value", value=1.0, value_b=1.5)]
    judge(rows)
    assert rows[0].verdict == "warning" and "1.0 vs 1.5" in rows[0].message


def test_a_slot_that_failed_to_capture_is_a_warning_naming_the_side():
    rows = [_row("output", 0.0, failed="out of memory")]
    judge(rows)
    assert rows[0].verdict == "warning" and rows[0].message == "not captured on B: out of memory"


def test_an_op_singular_near_zero_inherits_an_error_within_its_inputs_relative_spread():
    def call(op: str) -> list[Row]:
        rows = [_row("input", 0.001, op=op), _row("output", 0.1, op=op)]
        rows[0].metrics["max_rel_err"] = 0.5  # near-zero elements of the input differ by up to 50 %
        judge(rows, growth=16)
        return rows

    sqrt, mul = call("aten.sqrt.default"), call("aten.mul.Tensor")
    assert (sqrt[1].verdict, sqrt[1].attribution) == ("pass", "inherited")  # drift, nothing blamed upstream
    assert (mul[1].verdict, mul[1].attribution) == ("error", "blamed")


def test_a_slot_that_failed_to_capture_on_both_sides_names_both():
    row = _row("output", 0.0, failed="out of memory")
    row.record_a.capture_error = "no space"
    judge([row])
    assert row.message == "not captured on A: no space; B: out of memory"


def test_every_error_row_has_an_error_and_says_what_differs():
    # a shape of another program (no data input behind it) and a NaN seen through statistics only
    reshaped = _row("output", None)
    reshaped.shape_a = reshaped.record_a.shape = [8]
    nan = _row("output", None, seq=1)
    nan.metrics["nonfinite_mismatch"] = 1.0
    rows = [reshaped, nan]
    judge(rows)
    assert [row.verdict for row in rows] == ["error", "error"]
    assert all(row.difference == float("inf") for row in rows)
    assert reshaped.message == "shape differs: [8] vs [4]"
    assert nan.message == "NaN/Inf where the other side is finite"


def test_sizes_that_change_as_the_world_sizes_do_are_incomparable_not_errors():
    # A: one process with the whole batch of 8; B: a rank of two with its 4 (no data input dumped:
    # the blocks of a graph dump); a size changed by another ratio stays an error
    def reshaped(seq: int, size: int) -> Row:
        row = _row("output", None, seq=seq)
        row.shape_a = row.record_a.shape = [size]
        return row

    split, other = reshaped(0, 8), reshaped(1, 12)
    judge([split, other], split=Fraction(1, 2))
    assert split.verdict == "incomparable" and "world sizes do (1:2)" in split.message
    assert other.verdict == "error"
    again = reshaped(0, 8)
    judge([again])
    assert again.verdict == "error"


def test_row_error_is_the_former_name_of_row_difference_and_warns_naming_it():
    row = _row("output", 0.05)
    with pytest.warns(FutureWarning, match="Row.error is deprecated; read Row.difference"):
        assert row.error == 0.05
    with pytest.warns(FutureWarning, match="set Row.difference"):
        row.error = 0.5
    assert row.difference == 0.5
