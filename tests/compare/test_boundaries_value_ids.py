"""The decomposed-group rule against a compiled side tells values by the value ids both dumps carry.

By statistics, a LayerNorm's output before its weight of ones and bias of zeros is the output after
them, and every zero bias is every other; by ids they are other values. A value an op the compiler
erased passed on (a ``detach``, a ``clone``) is the value its input held, and of two slots of one
value the tensor a paired op read or made is taken before another holding the value.
"""

from __future__ import annotations

from dataclasses import replace

from torchdebug.compare._matching import match_records
from torchdebug.records import Record

_X, _Y, _Z = (-2.0, 3.0, 0.1, 5.0), (-1.5, 1.7, 0.0, 5.6), (-4.0, 4.0, 0.2, 9.0)
_ONES, _ZEROS, _MEAN, _CENTRED = (1.0, 1.0, 1.0, 2.0), (0.0, 0.0, 0.0, 0.0), (0.0, 0.2, 0.1, 0.5), (-2.1, 2.9, 0.0, 4.9)


def _slot(name: str, seq: int, stats: tuple, value: tuple[int, int | None] | None, capture: str, shape=(4, 4)) -> Record:
    """A tensor slot named ``{phase}/{module}/{op}#{call}/{io}.{arg}`` holding ``value`` (``(value_id,
    view_of)``: a tensor of version 0)."""
    call, slot = name.rsplit("/", 1)
    phase, module, op_call = call.split("/")
    op, index = op_call.split("#")
    io, arg = slot.split(".")
    minimum, maximum, mean, norm = stats
    value_id, view_of = value or (None, None)
    return Record(
        name=name, step=0, rank=0, phase=phase, module=module, op=op, call=int(index), seq=seq, io=io, arg=arg,
        dtype="float32", shape=list(shape), stats={"min": minimum, "max": maximum, "mean": mean, "norm": norm},
        capture=capture, value_id=value_id, version=None if value_id is None else 0, view_of=view_of,
    )  # fmt: skip


def _eager(*slots: tuple) -> list[Record]:
    return [_slot(name, seq, stats, value, "eager", *shape) for seq, (name, stats, value, *shape) in enumerate(slots)]


def _compiled(*slots: tuple) -> list[Record]:
    return [_slot(name, seq, stats, value, "graph", *shape) for seq, (name, stats, value, *shape) in enumerate(slots)]


def _partners(compiled: list[Record], eager: list[Record]) -> dict[str, tuple[str, str]]:
    """Each eager slot's compiled partner and how they were paired."""
    pairs = match_records(compiled, eager, compiled=True)
    return {p.b.name: (p.a.name, p.how) for p in pairs if p.a is not None and p.b is not None}


def _without_ids(records: list[Record]) -> list[Record]:
    return [replace(r, value_id=None, version=None, view_of=None) for r in records]


_LN = "forward/ln/aten.native_layer_norm.default#0"


def _layer_norm() -> tuple[list[Record], list[Record]]:
    """A LayerNorm whose weight is ones and bias zeros, decomposed by the compiler, then a linear."""
    eager = _eager(
        (f"{_LN}/input.0", _X, (1, None)),
        (f"{_LN}/input.2", _ONES, (2, None), (4,)),
        (f"{_LN}/input.3", _ZEROS, (3, None), (4,)),
        (f"{_LN}/output.0", _Y, (4, None)),
        ("forward/fc/aten.addmm.default#0/input.1", _Y, (4, None)),
        ("forward/fc/aten.addmm.default#0/output.0", _Z, (5, None)),
    )
    compiled = _compiled(
        ("forward/ln/aten.var_mean.correction#0/input.0", _X, (11, None)),
        ("forward/ln/aten.var_mean.correction#0/output.1", _MEAN, (12, None), (4, 1)),
        ("forward/ln/aten.sub.Tensor#0/input.0", _X, (11, None)),
        ("forward/ln/aten.sub.Tensor#0/output.0", _CENTRED, (13, None)),
        ("forward/ln/aten.mul.Tensor#0/input.0", _CENTRED, (13, None)),
        ("forward/ln/aten.mul.Tensor#0/output.0", _Y, (14, None)),  # before the weight: the same statistics
        ("forward/ln/aten.mul.Tensor#1/input.0", _Y, (14, None)),
        ("forward/ln/aten.mul.Tensor#1/input.1", _ONES, (15, None), (4,)),
        ("forward/ln/aten.mul.Tensor#1/output.0", _Y, (16, None)),
        ("forward/ln/aten.add.Tensor#1/input.0", _Y, (16, None)),
        ("forward/ln/aten.add.Tensor#1/input.1", _ZEROS, (17, None), (4,)),
        ("forward/ln/aten.add.Tensor#1/output.0", _Y, (18, None)),  # the LayerNorm's output
        ("forward/fc/aten.addmm.default#0/input.1", _Y, (18, None)),
        ("forward/fc/aten.addmm.default#0/output.0", _Z, (19, None)),
    )
    return compiled, eager


