"""Each verdict rule of ``compare.rules.RULES`` on small hand-made rows, and the documented order.

A test is named ``test_<rule>_...`` after the rule it is about: ``test_every_rule_has_a_test_of_its_own``
checks that each rule has one. Rows are built in execution order; ``judge`` runs every rule in order,
so each test also shows that the rules before its own leave the row to it.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from torchdebug.compare import _verdicts
from torchdebug.compare._rows import Row
from torchdebug.compare._rules import PLAIN_BEYOND_SKIPS, PLAIN_PASS_SKIPS, RULES
from torchdebug.compare._tolerances import rounding_tolerance
from torchdebug.compare._verdicts import first_divergence, judge
from torchdebug.records import Record, make_name

_ORDER = itertools.count()
_DOC = Path(__file__).resolve().parents[2] / "docs" / "compare.md"


def _record(io: str, call: int, op: str, arg: str, fields: dict[str, Any]) -> Record:
    return Record(
        name=make_name("forward", "m", op, call, io, arg),
        step=0,
        rank=0,
        phase="forward",
        module="m",
        op=op,
        call=call,
        seq=call,
        io=io,
        arg=arg,
        **{"dtype": "float32", "shape": [4], **fields},
    )


def _row(
    io: str,
    error: float | None = None,
    *,
    call: int = 0,
    op: str = "aten.mul.Tensor",
    arg: str = "0",
    a: dict[str, Any] | None = None,
    b: dict[str, Any] | None = None,
    only: str | None = None,
    metrics: dict[str, float] | None = None,
    **both: Any,
) -> Row:
    """A row of slot ``io.arg`` of call ``call``: ``both`` are record fields of the two sides, ``a``
    and ``b`` one side's; ``only="a"`` or ``"b"``: a slot of that side alone."""
    record_a = _record(io, call, op, arg, {**both, **(a or {})}) if only != "b" else None
    record_b = _record(io, call, op, arg, {**both, **(b or {})}) if only != "a" else None
    row = Row.from_records(0, record_a, record_b, "exact" if only is None else f"only_{only}", next(_ORDER))
    row.difference, row.tolerance = error, (1e-3 if error is not None else None)
    row.metrics.update(metrics or {})
    return row


def _stats(value: float) -> dict[str, float]:
    """Statistics that identify one tensor (producers link an input to the output holding them)."""
    return {"min": -value, "max": value, "mean": 0.0, "norm": value}


def _judged(row: Row) -> tuple[str, str]:
    return row.verdict, row.attribution


# --- every slot ---------------------------------------------------------------------------------------


def test_unmatched_rows_are_listed_with_the_side_that_has_them():
    only_a = _row("output", only="a", capture_error="out of memory")  # not compared, so not a capture warning
    only_b = _row("output", call=1, only="b")
    judge([only_a, only_b])
    assert (only_a.verdict, only_a.message) == ("unmatched", "only in A")
    assert (only_b.verdict, only_b.message) == ("unmatched", "only in B")


def test_not_captured_names_the_side_and_why_even_when_the_error_is_large():
    row = _row("output", 0.5, b={"capture_error": "out of memory"})
    judge([row])
    assert (row.verdict, row.message) == ("warning", "not captured on B: out of memory")


# --- tensor slots ---------------------------------------------------------------------------------------


def test_one_piece_of_a_split_dtensor_cannot_be_compared():
    row = _row("output", 0.5, a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}})
    judge([row])
    assert (row.verdict, row.message) == ("incomparable", "not comparable: A holds one Shard(0) piece of 2")


def test_shape_follows_inputs_when_sizes_change_by_the_world_sizes_ratio():
    row = _row("output", a={"shape": [8]})
    judge([row], split=Fraction(1, 2))
    assert row.verdict == "incomparable" and "world sizes do (1:2)" in row.message


def _topk(indices_a: float, indices_b: float, **indices: Any) -> list[Row]:
    """A ``topk`` call whose scores agree and whose indices hold ``indices_a`` / ``indices_b``."""
    op = "aten.topk.default"
    scores = _row("input", 1e-4, op=op)
    values = _row("output", 1e-4, op=op, arg="0")
    ints = {"dtype": "int64", "a": {"stats": _stats(indices_a)}, "b": {"stats": _stats(indices_b)}}
    return [scores, values, _row("output", 0.25, op=op, arg="1", **ints, **indices)]


def test_decision_changed_an_integer_result_that_differs_on_inputs_that_agree_is_blamed():
    rows = _topk(2.0, 3.0, metrics={"elements_differ": 1.0})
    judge(rows)
    indices = rows[2]
    assert _judged(indices) == ("error", "blamed") and first_divergence(rows) is indices
    assert indices.message.startswith("the routing changed here: 1 of 4 elements differ; its inputs agree")
    assert _judged(rows[1]) == ("pass", "")  # the values agree


