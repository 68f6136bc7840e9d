"""Producers by value ids: exact where statistics are ambiguous, inferred as before where a dump has none."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import torch

import torchdebug
from tests.compare.test_matching import _how, _op
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import candidate_producers, execution_order, producers
from torchdebug.records import MODULE_OP, Record, make_name
from torchdebug.store._record_json import encode_records


def _dump(path: Path, program) -> list[Record]:
    with torchdebug.dump(path, task="statistics"):
        program()
    records = torchdebug.load(path).ranks[0].records()
    return [records[i] for i in execution_order(records)]


def _without_ids(records: list[Record]) -> list[Record]:
    return [replace(r, value_id=None, version=None, view_of=None) for r in records]


def _strip_ids(dump: Path) -> None:
    """Rewrite a dump as written before value ids (JSON lines without them)."""
    for rank in dump.glob("*/worldsize*"):
        records = _without_ids(torchdebug.load(rank).ranks[0].records())
        (rank / "records.arrows").unlink()
        (rank / "records.jsonl").write_text(encode_records(records))


def _made_by(records: list[Record], name: str, found: dict) -> str:
    return next(found[id(r)][0] for r in records if r.name == name)


def test_an_input_reading_the_second_of_two_zero_tensors_is_made_by_that_one_not_the_first(tmp_path):
    def program():
        first, second = torch.zeros(4), torch.zeros(4)  # two biases: the same dtype, shape and statistics
        torch.ones(4).add(second)
        first.neg()

    records = _dump(tmp_path, program)
    assert _made_by(records, "forward/-/aten.add.Tensor#0/input.1", producers(records)) == "forward/-/aten.zeros.default#1"
    assert _made_by(records, "forward/-/aten.neg.default#0/input.0", producers(records)) == "forward/-/aten.zeros.default#0"
    inferred = _without_ids(records)  # a dump written before value ids: the first of identical tensors
    assert _made_by(inferred, "forward/-/aten.add.Tensor#0/input.1", producers(inferred)) == "forward/-/aten.zeros.default#0"


def _program(one_sided: bool) -> None:
    x = torch.linspace(-1, 1, 8)
    ones = torch.ones(8)
    bias = torch.zeros(8)
    if one_sided:
        bias = bias.exp()  # A alone: the zeros become ones, with the statistics of ``ones``
    (x + bias).relu()
    ones.neg()


def test_an_op_one_side_runs_whose_output_looks_like_another_tensor_is_blamed(tmp_path):
    for side, one_sided in (("a", True), ("b", False)):
        with torchdebug.dump(tmp_path / side, task="statistics"):
            _program(one_sided)
    result = torchdebug.compare(tmp_path / "a", tmp_path / "b")
    assert result.first_divergence.name == "forward/-/aten.exp.default#0/output.0"
    read = next(row for row in result.rows if row.name == "forward/-/aten.add.Tensor#0/input.1")
    assert read.match == "exact" and "made by aten.exp.default that only A runs" in read.message

    for side in ("a", "b"):  # the same dumps as written before value ids
        _strip_ids(tmp_path / side)
    inferred = torchdebug.compare(tmp_path / "a", tmp_path / "b")
    assert inferred.first_divergence.name == "forward/-/aten.relu.default#0/output.0"  # ones' maker taken for exp
    assert {row.match for row in inferred.rows if row.op == "aten.add.Tensor"} == {"only_a", "only_b"}


def _slot(
    op: str, call: int, seq: int, io: str, arg: str, value: tuple[int, int, int | None], module: str = "m", mean: float = 0.0
) -> Record:
    """A tensor slot of ``(value_id, version, view_of)``; ``mean``: its statistics (an op whose output
    has its input's passes that value on)."""
    value_id, version, view_of = value
    return Record(
        name=make_name("forward", module, op, call, io, arg),
        step=0,
        rank=0,
        phase="forward",
        module=module,
        op=op,
        call=call,
        seq=seq,
        io=io,
        arg=arg,
        dtype="float32",
        shape=[4],
        stats={"mean": mean},
        value_id=value_id,
        version=version,
        view_of=view_of,
    )


def test_a_collective_that_rewrites_its_tensor_without_a_new_version_is_its_producer():
    records = [
        _slot("aten.ones.default", 0, 0, "output", "0", (1, 0, None)),
        _slot("c10d.allreduce_.default", 0, 1, "input", "0.0", (1, 0, None)),
        _slot("c10d.allreduce_.default", 0, 1, "output", "0.0", (1, 0, None), mean=2.0),
        _slot("aten.mul.Tensor", 0, 2, "input", "0", (1, 0, None), mean=2.0),
    ]
    assert producers(records)[id(records[-1])] == ("forward/m/c10d.allreduce_.default#0", "output.0.0")


def test_a_write_through_a_view_is_the_producer_of_its_base_at_the_version_it_left():
    records = [
        _slot("aten.zeros.default", 0, 0, "output", "0", (1, 0, None)),
        _slot("aten.slice.Tensor", 0, 1, "input", "0", (1, 0, None)),
        _slot("aten.slice.Tensor", 0, 1, "output", "0", (2, 0, 1)),
        _slot("aten.add_.Tensor", 0, 2, "input", "0", (2, 0, 1)),
        _slot("aten.add_.Tensor", 0, 2, "output", "0", (2, 1, 1), mean=1.0),
        _slot("aten.sum.default", 0, 3, "input", "0", (1, 1, None), mean=0.5),  # the base, written through the view
        _slot("aten.exp.default", 0, 4, "input", "0", (2, 0, 1)),  # the version before the write: the slice's
    ]
    found = producers(records)
    assert found[id(records[5])] == ("forward/m/aten.add_.Tensor#0", "output.0")
    # a slice passes its input's value on: the first candidate is the value's maker, the second the slice
    assert found[id(records[3])] == found[id(records[6])] == ("forward/m/aten.zeros.default#0", "output.0")
    assert candidate_producers(records)[id(records[6])][1] == ("forward/m/aten.slice.Tensor#0", "output.0")


def test_a_module_output_recorded_before_its_ops_does_not_take_the_op_s_place():
    records = [
        _slot(MODULE_OP, 0, 0, "output", "0", (1, 0, None), module="block"),  # the module call's place
        _slot("aten.relu.default", 0, 1, "output", "0", (1, 0, None), module="block"),
        _slot("aten.neg.default", 0, 2, "input", "0", (1, 0, None)),
    ]
    assert producers(records)[id(records[-1])] == ("forward/block/aten.relu.default#0", "output.0")


def test_a_cast_is_looked_through_to_the_op_that_made_its_input():
    records = [
        _slot("aten.mm.default", 0, 0, "output", "0", (1, 0, None)),
        _slot("aten._to_copy.default", 0, 1, "input", "0", (1, 0, None)),
        _slot("aten._to_copy.default", 0, 1, "output", "0", (2, 0, None)),
        _slot("aten.relu.default", 0, 2, "input", "0", (2, 0, None)),
    ]
    assert producers(records)[id(records[-1])] == ("forward/m/aten.mm.default#0", "output.0")


def _zero_state(layers: int) -> list[Record]:
    """Per layer a ``zeros_like`` (optimizer state, the same statistics everywhere) read by that
    layer's ``lerp_``, with value ids."""
    records = []
    for layer in range(layers):
        zeros = _op("aten.zeros_like.default", layer, 2 * layer, [], 0.0)
        lerp = _op("aten.lerp_.Scalar", layer, 2 * layer + 1, [0.0], 1.0)
        state = dict(value_id=layer, version=0)
        records += [dataclasses.replace(zeros[0], **state), dataclasses.replace(lerp[0], **state)]
        records.append(dataclasses.replace(lerp[1], value_id=layer, version=1))
    return records


def test_each_of_many_identical_fresh_tensors_has_its_own_maker_alone_and_pairs_exactly():
    records = _zero_state(50)
    found = candidate_producers(records)
    reads = [r for r in records if r.io == "input"]
    assert [found[id(r)] for r in reads] == [((f"forward/m/aten.zeros_like.default#{i}", "output.0"),) for i in range(50)]
    assert set().union(*_how(match_records(_zero_state(40), _zero_state(40))).values()) == {"exact"}


def test_a_backward_read_of_a_recomputed_value_is_made_by_the_forward_call_it_repeats():
    forward = _slot("aten._softmax.default", 0, 0, "output", "0", (1, 0, None), mean=0.5)
    recomputed = replace(
        forward, name=forward.name.replace("forward/", "recompute/"), phase="recompute", seq=3, value_id=5, fwd=forward.call_name
    )
    reader = replace(
        _slot("aten._softmax_backward_data.default", 0, 4, "input", "1", (5, 0, None), mean=0.5),
        name="backward/m/aten._softmax_backward_data.default#0/input.1",
        phase="backward",
    )
    records = [forward, reader, recomputed]  # execution order puts the recomputation after the backward
    assert producers(records)[id(reader)] == ("forward/m/aten._softmax.default#0", "output.0")


def test_a_parameter_no_op_wrote_has_no_producer_though_its_transpose_holds_its_values():
    records = [
        _slot("aten.t.default", 0, 0, "input", "0", (1, 0, None), mean=0.5),  # a square weight
        _slot("aten.t.default", 0, 0, "output", "0", (2, 0, 1), mean=0.5),
        _slot("aten.mul_.Tensor", 0, 1, "input", "0", (1, 0, None), mean=0.5),  # its weight decay
    ]
    assert id(records[-1]) not in candidate_producers(records)
