"""Pairing records: exact names, order-preserving alignment, mapping files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from torchdebug.compare._matching import load_mapping, match_records
from torchdebug.records import Record, make_name


def _call(module: str, op: str, call: int, seq: int, shape: list[int] | None = None, phase: str = "forward") -> Record:
    return Record(
        name=make_name(phase, module, op, call, "output", "0"),
        step=0,
        rank=0,
        phase=phase,
        module=module,
        op=op,
        call=call,
        seq=seq,
        io="output",
        arg="0",
        dtype="float32",
        shape=shape or [4],
    )


def _op(op: str, call: int, seq: int, inputs: list[float], output: float, phase: str = "forward") -> list[Record]:
    """A call of ``op`` in module ``m`` whose tensors are told apart by their mean (same dtype and shape)."""

    def slot(io: str, arg: str, mean: float) -> Record:
        record = _call("m", op, call, seq, phase=phase)
        return replace(record, name=make_name(phase, "m", op, call, io, arg), io=io, arg=arg, stats={"mean": mean})

    return [slot("input", str(i), mean) for i, mean in enumerate(inputs)] + [slot("output", "0", output)]


def _how(pairs: list) -> dict[str, set[str]]:
    """How each call of either side was paired."""
    found: dict[str, set[str]] = {}
    for pair in pairs:
        found.setdefault((pair.a or pair.b).call_name.split("/")[-1], set()).add(pair.how)
    return found


def test_partial_sums_taken_in_another_order_are_not_paired_but_the_final_sums_are():
    # A sums the two branches first (a cast splits a bf16 tensor's uses), B adds the residual first
    made = _op("aten.mm.default", 0, 0, [], 3.0) + _op("aten.mul.Tensor", 0, 1, [], 1.0) + _op("aten.mul.Tensor", 1, 2, [], 2.0)
    a = made + _op("aten.add.Tensor", 0, 3, [1.0, 2.0], 4.0) + _op("aten.add.Tensor", 1, 4, [3.0, 4.0], 6.0)
    b = made + _op("aten.add.Tensor", 0, 3, [3.0, 1.0], 5.0) + _op("aten.add.Tensor", 1, 4, [5.0, 2.0], 6.5)
    found = _how(match_records(a, b))
    assert found["aten.add.Tensor#0"] == {"only_a", "only_b"}
    assert found["aten.add.Tensor#1"] == {"exact"}


def test_a_value_two_calls_made_pairs_with_either_of_them():
    # a bf16 weight decay rounds back to the weight the forward transposed: either call made it
    a = _op("aten.t.default", 0, 0, [], 7.0) + _op("aten.mul_.Tensor", 0, 1, [7.0], 7.0)
    b = _op("aten.t.default", 0, 0, [], 7.0) + _op("aten.mul_.Tensor", 0, 1, [7.0], 8.0)
    a += _op("aten.addcdiv_.default", 0, 2, [7.0], 9.0)
    b += _op("aten.addcdiv_.default", 0, 2, [8.0], 9.0)
    assert _how(match_records(a, b))["aten.addcdiv_.default#0"] == {"exact"}


def test_same_names_pair_exactly_in_execution_order():
    a = [_call("m", "aten.mm.default", 0, 0), _call("m", "aten.relu.default", 0, 1)]
    b = [_call("m", "aten.mm.default", 0, 0), _call("m", "aten.relu.default", 0, 1)]
    pairs = match_records(a, b)
    assert [(p.how, p.a.op) for p in pairs] == [("exact", "aten.mm.default"), ("exact", "aten.relu.default")]


def test_an_op_inserted_on_one_side_is_listed_and_the_rest_still_pairs():
    a = [_call("m", "aten.add.Tensor", 0, 0), _call("m", "aten.add.Tensor", 1, 1, [8])]
    b = [_call("m", "aten.mul.Tensor", 0, 0), _call("m", "aten.add.Tensor", 0, 1, [8]), _call("m", "aten.add.Tensor", 1, 2)]
    pairs = match_records(a, b)
    assert sorted(p.how for p in pairs) == ["aligned", "aligned", "only_b"]
    assert all(p.a.shape == p.b.shape for p in pairs if p.a and p.b)


def test_calls_that_swapped_places_pair_by_shape():
    a = [_call("-", "aten.detach.default", 0, 0, [8, 4]), _call("-", "aten.detach.default", 1, 1, [4])]
    b = [_call("-", "aten.detach.default", 0, 0, [4]), _call("-", "aten.detach.default", 1, 1, [8, 4])]
    pairs = match_records(a, b)
    assert all(p.a.shape == p.b.shape for p in pairs)


def test_a_mapping_renames_modules_by_prefix_and_ops(tmp_path):
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({"modules": {"encoder": "model.encoder"}, "ops": {"aten.addmm.default": "aten.mm.default"}}))
    a = [_call("encoder.layer0", "aten.addmm.default", 0, 0)]
    b = [_call("model.encoder.layer0", "aten.mm.default", 0, 0)]
    assert [p.how for p in match_records(a, b, load_mapping(path))] == ["mapped"]


def test_a_mapping_file_with_unknown_keys_is_refused(tmp_path):
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps({"module": {}}))
    with pytest.raises(ValueError, match="expected keys 'modules' and/or 'ops'"):
        load_mapping(path)


def test_a_yaml_mapping_file_is_read(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "mapping.yaml"
    path.write_text("modules:\n  encoder: model.encoder\n")
    assert load_mapping(path).module("encoder.layer0") == "model.encoder.layer0"


def _slot(op: str, seq: int, io: str, arg: str, kind: str = "tensor") -> Record:
    return Record(
        name=make_name("forward", "m", op, 0, io, arg),
        step=0,
        rank=0,
        phase="forward",
        module="m",
        op=op,
        call=0,
        seq=seq,
        io=io,
        arg=arg,
        kind=kind,
        dtype="float32",
        shape=[4],
    )


def test_a_slot_on_one_side_of_a_paired_call_is_listed_next_to_the_paired_slots():
    a = [_slot("aten.add.Tensor", 0, "input", "0"), _slot("aten.add.Tensor", 0, "output", "0")]
    b = [*a, _slot("aten.add.Tensor", 0, "input", "alpha", kind="value")]
    pairs = match_records(a, b)
    assert [(p.how, p.a and p.a.arg, p.b and p.b.arg) for p in pairs] == [
        ("exact", "0", "0"),
        ("exact", "0", "0"),
        ("only_b", None, "alpha"),
    ]


def test_records_of_one_call_apart_in_the_file_are_paired_as_one_call():
    records = [  # a module's input and output records enclose the records of the ops it runs
        _slot("module", 0, "input", "0"),
        _slot("aten.relu.default", 1, "output", "0"),
        _slot("module", 2, "output", "0"),
    ]
    pairs = match_records(records, list(records))
    assert [(p.how, p.a, p.b) for p in pairs] == [("exact", r, r) for r in records]


def test_compiled_nodes_holding_another_value_are_not_aligned_with_an_eager_op_by_name_alone():
    # the compiled graph's float ``sub`` (a softmax's x - max) against eager's integer ``sub`` of
    # relative positions: as many calls on each side, but other values (T5's attention bias)
    eager = [replace(_call("attn", "aten.sub.Tensor", 0, 0, [8, 8]), dtype="int64")]
    node = replace(_call("attn", "aten.sub.Tensor", 0, 0, [2, 2, 8, 8]), capture="graph")
    assert _how(match_records([node], eager, compiled=True))["aten.sub.Tensor#0"] == {"only_a", "only_b"}
    of_another_shape = replace(node, dtype="int64")  # the same dtype, an output of another shape
    assert _how(match_records([of_another_shape], eager, compiled=True))["aten.sub.Tensor#0"] == {"only_a", "only_b"}
    reading_another_view = [  # the same output, computed from another view of its input: aligned
        replace(node, dtype="int64", shape=[8, 8]),
        replace(node, dtype="int64", shape=[64], io="input", name=node.name.replace("output.0", "input.0")),
    ]
    eager_input = replace(eager[0], shape=[8, 1], io="input", name=eager[0].name.replace("output.0", "input.0"))
    assert _how(match_records(reading_another_view, [eager_input, *eager], compiled=True))["aten.sub.Tensor#0"] == {"aligned"}


def test_calls_paired_by_name_before_their_producers_are_paired_again_by_data_flow():
    # aot's backward graph transposes the saved tensors in another order than eager autograd: the
    # namesakes read other values, which is known only once the compiled forward's extra views
    # (uneven counts: aligned after the exact names) have their partners
    mm = _op("aten.mm.default", 0, 0, [], 1.0) + _op("aten.mm.default", 1, 1, [], 2.0)
    view = "aten.view.default"
    a = [*mm, *_op(view, 0, 2, [1.0], 11.0), *_op(view, 1, 3, [2.0], 12.0)]
    b = [*mm, *_op(view, 0, 2, [9.0], 19.0), *_op(view, 1, 3, [1.0], 11.0), *_op(view, 2, 4, [2.0], 12.0)]
    transpose = "aten.transpose.int"
    a += _op(transpose, 0, 5, [11.0], 21.0, "backward") + _op(transpose, 1, 6, [12.0], 22.0, "backward")
    b += _op(transpose, 0, 5, [12.0], 22.0, "backward") + _op(transpose, 1, 6, [11.0], 21.0, "backward")
    pairs = match_records(a, b, compiled=True)
    paired = {(p.a.name, p.b.name) for p in pairs if p.a is not None and p.b is not None and p.a.phase == "backward"}
    assert ("backward/m/aten.transpose.int#0/input.0", "backward/m/aten.transpose.int#1/input.0") in paired
    assert ("backward/m/aten.transpose.int#1/output.0", "backward/m/aten.transpose.int#0/output.0") in paired
    assert all(p.a.stats == p.b.stats for p in pairs if p.a is not None and p.b is not None), "every pair holds one value"