def test_decision_changed_is_not_blamed_when_the_scores_already_differ():
    rows = _topk(2.0, 3.0)
    rows[0].difference = 0.01  # beyond tolerance: the scores differ before the choice
    judge(rows)
    assert rows[2].attribution != "blamed" and "routing changed here" not in rows[2].message


def test_follows_changed_decision_what_is_computed_from_changed_indices_is_inherited_whatever_its_shape():
    rows = _topk(2.0, 3.0)
    picked = _row(
        "input", 0.25, call=1, op="aten.index.Tensor", dtype="int64", a={"stats": _stats(2.0)}, b={"stats": _stats(3.0)}
    )
    gathered = _row("output", None, call=1, op="aten.index.Tensor", a={"shape": [3]})
    judge([*rows, picked, gathered])
    for row in (picked, gathered):
        assert _judged(row) == ("warning", "inherited") and f"follows the routing changed at {rows[2].name}" in row.message
    assert gathered.message.startswith("shape [3] vs [4]") and first_divergence([*rows, picked, gathered]) is rows[2]


def test_other_shape_is_blamed_with_an_infinite_error():
    row = _row("output", 0.0, a={"shape": [8]})
    judge([row])
    assert _judged(row) == ("error", "blamed") and row.difference == math.inf
    assert row.message == "shape differs: [8] vs [4]"


def test_computed_from_incomparable_inputs_an_output_that_differs_cannot_be_compared():
    piece = _row("input", 0.5, a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}})
    out = _row("output", 0.5)
    judge([piece, out])
    assert out.verdict == "incomparable"
    assert out.message == f"not comparable: computed from values that cannot be compared ({piece.name})"


def test_nonfinite_inherited_when_an_input_already_had_the_nan():
    nan_in = _row("input", 1.0, metrics={"nonfinite_mismatch": 1.0})
    nan_out = _row("output", 1.0, metrics={"nonfinite_mismatch": 1.0})
    judge([nan_in, nan_out])
    assert _judged(nan_in) == ("error", "blamed")  # an input no op made: where it first appears
    assert _judged(nan_out) == ("warning", "inherited")
    assert nan_out.message == "NaN/Inf where the other side is finite (inputs had it)"


def test_nonfinite_origin_is_blamed_where_no_input_had_it_and_counts_as_infinite_upstream():
    healthy = _row("input", 0.0)
    nan = _row("output", None, metrics={"nonfinite_mismatch": 1.0})
    later = _row("input", 0.5, call=1)  # no producer: compared with the error seen upstream
    judge([healthy, nan, later])
    assert _judged(nan) == ("error", "blamed") and nan.difference == math.inf
    assert first_divergence([healthy, nan, later]) is nan
    assert _judged(later) == ("pass", "inherited") and "upstream ops already differ" in later.message


def test_no_statistics_passes_and_says_so():
    row = _row("output", None)
    judge([row])
    assert (row.verdict, row.attribution, row.message) == ("pass", "", "no statistics to compare")
    unused = _row("output", None, call=1, b={"extra": {"unread": "never materialised"}})  # a graph's unused output
    judge([unused])
    assert (unused.verdict, unused.message) == ("pass", "no statistics to compare (not read on B: never materialised)")


def test_within_tolerance_passes_without_a_message():
    row = _row("output", 5e-4)
    judge([row])
    assert (row.verdict, row.attribution, row.message) == ("pass", "", "")


def test_within_tolerance_waits_for_the_rules_before_it_even_for_a_small_difference():
    """judge passes most rows without trying the rules before within_tolerance: never one of these."""
    cases = [
        (_row("output", 5e-4, b={"capture_error": "out of memory"}), "warning"),
        (_row("output", 5e-4, a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}}), "incomparable"),
        (_row("output", 5e-4, a={"shape": [8]}), "error"),
        (_row("output", 5e-4, metrics={"nonfinite_mismatch": 1.0}), "error"),
    ]
    for row, _ in cases:
        judge([row])
    assert [row.verdict for row, _ in cases] == [verdict for _, verdict in cases]


def test_within_tolerance_skips_on_plain_rows_exactly_the_tensor_rules_before_it():
    """A rule put before within_tolerance must be added to what plainly_comparable checks."""
    before = itertools.takewhile(lambda rule: rule.name != "within_tolerance", RULES)
    assert tuple(rule.name for rule in before if rule.slots & {"input", "output"}) == PLAIN_PASS_SKIPS


