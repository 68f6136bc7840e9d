"""Groups of identical tensors (the first step's zero biases and optimizer state): bounded, still paired."""

from __future__ import annotations

from tests.compare.test_matching import _how, _op
from torchdebug.compare._matching import match_records
from torchdebug.compare._value_graph import candidate_producers, producers


def _fresh_state(layers: int) -> list:
    """Per layer a ``zeros_like`` (its optimizer state, zero in every layer) read by that layer's ``lerp_``."""
    records = []
    for layer in range(layers):
        records += _op("aten.zeros_like.default", layer, 2 * layer, [], 0.0)
        records += _op("aten.lerp_.Scalar", layer, 2 * layer + 1, [0.0], 1.0 + layer)
    return records


def test_an_input_of_a_large_group_keeps_the_first_and_the_nearest_producers_only():
    records = _fresh_state(50)
    found = candidate_producers(records)
    inputs = [r for r in records if r.io == "input"]
    assert max(len(found[id(r)]) for r in inputs[1:]) == 3  # bounded, however many made the value
    last = found[id(inputs[-1])]
    assert [name.rsplit("/", 1)[-1] for name, _ in last] == [
        "aten.zeros_like.default#0",  # the first made, which producers() reports
        "aten.zeros_like.default#48",
        "aten.zeros_like.default#49",  # the nearest: the layer's own state
    ]
    assert producers(records)[id(inputs[-1])] == last[0]


def test_a_call_does_not_count_as_a_producer_of_its_own_input():
    # an in-place op whose output equals its input (a weight decay that rounds back) in a group
    records = _fresh_state(3) + _op("aten.mul_.Tensor", 0, 6, [0.0], 0.0)
    found = candidate_producers(records)
    names = [name.rsplit("/", 1)[-1] for name, _ in found[id(records[-2])]]
    assert "aten.mul_.Tensor#0" not in names and names[-1] == "aten.zeros_like.default#2"


def test_identical_fresh_tensors_of_many_layers_pair_exactly():
    a, b = _fresh_state(40), _fresh_state(40)
    assert set().union(*_how(match_records(a, b)).values()) == {"exact"}


def test_a_value_remade_after_a_large_group_made_it_pairs_with_its_latest_maker():
    # after every layer's zero state, a bf16 weight decay rounds a zero back to zero (fp32: 0.5);
    # the update reads the weight decay's output on both sides, which only the nearest maker shows
    a = _fresh_state(30) + _op("aten.mul_.Tensor", 0, 60, [0.0], 0.0) + _op("aten.addcdiv_.default", 0, 61, [0.0], 2.0)
    b = _fresh_state(30) + _op("aten.mul_.Tensor", 0, 60, [0.0], 0.5) + _op("aten.addcdiv_.default", 0, 61, [0.5], 2.0)
    assert _how(match_records(a, b))["aten.addcdiv_.default#0"] == {"exact"}