def test_a_layer_norms_output_pairs_with_the_node_after_its_weight_and_bias_not_one_with_its_statistics_before():
    compiled, eager = _layer_norm()
    partners = _partners(compiled, eager)
    assert partners[f"{_LN}/output.0"] == ("forward/ln/aten.add.Tensor#1/output.0", "value")  # what the linear reads
    assert partners[f"{_LN}/input.0"] == ("forward/ln/aten.var_mean.correction#0/input.0", "group")
    # without ids (an older dump) the first slot with the statistics is taken, as before
    inferred = _partners(_without_ids(compiled), _without_ids(eager))
    assert inferred[f"{_LN}/output.0"] == ("forward/ln/aten.mul.Tensor#0/output.0", "value")


def test_a_zero_bias_no_paired_op_reads_is_paired_at_the_boundary_not_by_another_zero_biass_flow():
    # another linear's zero bias, paired by its call, has the statistics of the LayerNorm's bias
    compiled, eager = _layer_norm()
    eager += _eager(("forward/proj/aten.addmm.default#0/input.0", _ZEROS, (6, None), (4,)))
    compiled += _compiled(("forward/proj/aten.addmm.default#0/input.0", _ZEROS, (20, None), (4,)))
    partners = _partners(compiled, eager)
    assert partners[f"{_LN}/input.3"] == ("forward/ln/aten.add.Tensor#1/input.1", "group")  # place and agreement only
    inferred = _partners(_without_ids(compiled), _without_ids(eager))
    assert inferred[f"{_LN}/input.3"] == ("forward/ln/aten.add.Tensor#1/input.1", "value")  # the other bias's flow


def test_a_detach_of_a_gradient_holds_the_gradient_the_compiled_graph_returns():
    # autograd's AccumulateGrad detaches the weight's gradient; the compiled graph returns the gradient itself
    grad = (-0.3, 0.2, 0.01, 1.1)
    eager = _eager(
        ("backward/fc/aten.mm.default#0/output.0", grad, (1, None)),
        ("backward/fc.weight/aten.detach.default#0/input.0", grad, (1, None)),
        ("backward/fc.weight/aten.detach.default#0/output.0", grad, (2, 1)),  # a view of the gradient
    )
    compiled = _compiled(("backward/fc/aten.mm.default#0/output.0", grad, (11, None)))
    partners = _partners(compiled, eager)
    assert partners["backward/fc.weight/aten.detach.default#0/output.0"] == ("backward/fc/aten.mm.default#0/output.0", "value")


def test_a_clone_the_compiler_inserts_passes_on_the_value_the_eager_op_reads():
    # dropout with p=0: the compiled graph clones the sum the eager LayerNorm reads directly
    eager = _eager(
        ("forward/emb/aten.add.Tensor#0/output.0", _X, (1, None)),
        (f"{_LN}/input.0", _X, (1, None)),
        (f"{_LN}/output.0", _Y, (2, None)),
    )
    compiled = _compiled(
        ("forward/emb/aten.add.Tensor#0/output.0", _X, (11, None)),
        ("forward/drop/aten.clone.default#0/input.0", _X, (11, None)),
        ("forward/drop/aten.clone.default#0/output.0", _X, (12, None)),
        ("forward/ln/aten.var_mean.correction#0/input.0", _X, (12, None)),
        ("forward/ln/aten.var_mean.correction#0/output.1", _MEAN, (13, None), (4, 1)),
    )
    partners = _partners(compiled, eager)
    assert partners[f"{_LN}/input.0"] == ("forward/ln/aten.var_mean.correction#0/input.0", "value")


def test_the_tensor_a_paired_op_made_is_taken_before_a_later_slot_holding_its_value():
    # the compiled backward adds a second gradient to sdpa's before the mul both sides run; the
    # eager slice (erased by the compiler) reads sdpa's output, the mul the slice's
    grad, summed = (-0.2, 0.3, 0.01, 1.0), (-0.2, 0.3, 0.011, 1.0)
    sdpa = "backward/attn/aten._scaled_dot_product_flash_attention_for_cpu_backward.default#0"
    eager = _eager(
        (f"{sdpa}/output.1", grad, (1, None)),
        ("backward/attn/aten.slice.Tensor#1/input.0", grad, (1, None)),
        ("backward/attn/aten.slice.Tensor#1/output.0", grad, (2, 1)),
        ("backward/attn/aten.mul.Tensor#0/input.0", grad, (2, 1)),
        ("backward/attn/aten.mul.Tensor#0/output.0", _Z, (3, None)),
    )
    compiled = _compiled(
        (f"{sdpa}/output.1", grad, (11, None)),
        ("backward/-/aten.add.Tensor#5/input.1", grad, (11, None)),
        ("backward/-/aten.add.Tensor#5/output.0", summed, (12, None)),
        ("backward/attn/aten.mul.Tensor#0/input.0", summed, (12, None)),
        ("backward/attn/aten.mul.Tensor#0/output.0", _Z, (13, None)),
    )
    partners = _partners(compiled, eager)
    assert partners["backward/attn/aten.slice.Tensor#1/input.0"] == (f"{sdpa}/output.1", "value")
    assert partners["backward/attn/aten.slice.Tensor#1/output.0"] == ("backward/attn/aten.mul.Tensor#0/input.0", "value")