def test_rules_skipped_on_plain_rows_beyond_tolerance_answer_nothing_there(monkeypatch):
    """judge leaves PLAIN_BEYOND_SKIPS out for a plainly comparable slot beyond its tolerance: tried
    anyway, on such an input and output, each of them answers nothing."""
    answers: dict[str, list[object]] = {}

    def asked(rule):
        def judge_row(row, call):
            answer = rule.judge(row, call)
            answers.setdefault(rule.name, []).append(answer)
            return answer

        return judge_row

    every = {
        is_output: tuple(asked(rule) for rule in RULES if slot in rule.slots)
        for is_output, slot in ((False, "input"), (True, "output"))
    }
    monkeypatch.setattr(_verdicts, "_PLAINLY_BEYOND", every)
    made = _row("output", 0.5, call=0, a={"stats": _stats(1.0)}, b={"stats": _stats(1.1)})
    read = _row("input", 0.5, call=1, a={"stats": _stats(1.0)}, b={"stats": _stats(1.1)})
    out = _row("output", 0.5, call=1, a={"stats": _stats(2.0)}, b={"stats": _stats(2.5)})
    judge([made, read, out])
    assert {name: len(found) for name, found in answers.items() if name in PLAIN_BEYOND_SKIPS} == dict.fromkeys(
        PLAIN_BEYOND_SKIPS, 3
    )
    assert all(answer is None for name in PLAIN_BEYOND_SKIPS for answer in answers[name])
    assert [row.verdict for row in (made, read, out)] != ["pass"] * 3  # beyond tolerance: the other rules judged them


def test_replicate_partitioned_a_replicated_bias_against_it_divided_by_the_mesh_size_passes():
    """RowwiseParallel's bias: eager records the replicated DTensor, a compiled graph its share."""
    replicated = {"extra": {"subclass": "DTensor", "placements": ["R"], "mesh": [2], "mesh_coordinate": [0]}}
    bias = {"min": -0.5, "max": 0.25, "mean": 0.125, "norm": 1.5}
    share = {key: value / 2 for key, value in bias.items()}
    split = _row("input", 0.5, a={**replicated, "stats": bias}, b={"stats": share})
    judge([split])
    assert split.verdict == "pass" and "divided by the mesh size 2" in split.message and split.difference == 0.0
    other = _row("input", 0.5, call=1, a={**replicated, "stats": bias}, b={"stats": {k: v / 3 for k, v in bias.items()}})
    plain = _row("input", 0.5, call=2, a={"stats": bias}, b={"stats": share})  # no DTensor: a real difference
    for row in (other, plain):
        judge([row])
        assert _judged(row) == ("error", "blamed")


def test_sharded_embedding_indices_global_against_local_indices_cannot_be_compared():
    """A vocabulary-sharded embedding: eager records the DTensor op's global indices, a compiled
    graph the local ones DTensor computes from them inside the op."""
    replicated = {"extra": {"subclass": "DTensor", "placements": ["R"], "mesh": [2], "mesh_coordinate": [1]}}
    ids = {"dtype": "int64", "shape": [2, 8]}
    indices = _row("input", 2.0, op="aten.embedding.default", arg="1", a={**replicated, **ids}, b=ids)
    judge([indices])
    assert indices.verdict == "incomparable" and "local indices of a vocabulary-sharded embedding" in indices.message
    weight = _row("input", 2.0, call=1, op="aten.embedding.default", a=replicated, b={})  # the table: compared
    plain = _row("input", 2.0, call=2, op="aten.embedding.default", arg="1", a=ids, b=ids)  # no DTensor: compared
    for row in (weight, plain):
        judge([row])
        assert _judged(row) == ("error", "blamed")


# --- outputs beyond tolerance ---------------------------------------------------------------------------


def test_constant_from_arguments_differing_with_the_dtype_passes():
    low = {"float32": torch.finfo(torch.float32).min, "bfloat16": torch.finfo(torch.bfloat16).min}
    fill = _row("input", kind="value", arg="1", op="aten.full.default", a={"value": low["bfloat16"]}, b={"value": low["float32"]})
    out = _row("output", 0.5, op="aten.full.default")
    within = _row("output", 5e-4, op="aten.full.default", arg="1")
    judge([fill, out, within])
    assert _judged(fill) == ("pass", "dtype")
    assert _judged(out) == ("pass", "dtype") and "a constant made from arguments alone" in out.message
    assert _judged(within) == ("pass", "")  # within tolerance first


def _rerun(own_a: float, own_b: float, **fields: Any) -> Row:
    """A bf16 output rerun on both sides, whose own errors are given in rounding tolerances."""
    tolerance = rounding_tolerance("bfloat16")
    assert tolerance is not None
    metrics = {"own_err_a": own_a * tolerance, "own_err_b": own_b * tolerance, "cosine": 1.0}
    return _row("output", 0.05, dtype="bfloat16", metrics=metrics, **fields)


