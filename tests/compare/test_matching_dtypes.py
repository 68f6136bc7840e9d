"""Matching eager against compiled never pairs an integer value with a floating-point one (issue 49,
item 2), nor pairs the consumers of such values through them.

A dump written before compiled nodes were named by their values holds inductor's int64 ``iota``
(the first node of a decomposed float32 ``arange``) as ``aten.arange.start#0``; the int64 ``mul``
after it reads it. Paired by name with the eager float ``arange``, the ``iota`` made the int64
``mul`` look like the consumer of the eager float ``mul``'s input, and the two were paired: a
false error.
"""

from __future__ import annotations

from dataclasses import replace

from torchdebug.compare._matching import match_records
from torchdebug.records import Record, make_name

_SLOT = Record(name="", step=0, rank=0, phase="forward", module="m", op="", call=0, seq=0, io="output", arg="0", shape=[8])


def _slot(op: str, call: int, seq: int, io: str, arg: str, dtype: str, mean: float, capture: str = "eager") -> Record:
    stats = {"min": 0.0, "max": 7.0, "mean": mean}
    name = make_name("forward", "m", op, call, io, arg)
    return replace(_SLOT, name=name, op=op, call=call, seq=seq, io=io, arg=arg, dtype=dtype, stats=stats, capture=capture)


def _node(op: str, call: int, seq: int, dtype: str, before: float | None, after: float, source: str = "int64") -> list[Record]:
    """A compiled node's slots: its input (made by the node before it) and its output."""
    inputs = [] if before is None else [_slot(op, call, seq, "input", "0", source, before, "graph")]
    return [*inputs, _slot(op, call, seq, "output", "0", dtype, after, "graph")]


def _dtypes(pairs: list) -> set[tuple[str, str]]:
    return {(p.a.dtype, p.b.dtype) for p in pairs if p.a is not None and p.b is not None}


def test_an_int64_node_named_after_a_float_eager_op_is_not_paired_with_it_nor_are_its_consumers():
    compiled = [
        *_node("aten.arange.start", 0, 0, "int64", None, 3.5),  # the iota, named after the arange
        *_node("aten.mul.Tensor", 0, 1, "int64", 3.5, 3.6),  # times the step
        *_node("aten.add.Tensor", 0, 2, "int64", 3.6, 3.7),  # plus the start
        *_node("prims.convert_element_type.default", 0, 3, "float32", 3.7, 3.5),  # the arange's value
        *_node("aten.mul.Tensor", 1, 4, "float32", 3.5, -32.0, source="float32"),  # the user's mul
    ]
    eager = [
        _slot("aten.arange.start", 0, 0, "output", "0", "float32", 3.5),
        _slot("aten.mul.Tensor", 0, 1, "input", "0", "float32", 3.5),
        _slot("aten.mul.Tensor", 0, 1, "output", "0", "float32", -32.0),
    ]
    pairs = match_records(compiled, eager, compiled=True)
    assert ("int64", "float32") not in _dtypes(pairs), [(p.a.name, p.b.name) for p in pairs if p.a and p.b]
    # eager against eager, names still pair calls of other dtypes (an autocast run's)
    autocast = [replace(record, dtype="bfloat16") for record in eager]
    assert _dtypes(match_records(autocast, eager)) == {("bfloat16", "float32")}


def test_leftover_calls_of_another_dtype_are_not_aligned_eager_against_compiled():
    # one mul on each side under other call indices (#3 against #0): only the leftover alignment could pair them
    compiled = _node("aten.mul.Tensor", 3, 0, "int64", 1.0, 2.0)
    eager = [
        _slot("aten.mul.Tensor", 0, 0, "input", "0", "float32", 1.0),
        _slot("aten.mul.Tensor", 0, 0, "output", "0", "float32", 2.0),
    ]
    assert _dtypes(match_records(compiled, eager, compiled=True)) == set()
    float16 = [replace(record, dtype="float16") for record in compiled]
    assert _dtypes(match_records(float16, eager, compiled=True)) == set()
    assert _dtypes(match_records(float16, eager)) == {("float16", "float32")}, "eager against eager they align"
