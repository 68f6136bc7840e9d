"""How eager capture flattens an op's arguments into slots (``torchdebug.slots``)."""

from collections import namedtuple

import torch

from torchdebug.slots import iter_slots, json_value, output_slots

Pair = namedtuple("Pair", "first second")


def test_size_lists_stay_whole_and_lists_holding_tensors_are_walked_into_elements():
    t = torch.zeros(1)
    slots = list(iter_slots(([t, [t, 2]], [8, 128, 256], torch.Size([2]), Pair(t, 1)), {"tensors": (t, t), "dims": [0, 1]}))
    assert [arg for arg, _ in slots] == ["0.0", "0.1.0", "0.1.1", "1", "2", "3", "tensors.0", "tensors.1", "dims"]
    values = dict(slots)
    assert values["1"] == [8, 128, 256] and values["2"] == torch.Size([2]) and values["0.1.1"] == 2
    assert isinstance(values["3"], Pair), "a tuple subclass passed as an argument is one slot"


def test_a_tuple_subclass_inside_a_list_is_walked_like_a_tuple():
    t = torch.zeros(1)
    assert [arg for arg, _ in iter_slots(([Pair(t, 1), 3],))] == ["0.0.0", "0.0.1", "0.1"]


def test_a_module_output_is_named_by_position_by_key_or_whole():
    """A tuple's items by position, a dict's (a Hugging Face ``ModelOutput``) by key, a tensor as ``0``."""
    t = torch.zeros(1)
    assert [arg for arg, _ in output_slots(t)] == ["0"]
    assert [arg for arg, _ in output_slots((t, [t, t]))] == ["0", "1.0", "1.1"]
    named = list(output_slots({"loss": t, "logits": t, "hidden_states": (t, t)}))
    assert [arg for arg, _ in named] == ["loss", "logits", "hidden_states.0", "hidden_states.1"] and named[0][1] is t


def test_json_value_keeps_scalars_and_writes_dtypes_and_other_objects_as_text():
    assert json_value([8, 2.5, True, None, "s", torch.float32, (1, torch.device("cpu"))]) == [
        8,
        2.5,
        True,
        None,
        "s",
        "float32",
        [1, "cpu"],
    ]
    assert json_value(torch.Size([2, 3])) == [2, 3]
    assert json_value("x" * 300) == "x" * 300
    assert json_value(object()).startswith("<object object at")