def test_called_differently_blames_a_healthy_rerun_whose_argument_values_differ():
    tensor = _row("input", 0.0, dtype="bfloat16")
    alpha = _row("input", kind="value", arg="alpha", a={"value": 1.0}, b={"value": 2.0})
    out = _rerun(0.3, 0.2)
    judge([tensor, alpha, out], rerun=True)
    assert _judged(out) == ("error", "blamed")
    assert out.message.endswith("but its argument value differs: 1.0 vs 2.0: the op was called differently")


def test_rerun_own_error_blames_decides_not_or_clears_an_output_by_its_own_error():
    verdicts = {}
    for own, case in ((3.0, "beyond twice"), (1.5, "between one and two"), (0.3, "rounding")):
        tensor = _row("input", 0.01, dtype="bfloat16")  # blamed, and would explain the output by statistics
        out = _rerun(own, 0.2)  # side A decides (and is named)
        judge([tensor, out], rerun=True)
        verdicts[case] = _judged(out)
        assert "vs fp64 rerun on side A" in out.message
    assert verdicts == {
        "beyond twice": ("error", "blamed"),
        "between one and two": ("undecided", "undecided"),
        "rounding": ("warning", "inherited"),  # healthy: it carries its input's blame
    }


def test_explained_by_inputs_an_output_carries_the_blame_of_its_input():
    given = _row("input", 0.01)
    out = _row("output", 0.05)
    judge([given, out], growth=16)
    assert _judged(given) == ("error", "blamed")
    assert _judged(out) == ("warning", "inherited")
    assert "explained by its inputs (difference 0.01)" in out.message
    assert f"carries the difference blamed on {given.name}" in out.message


def test_moves_its_input_a_part_of_an_input_that_differs_inherits_its_difference():
    """The statistics of one output of a split may differ far more than those of the whole input
    (the part holds none of the input's extremes): a split changes no element, so the difference is
    its input's. Another op, or the same op called with another argument, is judged on."""

    def output_of(op: str, arguments: tuple[int, int] = (1, 1), difference: float = 0.002) -> Row:
        given = _row("input", difference, op=op)  # beyond the tolerance, 0.001: blamed, nothing upstream
        size = _row("input", kind="value", op=op, arg="1", a={"value": arguments[0]}, b={"value": arguments[1]})
        out = _row("output", 0.1, op=op)  # 50 times the input's difference: beyond the growth
        judge([given, size, out], growth=16)
        return out

    out = output_of("aten.split.Tensor")
    assert _judged(out) == ("warning", "inherited")
    assert "aten.split.Tensor only moves the elements of its input, which differs by 0.002" in out.message
    assert _judged(output_of("aten.transpose_.default")) == ("warning", "inherited")
    assert _judged(output_of("aten.mul.Tensor")) == ("error", "blamed")
    assert _judged(output_of("aten.split.Tensor", (1, 2))) == ("error", "blamed")
    assert _judged(output_of("aten.split.Tensor", difference=0.0005)) == ("error", "blamed")  # within rounding


def test_singular_near_zero_ops_inherit_an_error_within_their_inputs_relative_spread():
    def output_of(op: str) -> Row:
        given = _row("input", 0.001, op=op, metrics={"max_rel_err": 0.5})  # near-zero elements differ by 50 %
        out = _row("output", 0.1, op=op)
        judge([given, out], growth=16)
        return out

    assert _judged(output_of("aten.sqrt.default")) == ("pass", "inherited")
    assert _judged(output_of("aten.mul.Tensor")) == ("error", "blamed")


def test_singular_near_zero_a_norms_rstd_inherits_an_error_within_its_inputs_relative_spread():
    """A LayerNorm's rstd is ``rsqrt`` of each row's variance (a bf16 step's later LayerNorm, whose input
    differs a little, was blamed for its rstd); its normalized output is not singular."""

    def output_of(arg: str) -> Row:
        op = "aten.native_layer_norm.default"
        given = _row("input", 0.001, op=op, metrics={"mean_rel": 0.05})  # a mean near zero differs by 5 %
        out = _row("output", 0.02, op=op, arg=arg)
        judge([given, out], growth=16)
        return out

    assert _judged(output_of("2")) == ("pass", "inherited")
    assert _judged(output_of("0")) == ("error", "blamed")


def test_awaits_rerun_an_output_with_saved_tensors_is_undecided_until_rerun():
    given = _row("input", 0.0)
    out = _row("output", 0.05, metrics={"cosine": 0.99})
    judge([given, out])
    assert _judged(out) == ("undecided", "undecided") and out.message.endswith("it could not be rerun")
    judge([given, out], rerun=True)  # rerun found nothing to say: statistics decide
    assert _judged(out) == ("error", "blamed")


def test_may_amplify_an_output_far_smaller_than_its_inputs_is_undecided_with_statistics():
    given = _row("input", 0.001, stats=_stats(1.0))
    out = _row("output", 0.05, stats=_stats(0.01))  # inputs 100 times its scale: up to 100x their error
    judge([given, out], growth=16)
    assert _judged(out) == ("undecided", "undecided")
    assert "may amplify that up to 100x" in out.message and 'a tensor dump (task="tensor") would decide it' in out.message