def test_a_groups_output_pairs_in_its_module_when_the_flow_reaches_it_only_across_an_op_one_side_runs():
    # the compiled backward adds zeros to the loss's gradient between the log-softmax group and the
    # head's mm (another value by id); the flow reaches the eager output's partner only in the head
    grad, out = (-0.07, 0.002, 0.0, 0.3), (-0.5, 0.5, 0.01, 2.0)
    lsb = "backward/<root>/aten._log_softmax_backward_data.default#0"
    flat, batched = (16, 64), (2, 8, 64)
    eager = _eager(
        (f"{lsb}/output.0", grad, (1, None), flat),
        ("backward/<root>/aten.view.default#0/input.0", grad, (1, None), flat),
        ("backward/<root>/aten.view.default#0/output.0", grad, (2, 1), batched),
        ("backward/head/aten.view.default#0/input.0", grad, (2, 1), batched),
        ("backward/head/aten.view.default#0/output.0", grad, (3, 1), flat),  # the whole of its base
        ("backward/head/aten.mm.default#1/input.0", grad, (3, 1), flat),
        ("backward/head/aten.mm.default#1/output.0", out, (4, None)),
    )
    compiled = _compiled(
        ("backward/<root>/aten.sub.Tensor#0/output.0", grad, (11, None), flat),  # the group's output
        ("backward/<root>/aten.reshape.default#1/input.0", grad, (11, None), flat),
        ("backward/<root>/aten.reshape.default#1/output.0", grad, (12, 11), batched),
        ("backward/<root>/aten.add.Tensor#0/input.1", grad, (12, 11), batched),
        ("backward/<root>/aten.add.Tensor#0/output.0", grad, (13, None), batched),
        ("backward/head/aten.reshape.default#0/input.0", grad, (13, None), batched),
        ("backward/head/aten.reshape.default#0/output.0", grad, (14, 13), flat),
        ("backward/head/aten.mm.default#1/input.0", grad, (14, 13), flat),
        ("backward/head/aten.mm.default#1/output.0", out, (15, None)),
    )
    partners = _partners(compiled, eager)
    assert partners[f"{lsb}/output.0"] == ("backward/<root>/aten.sub.Tensor#0/output.0", "group")


def test_fsdps_unsharded_parameter_holds_the_value_of_its_all_gathers_view():
    # FSDP2 views the all-gathered buffer as the weight; the linear reads the unsharded parameter, a
    # tensor over that memory that no recorded op made and no view names
    weight = (-0.25, 0.25, -0.002, 1.4)
    eager = _eager(
        ("forward/<root>/aten.as_strided.default#0/output.0", weight, (2, 1), (2, 4)),
        ("forward/fc/aten.t.default#0/input.0", weight, (3, None), (2, 4)),
        ("forward/fc/aten.t.default#0/output.0", weight, (4, 3), (4, 2)),
    )
    for record in eager:
        record.stride = [1, 2] if record.shape == [4, 2] else [4, 1]
    compiled = _compiled(
        ("forward/fc/aten.t.default#0/input.0", weight, (11, None), (2, 4)),
        ("forward/fc/aten.t.default#0/output.0", weight, (12, 11), (4, 2)),
    )
    partners = _partners(compiled, eager)
    assert partners["forward/<root>/aten.as_strided.default#0/output.0"] == ("forward/fc/aten.t.default#0/input.0", "value")


def test_a_recomputed_activation_the_backward_reads_holds_the_forward_value():
    # activation checkpointing runs the view again in the backward; autograd hands mm a new view of the
    # recomputed memory, the compiled backward the value its forward graph saved
    eager = _eager(
        ("forward/fc/aten.view.default#0/output.0", _X, (1, 9)),
        ("recompute/fc/aten.view.default#0/output.0", _X, (2, 19)),
        ("backward/fc/aten.mm.default#1/input.1", _X, (3, 19)),
        ("backward/fc/aten.mm.default#1/output.0", _Z, (4, None)),
    )
    eager[1].fwd = "forward/fc/aten.view.default#0"
    compiled = _compiled(
        ("forward/fc/aten.reshape.default#0/output.0", _X, (11, None)),
        ("backward/fc/aten.mm.default#1/input.1", _X, (11, None)),
        ("backward/fc/aten.mm.default#1/output.0", _Z, (12, None)),
    )
    partners = _partners(compiled, eager)
    assert partners["forward/fc/aten.view.default#0/output.0"] == ("forward/fc/aten.reshape.default#0/output.0", "value")