def test_may_amplify_an_output_whose_scale_its_inf_elements_hide_is_undecided():
    """A masked score (``masked_fill(~mask, -inf)``): its difference is measured against its finite
    maximum alone, which may be far below the magnitudes of its other elements, so no multiple of its
    input's difference rules it out."""
    given = _row("input", 0.001, op="aten.masked_fill.Scalar", stats=_stats(1.0))
    masked = {"min": -math.inf, "max": 0.01, "mean": -math.inf, "norm": math.inf, "neginf": 8}
    out = _row("output", 0.2, op="aten.masked_fill.Scalar", stats=masked)
    judge([given, out], growth=16)
    assert _judged(out) == ("undecided", "undecided")
    assert "its difference is measured against its finite extreme alone" in out.message
    finite = _row("output", 0.2, op="aten.masked_fill.Scalar", stats=_stats(0.5))
    judge([given, finite], growth=16)
    assert _judged(finite) == ("error", "blamed")


def test_made_here_an_output_its_inputs_do_not_explain_is_blamed():
    given = _row("input", 0.0)
    out = _row("output", 0.05)
    judge([given, out])
    assert _judged(out) == ("error", "blamed") and first_divergence([given, out]) is out
    assert out.message == "difference 0.05 > tolerance 0.001; its inputs differ by only 0: this op makes the difference"


def test_made_here_an_output_whose_inputs_have_no_partner_is_first_seen_there_or_inherits_from_upstream():
    """An eager op outside the compiled graphs, paired by the value it made: its inputs were never
    compared, so nothing says they agree. With nothing upstream differing, the difference is first
    seen there; within growth times what differs upstream, it is inherited."""
    given = _row("input", only="b")
    out = _row("output", 0.05)
    judge([given, out])
    assert _judged(out) == ("error", "blamed") and first_divergence([given, out]) is out
    assert out.message == (
        "difference 0.05 > tolerance 0.001; its inputs were not compared (none has a partner in the other dump):"
        " the difference is first seen here"
    )
    before_in, before_out = _row("input", 0.0, call=1), _row("output", 0.01, call=1)  # blamed: upstream differs
    given, out = _row("input", only="b", call=2), _row("output", 0.05, call=2)
    judge([before_in, before_out, given, out], growth=16)
    assert _judged(before_out) == ("error", "blamed") and _judged(out)[1] == "inherited"
    assert out.message.endswith("(none has a partner in the other dump); upstream ops already differ")


def test_made_here_a_mask_alone_compared_does_not_say_the_values_agree():
    """A masked fill's backward against inductor's ``where``: its gradient input has no partner and
    only its mask is compared. The mask's agreement says nothing of the values the output was made
    of: within growth times what differs upstream the output is inherited (was: blamed, 'its
    inputs differ by only 0')."""
    op = "aten.masked_fill.Scalar"
    before_in, before_out = _row("input", 0.0, call=1), _row("output", 0.01, call=1)  # blamed: upstream differs
    gradient = _row("input", op=op, call=2, only="b")
    mask = _row("input", 0.0, op=op, call=2, arg="1", dtype="bool")
    out = _row("output", 0.05, op=op, call=2)
    judge([before_in, before_out, gradient, mask, out], growth=16)
    assert _judged(out)[1] == "inherited" and out.message.endswith("upstream ops already differ")
    compared = _row("input", 0.0, call=3, arg="1")  # a floating input compared, agreeing: blamed as before
    made = _row("output", 0.05, call=3)
    judge([before_in, before_out, _row("input", call=3, only="b"), compared, made], growth=16)
    assert _judged(made) == ("error", "blamed")


# --- inputs beyond tolerance -----------------------------------------------------------------------------


def test_constant_no_op_made_holding_finfo_min_of_each_dtype_passes():
    low = {dtype: torch.finfo(getattr(torch, dtype)).min for dtype in ("bfloat16", "float32")}
    blamed = _row("output", 0.1, op="aten.ones.default")  # 0.1 seen upstream would explain the bias
    bias = _row(
        "input",
        0.5,
        a={"stats": {"min": low["bfloat16"], "max": low["bfloat16"]}},
        b={"stats": {"min": low["float32"], "max": low["float32"]}},
    )
    judge([blamed, bias])
    assert _judged(bias) == ("pass", "dtype") and "a constant no captured op made" in bias.message


def test_upstream_differs_an_input_within_growth_times_the_error_seen_before_is_inherited():
    before = _row("output", 5e-4)  # within tolerance: still error seen upstream
    weight = _row("input", 0.005, call=1)
    judge([before, weight], growth=16)
    assert _judged(weight) == ("pass", "inherited") and weight.message.endswith("upstream ops already differ")


def test_differs_before_any_op_an_input_no_op_made_is_blamed():
    weight = _row("input", 0.01)
    judge([weight])
    assert _judged(weight) == ("error", "blamed") and weight.message.endswith("this input differs before any op did")


def test_differs_before_any_op_a_parameter_the_optimizer_reads_says_an_earlier_step_made_it():
    """Two runs whose weights parted before the dumped step: the optimizer's read of the weight tells
    a parameter from the batch."""
    weight = _row("input", 0.01, value_id=7)
    batch = _row("input", 0.01, value_id=8)

    def read(io: str = "input") -> Record:  # the optimizer's read of the weight
        name = make_name("optimizer", "-", "aten.add_.Tensor", 0, io, "0")
        fields = dict(dtype="float32", shape=[4], value_id=7)
        return Record(name, 0, 0, "optimizer", "-", "aten.add_.Tensor", 0, 2, io, "0", **fields)  # type: ignore[arg-type]

    stepped = Row.from_records(0, read(), read(), "exact", next(_ORDER))
    judge([weight, stepped])
    judge([batch, stepped])
    assert _judged(weight) == ("error", "blamed")
    assert weight.message.endswith("an earlier step, the initialisation or a loaded checkpoint made the difference")
    assert batch.message.endswith("this input differs before any op did")


def test_updated_unseen_a_parameter_an_unrecorded_optimizer_step_updated_is_undecided():
    """A compiled model's graph dump (A) holds no record of the eager optimizer step between two
    steps, whose Adam update turns round-off in a zero gradient into a step of the learning rate's
    size; B records it. The weight of step 1 is undecided, not blamed; where A records its optimizer
    steps too (an eager dump), the weight is blamed as before."""

    def record(step: int, phase: str, op: str, **fields: Any) -> Record:
        name = make_name(phase, "m" if phase == "forward" else "-", op, 0, "input", "0")
        return Record(name, step, 0, phase, "m", op, 0, 0, "input", "0", dtype="float32", shape=[4], value_id=7, **fields)

    def weight_of(capture_a: str) -> Row:
        stepped = []  # the optimizer's read of the weight in steps 0 and 1: on B, and on A where it is eager
        for step in (0, 1):
            read_a = record(step, "optimizer", "aten.add_.Tensor") if capture_a == "eager" else None
            read_b = record(step, "optimizer", "aten.add_.Tensor")
            stepped.append(Row.from_records(0, read_a, read_b, "exact" if read_a else "only_b", next(_ORDER)))
        a, b = record(1, "forward", "aten.mul.Tensor", capture=capture_a), record(1, "forward", "aten.mul.Tensor")
        weight = Row.from_records(0, a, b, "exact", next(_ORDER))
        weight.difference, weight.tolerance = 0.01, 1e-3
        judge([*stepped, weight])
        return weight

    unseen = weight_of("graph")
    assert _judged(unseen) == ("undecided", "undecided")
    assert "updated in step 0 by an optimizer step that A's graph dump does not record" in unseen.message
    assert _judged(weight_of("eager")) == ("error", "blamed")


def test_gradient_of_incomparable_the_gradient_of_a_micro_batch_loss_cannot_be_compared():
    piece = _row("input", 0.5, op="aten.mse_loss.default", a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}})
    loss = _row("output", 0.5, op="aten.mse_loss.default")
    op = "aten.mse_loss_backward.default"
    records = [
        Record(
            name=make_name("backward", "m", op, 0, "input", "0"),
            **{"step": 0, "rank": 0, "phase": "backward", "module": "m", "op": op, "call": 0, "seq": 9, "io": "input"},
            **{"arg": "0", "dtype": "float32", "shape": [], "fwd": "forward/m/aten.mse_loss.default#0", **side},
        )
        for side in ({"stats": _stats(0.25)}, {"stats": _stats(1.0)})  # (loss / 4).backward() against loss.backward()
    ]
    grad = Row.from_records(0, records[0], records[1], "exact", next(_ORDER))
    grad.difference, grad.tolerance = 0.75, 1e-3
    judge([piece, loss, grad])
    assert grad.verdict == "incomparable"
    assert grad.message == f"not comparable: a gradient with respect to a value that cannot be compared ({loss.name})"


def _piece(call: int, stats: dict[str, float]) -> Row:
    """A matched output that cannot be compared (one piece of a split DTensor)."""
    return _row("output", 0.5, call=call, stats=stats, a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}})


def test_holds_incomparable_an_input_made_from_a_value_that_cannot_be_compared_through_shared_ops():
    piece = _piece(0, _stats(1.0))
    held = _row("input", 0.5, call=1, op="aten.add.Tensor", stats=_stats(1.0))
    judge([piece, held])
    assert (
        held.verdict == "incomparable" and held.message == f"not comparable: holds a value that cannot be compared ({piece.name})"
    )


def test_one_sided_from_incomparable_inherits_within_growth_tolerances_and_blames_beyond():
    def summed(error: float) -> Row:
        piece = _piece(0, _stats(1.0))
        add_in = _row("input", call=1, op="aten.add_.Tensor", only="a", stats=_stats(1.0))
        add_out = _row("output", call=1, op="aten.add_.Tensor", only="a", stats=_stats(2.0))
        total = _row("input", error, call=2, op="aten.mul.Tensor", a={"stats": _stats(2.0)}, b={"stats": _stats(1.0)})
        judge([piece, add_in, add_out, total], growth=16)
        assert "made through aten.add_.Tensor that only one side runs" in total.message
        return total

    assert _judged(summed(0.01)) == ("pass", "inherited")  # within 16 tolerances: summed in another order
    assert _judged(summed(0.5)) == ("error", "blamed")


def test_made_differently_an_input_each_side_made_from_other_rows_passes_and_they_stand_for_it():
    first = _row("output", 0.002, call=0, op="aten.mm.default", stats=_stats(1.0))
    second = _row("output", 0.003, call=1, op="aten.mm.default", stats=_stats(2.0))
    cast_in = _row("input", call=2, op="aten.mul.Tensor", only="a", stats=_stats(1.0))
    cast_out = _row("output", call=2, op="aten.mul.Tensor", only="a", stats=_stats(3.0))
    partial = _row("input", 0.005, call=3, op="aten.add.Tensor", a={"stats": _stats(3.0)}, b={"stats": _stats(2.0)})
    out = _row("output", 0.02, call=3, op="aten.add.Tensor")
    judge([first, second, cast_in, cast_out, partial, out], growth=16)
    assert (partial.verdict, partial.attribution) == ("pass", "")
    assert f"A made this input from {first.name}, B from {second.name}" in partial.message
    assert _judged(out) == ("warning", "inherited") and "explained by its inputs (difference 0.003)" in out.message


def test_carried_from_source_an_input_within_twice_its_producers_error_is_inherited():
    made = _row("output", 0.01, call=0, stats=_stats(1.0))
    used = _row("input", 0.015, call=1, op="aten.add.Tensor", stats=_stats(1.0))
    judge([made, used])
    assert _judged(made) == ("error", "blamed")
    assert _judged(used) == ("warning", "inherited") and f", as {made.name} (difference 0.01)" in used.message


def test_split_differently_an_input_each_side_made_alone_passes_where_the_calls_outputs_agree():
    made = _row("output", 0.0, call=0, stats=_stats(1.0))
    half_in = _row("input", call=1, only="a", stats=_stats(1.0))
    half_out = _row("output", call=1, only="a", stats=_stats(2.0))
    third_in = _row("input", call=2, op="aten.div.Tensor", only="b", stats=_stats(1.0))
    third_out = _row("output", call=2, op="aten.div.Tensor", only="b", stats=_stats(3.0))
    part = _row("input", 0.5, call=3, op="aten.add.Tensor", a={"stats": _stats(2.0)}, b={"stats": _stats(3.0)})
    total = _row("output", 0.0, call=3, op="aten.add.Tensor", stats=_stats(4.0))
    rows = [made, half_in, half_out, third_in, third_out, part, total]
    judge(rows)
    assert (part.verdict, part.attribution) == ("pass", "") and first_divergence(rows) is None
    assert "each side made this input through ops only it runs (aten.div.Tensor, aten.mul.Tensor)" in part.message
    total.difference = 0.5  # the sums differ too: one side's ops changed the value
    judge(rows)
    assert part.verdict != "pass" and first_divergence(rows) is not None


def test_changed_by_one_sided_op_blames_the_op_only_one_side_runs_that_changed_a_value_entering_equal():
    made = _row("output", 0.0, call=0, stats=_stats(1.0))
    hook_in = _row("input", call=1, only="a", stats=_stats(1.0))
    hook_out = _row("output", call=1, only="a", stats=_stats(1.03))
    used = _row("input", 0.03, call=2, op="aten.add.Tensor", a={"stats": _stats(1.03)}, b={"stats": _stats(1.0)})
    rows = [made, hook_in, hook_out, used]
    judge(rows)
    assert _judged(hook_out) == ("error", "blamed") and first_divergence(rows) is hook_out
    assert hook_out.difference is not None and math.isclose(hook_out.difference, 0.03, rel_tol=1e-6)
    assert "only A runs this op (a structure difference) and the value entering it agrees (difference 0)" in hook_out.message
    assert _judged(used) == ("warning", "inherited")
    assert f"made by aten.mul.Tensor that only A runs ({hook_out.name}), which changed the value" in used.message
    assert _judged(hook_in) == ("unmatched", "")


def test_changed_by_one_sided_op_walks_back_through_the_ops_that_pass_the_change_on():
    made = _row("output", 0.0, call=0, stats=_stats(1.0))
    view_in = _row("input", call=1, op="aten.view.default", only="b", stats=_stats(1.0))
    view_out = _row("output", call=1, op="aten.view.default", only="b", stats=_stats(1.0))
    scale_in = _row("input", call=2, only="b", stats=_stats(1.0))
    scale_out = _row("output", call=2, only="b", stats=_stats(1.05))
    cast_in = _row("input", call=3, op="aten.clone.default", only="b", stats=_stats(1.05))
    cast_out = _row("output", call=3, op="aten.clone.default", only="b", stats=_stats(1.05))
    used = _row("input", 0.05, call=4, op="aten.add.Tensor", a={"stats": _stats(1.0)}, b={"stats": _stats(1.05)})
    rows = [made, view_in, view_out, scale_in, scale_out, cast_in, cast_out, used]
    blocks = judge(rows)
    assert first_divergence(rows) is scale_out and "only B runs this op" in scale_out.message
    assert [(row.verdict, row.attribution) for row in (view_out, cast_out)] == [("unmatched", "")] * 2
    [block] = blocks
    assert [op.op for op in block.ops] == ["aten.view.default", "aten.mul.Tensor", "aten.clone.default"]
    assert (block.verdict, block.cause, block.entering, block.leaving) == ("error", scale_out.name, [made.name], [used.name])
    assert view_in.block is block and used.block is None


def test_enters_here_an_input_differing_more_than_its_producer_made_is_blamed():
    made = _row("output", 0.0, call=0, stats=_stats(1.0))
    used = _row("input", 0.03, call=1, op="aten.add.Tensor", stats=_stats(1.0))
    judge([made, used])
    assert _judged(used) == ("error", "blamed") and first_divergence([made, used]) is used
    assert f"the tensor {made.name} made differs by only 0: the difference enters here" in used.message


# --- argument values -------------------------------------------------------------------------------------


def test_same_value_passes_reprs_that_differ_only_by_address():
    row = _row("input", kind="value", a={"value": "<Generator at 0x7f01>"}, b={"value": "<Generator at 0x7f99>"})
    judge([row])
    assert (row.verdict, row.message) == ("pass", "")


def test_dtype_argument_value_of_a_call_without_tensor_inputs_passes():
    dtype = _row(
        "input", kind="value", arg="dtype", op="aten.zeros.default", a={"value": "torch.bfloat16"}, b={"value": "torch.float32"}
    )
    judge([dtype])
    assert _judged(dtype) == ("pass", "dtype")
    assert dtype.message == "argument value differs because the runs' dtypes differ: dtype torch.bfloat16 vs torch.float32"


def test_other_value_is_a_warning_or_incomparable_in_a_call_on_incomparable_values():
    plain = _row("input", kind="value", arg="1", a={"value": 1.0}, b={"value": 1.5})
    judge([plain])
    assert (plain.verdict, plain.message) == ("warning", "argument value differs: 1.0 vs 1.5")
    piece = _row("input", 0.5, call=1, a={"extra": {"one_shard": "holds one Shard(0) piece of 2"}})
    sizes = _row("input", call=1, kind="value", arg="1", a={"value": [8]}, b={"value": [4]})
    judge([piece, sizes])
    assert sizes.verdict == "incomparable" and "in a call on values that cannot be compared" in sizes.message


# --- the list -----------------------------------------------------------------------------------------------


def test_every_rule_has_a_test_of_its_own():
    tests = {name for name in dir(sys.modules[__name__]) if name.startswith("test_")}
    untested = [rule.name for rule in RULES if not any(test.startswith(f"test_{rule.name}_") for test in tests)]
    assert not untested


_SLOTS = {
    frozenset({"input", "output", "value"}): "every slot",
    frozenset({"input", "output"}): "tensors",
    frozenset({"input"}): "tensor inputs",
    frozenset({"output"}): "tensor outputs",
    frozenset({"value"}): "argument values",
}
"""How the list names the slots a rule applies to."""


def _documented() -> list[str]:
    """The numbered rule list of docs/compare.md's *Verdict rules, in order* section."""
    text = _DOC.read_text()
    section = text.split("### Verdict rules, in order", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\d+\. .*$", section, flags=re.MULTILINE)


def test_docs_list_the_rules_in_their_order_with_their_first_docstring_line():
    expected = [f"{i}. `{rule.name}` ({_SLOTS[rule.slots]}): {rule.summary}" for i, rule in enumerate(RULES, 1)]
    assert _documented() == expected, "docs/compare.md's list should read:\n" + "\n".join(expected)
