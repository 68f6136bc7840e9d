"""The C++ slot walk (``native/slot_walk.cpp`` through ``native_values.py``) gives value ids from
addresses: the tensor at an address is the one last seen there while its memory is the same; an
op's output is new unless it is one of its arguments; a backward op's input over the memory a value
was made in is that value; views name their memory's owner; a freed tensor's address names another
tensor. Some cases on hand-made slots, some on the observer's slots of real tensors."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from torchdebug.capture.eager import op_info
from torchdebug.capture.native_records import NativeStepCapture, OpSlotNames, op_overload
from torchdebug.capture.native_values import CHANGED, RECOMPUTED, SlotWalk, WalkedSlots, distinct, load_slot_walk
from torchdebug.native import build
from torchdebug.native.observer import GRAD_ON, NativeObserver, ObservedOps, load_observer
from torchdebug.records import UNINITIALISED, Record

pytestmark = pytest.mark.skipif(build._cxx_compiler() is None, reason="no C++ compiler to build the walk")

_A, _B, _C = 0x100, 0x200, 0x300
"""``TensorImpl`` addresses."""
_OPS = ("aten.neg.default", "aten.view.default", "aten.add_.Tensor", "aten.empty.memory_format", "aten.t.default")
"""Hand-made rows' ops, by id: a new output, a view, an in-place write, an allocation, a transpose."""
_NEG, _VIEW, _ADD_, _EMPTY, _T = range(len(_OPS))


def _walk() -> SlotWalk:
    library = load_slot_walk()
    assert library is not None, "a C++ compiler is here: the walk must build"
    walk = SlotWalk(library)
    for op_id, name in enumerate(_OPS):
        overload = op_overload(name)
        names = OpSlotNames.of(overload)
        walk.add_op(op_id, op_info(overload), names.inputs, 1, list_result=False, one_tensor=True)
    return walk


def _drained(
    rows: list[tuple],
    slots: list[tuple],
    first_row: int = 0,
    freed: tuple[int, ...] = (),
    kept: tuple[int, ...] = (),
    strides: dict[int, tuple[int, ...]] | None = None,
    made: tuple[int, ...] | None = None,
) -> ObservedOps:
    """Rows ``(op id, backward[, seq, module context])`` (``made``: the last node made before each,
    default -1) and their slots ``(row, io, address,
    storage, shape[, base[, version, summed]])`` (contiguous float32 CPU tensors at offset 0, version
    0 and not summed unless given; summed: its fingerprint taken too), as the observer drains them;
    ``kept``: the slots whose tensor it kept; ``strides``: by slot, those of a slot not contiguous."""
    shapes = [slot[4] for slot in slots]
    layouts = [(strides or {}).get(index) or _contiguous(shape) for index, shape in enumerate(shapes)]
    summed = [slot[7] if len(slot) > 7 else 0 for slot in slots]
    count = len(slots)
    return ObservedOps(
        names=list(_OPS),
        first_row=first_row,
        op=np.array([row[0] for row in rows], np.int32),
        seq=np.array([row[2] if len(row) > 2 else -1 for row in rows], np.int64),
        backward=np.array([row[1] for row in rows], np.int8),
        module=np.array([row[3] if len(row) > 3 else -1 for row in rows], np.int64),
        slot_row=np.array([slot[0] for slot in slots], np.int64),
        slot_io=np.array([slot[1] for slot in slots], np.int8),
        slot_arg=np.array([0] * count, np.int16),
        slot_element=np.array([-1] * count, np.int16),
        slot_dtype=np.array([6] * count, np.int8),
        slot_flag=np.array([0] * count, np.int8),
        slot_ndim=np.array([len(shape) for shape in shapes], np.int8),
        slot_value=np.array([slot[2] for slot in slots], np.int64),
        slot_version=np.array([slot[6] if len(slot) > 6 else 0 for slot in slots], np.int64),
        slot_storage=np.array([slot[3] for slot in slots], np.int64),
        slot_offset=np.array([0] * count, np.int64),
        shape=np.array([size for shape in shapes for size in shape], np.int64),
        stride=np.array([step for layout in layouts for step in layout], np.int64),
        slot_device_type=np.array([0] * count, np.int8),
        slot_device_index=np.array([-1] * count, np.int8),
        slot_has_stats=np.array(summed, np.int8),
        stats=np.array([0.0] * (8 * count), np.float64),
        kept_slot=np.array(kept, np.int64),
        kept_staged=np.array([-1] * len(kept), np.int64),
        stack=np.array([-1] * len(rows), np.int64),
        slot_base=np.array([slot[5] if len(slot) > 5 else 0 for slot in slots], np.int64),
        slot_has_fingerprint=np.array(summed, np.int8),
        slot_fingerprint=np.array([0] * count, np.int64),
        mark=np.array([0] * len(rows), np.int8),
        made=np.array(made or [-1] * len(rows), np.int64),
        kept=[],
        freed=np.array(freed, np.int64),
    )


def _ids(walk: SlotWalk, ops: ObservedOps) -> WalkedSlots:
    return walk.walk(ops, np.ones(len(ops.op), np.int8), inputs=True, outputs=True, statistics=False)


@pytest.mark.parametrize(("seed", "keys"), [(1, 7), (2, 20), (3, 509)])
def test_the_walks_address_map_answers_as_a_standard_hash_map_over_colliding_inserts_and_erases(seed: int, keys: int) -> None:
    """The walk's maps by address (open addressing, erasure by shifting entries back) keep what a
    node-based map keeps, over many inserts and erases of keys that share probe paths."""
    library = load_slot_walk()
    assert library is not None, "a C++ compiler is here: the walk must build"
    library.td_walk_check_address_map.restype = ctypes.c_int64
    library.td_walk_check_address_map.argtypes = [ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64]
    assert library.td_walk_check_address_map(300_000, seed, keys) == 0


@pytest.mark.parametrize("size", [0, 1, 7, 1000])
def test_distinct_is_np_uniques_answer(size: int) -> None:
    values = np.random.default_rng(size).integers(-5, 20, size=(size, 2))
    assert np.array_equal(distinct(values), np.unique(values)) and distinct(values).dtype == values.dtype


def test_an_address_reused_over_other_memory_is_another_tensor() -> None:
    ids = _ids(_walk(), _drained([(_NEG, False)] * 3, [(0, 1, _A, 1, (4,)), (1, 0, _A, 1, (4,)), (2, 0, _A, 2, (4,))]))
    made, again, other = ids.value_ids.tolist()
    assert again == made and other != made


def test_an_in_place_ops_output_is_the_argument_it_wrote_and_a_new_output_is_new() -> None:
    slots = [(0, 0, _A, 1, (4,)), (0, 1, _A, 1, (4,)), (1, 0, _A, 1, (4,)), (1, 1, _B, 2, (4,))]
    written, returned, read, new = _ids(_walk(), _drained([(_ADD_, False), (_NEG, False)], slots)).value_ids.tolist()
    assert returned == written == read and new != written


def test_a_saved_output_unpacked_in_the_backward_is_the_value_made_in_its_memory() -> None:
    slots = [(0, 1, _A, 1, (4,)), (1, 0, _B, 1, (4,)), (2, 0, _C, 1, (4,))]
    made, unpacked, elsewhere = _ids(_walk(), _drained([(_NEG, False), (_NEG, True), (_NEG, False)], slots)).value_ids.tolist()
    assert unpacked == made  # a new TensorImpl over the same memory, in the backward
    assert elsewhere != made  # outside the backward: another tensor


def test_a_view_names_the_first_owner_of_its_memory_and_a_view_first_seen_its_base() -> None:
    rows = [(_NEG, False), (_VIEW, False), (_VIEW, False), (_NEG, False), (_NEG, False)]
    slots = [
        (0, 1, _A, 1, (4,)),
        (1, 0, _A, 1, (4,)),
        (1, 1, _B, 1, (2, 2)),
        (2, 0, _B, 1, (2, 2)),
        (2, 1, _C, 1, (4, 1)),
        (3, 0, 0x400, 9, (2,), 0x500),  # a slice of a batch made before capture
        (4, 0, 0x500, 9, (4,)),
    ]
    walked = _ids(_walk(), _drained(rows, slots))
    ids, view_of = walked.value_ids.tolist(), walked.view_of.tolist()
    owner = ids[0]
    assert view_of[2] == view_of[4] == owner  # a view, and a view of it, name the owner
    assert view_of[0] == view_of[1] == -1
    assert view_of[5] not in (owner, ids[5], -1)
    assert ids[6] == view_of[5]  # the base, seen later, is that value


def test_a_freed_tensors_address_names_another_tensor_after_the_drain_that_reports_it() -> None:
    walk = _walk()
    (made,) = _ids(walk, _drained([(_NEG, False)], [(0, 1, _A, 1, (4,))])).value_ids.tolist()
    (held,) = _ids(walk, _drained([(_NEG, False)], [(1, 0, _A, 1, (4,))], first_row=1, freed=(_A,))).value_ids.tolist()
    assert held == made  # its slots in the drain that reports it freed are still it
    (reused,) = _ids(walk, _drained([(_NEG, False)], [(2, 0, _A, 1, (4,))], first_row=2)).value_ids.tolist()
    assert reused != made  # the same address over the same memory: the allocator gave both to a new tensor


def test_a_tensor_seen_again_at_its_version_and_a_view_with_its_elements_share_the_statistics_taken_first() -> None:
    rows = [(_NEG, False)] * 3 + [(_VIEW, False)] + [(_NEG, False)] * 2
    slots = [
        (0, 0, _A, 1, (4,), 0, 0, 1),  # the callback's sums
        (0, 1, _B, 2, (4,), 0, 0, 1),
        (1, 0, _A, 1, (4,), 0, 0, 1),  # again at version 0: the first slot's
        (1, 1, _C, 3, (4,), 0, 0, 1),
        (2, 0, _A, 1, (4,), 0, 1, 0),  # version 1, kept: reduced at the flush
        (2, 1, 0x400, 4, (4,), 0, 0, 1),
        (3, 0, _A, 1, (4,), 0, 1, 0),  # version 1 again: that
        (3, 1, 0x500, 1, (2, 2), 0, 1, 0),  # a view with its elements: its argument's
        (4, 0, 0x600, 5, (0,)),  # no elements
        (5, 0, 0x700, 6, (4,)),  # neither summed nor kept: changed before the flush
    ]
    walked = _walk().walk(_drained(rows, slots, kept=(4,)), np.ones(6, np.int8), inputs=True, outputs=True, statistics=True)
    assert walked.stats.tolist() == [0, 1, 0, 3, -2, 5, -2, -2, -3, -1]
    assert walked.taken.tolist() == [4, -1]  # the kept tensor's slot, then the statistics of no elements
    assert walked.errors.tolist() == [0] * 9 + [CHANGED]


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    steps, step = [], 1
    for size in reversed(shape):
        steps.append(step)
        step *= size
    return tuple(reversed(steps))


def test_a_view_reading_its_arguments_memory_in_order_shares_its_fingerprint_and_a_transpose_takes_its_own() -> None:
    rows = [(_NEG, False), (_VIEW, False), (_T, False), (_NEG, False)]
    slots = [
        (0, 0, _A, 1, (2, 2), 0, 0, 1),  # the callback's sums and fingerprint
        (0, 1, _B, 2, (2, 2), 0, 0, 1),
        (1, 0, _B, 2, (2, 2), 0, 0, 1),  # again at version 0: the output's
        (1, 1, _C, 2, (4,), _B, 0, 1),  # a view in the same order: its argument's statistics and fingerprint
        (2, 0, _B, 2, (2, 2), 0, 0, 1),
        (2, 1, 0x400, 2, (2, 2), _B, 0, 1),  # a transpose: its argument's statistics, its own fingerprint
        (3, 0, 0x400, 2, (2, 2), _B, 1, 1),  # its base written since: a dispatch mode reads it again
    ]
    ops = _drained(rows, slots, strides={5: (1, 2), 6: (1, 2)})
    walked = _walk().walk(ops, np.ones(4, np.int8), inputs=True, outputs=True, statistics=True, fingerprints=True)
    assert walked.stats.tolist() == [0, 1, 1, 1, 1, 1, 6]
    assert walked.fingerprints.tolist() == [0, 1, 1, 1, 1, 5, 6]
    alone = _walk().walk(ops, np.ones(4, np.int8), inputs=True, outputs=True, statistics=False, fingerprints=True)
    assert alone.stats.tolist() == [-1] * 7 and alone.fingerprints.tolist() == walked.fingerprints.tolist()


def test_a_kept_tensor_whose_statistics_a_transpose_shares_is_reduced_again_for_its_fingerprint() -> None:
    rows = [(_NEG, False), (_T, False)]
    slots = [(0, 0, _A, 1, (2, 2)), (0, 1, _B, 2, (2, 2)), (1, 0, _B, 2, (2, 2)), (1, 1, _C, 2, (2, 2), _B)]
    ops = _drained(rows, slots, kept=(0, 1, 2, 3), strides={3: (1, 2)})
    walked = _walk().walk(ops, np.ones(2, np.int8), inputs=True, outputs=True, statistics=True, fingerprints=True)
    assert walked.taken.tolist() == [0, 1, 3]  # one entry a kept tensor, for both
    assert walked.stats.tolist() == [-2, -3, -3, -3] and walked.fingerprints.tolist() == [-2, -3, -3, -4]


def test_an_allocation_holds_no_value_until_an_op_writes_it() -> None:
    walk = _walk()
    rows = [(_EMPTY, False), (_NEG, False), (_ADD_, False), (_NEG, False)]
    slots = [(0, 1, _A, 1, (4,)), (1, 0, _A, 1, (4,)), (1, 1, _B, 2, (4,)), (2, 0, _A, 1, (4,)), (2, 1, _A, 1, (4,))]
    slots.append((3, 0, _A, 1, (4,)))
    walked = walk.walk(_drained(rows, slots), np.ones(4, np.int8), inputs=True, outputs=True, statistics=False)
    assert [walk.whys[code] for code in walked.unread.tolist()] == [UNINITIALISED] * 2 + [None, UNINITIALISED, None, None]


def _calls(walk: SlotWalk, ops: ObservedOps, parameters: tuple[int, ...] = (), marks: tuple[int, ...] = ()) -> list[tuple]:
    rows = len(ops.op)
    calls = walk.name_rows(
        ops,
        np.full(rows, -1, np.int64),
        np.array(parameters, np.int64),
        np.array(marks or [0] * rows, np.int8),
        np.zeros((rows, 2), np.int64),
    )
    return list(zip(calls.phase.tolist(), calls.module.tolist(), calls.call.tolist(), calls.fwd_call.tolist()))


def test_a_recomputed_row_repeats_the_forward_call_before_the_node_it_rebuilds_for() -> None:
    """recompute.py's pairing: a non-reentrant recomputation, run while node 11 unpacks, starts at the
    last forward call of its op and module before the call that made node 11; the node it makes (21)
    is differentiated as that forward call."""
    walk = _walk()
    rows = [(_NEG, False, 10, 0), (_ADD_, False, 11, 0), (_NEG, True, 11, 0), (_T, True, 21, 0)]
    marks = (GRAD_ON, GRAD_ON, RECOMPUTED | GRAD_ON, GRAD_ON)
    assert _calls(walk, _drained(rows, [], made=(9, 10, 20, 21)), marks=marks) == [
        (0, 0, 0, -1),
        (0, 0, 0, -1),
        (3, 0, 0, 0),  # recompute, module 0, paired with forward neg#0
        (1, 0, 0, 0),  # the backward of the node the recomputation made: forward neg#0's
    ]


def test_rows_are_counted_on_across_a_steps_drains_and_a_backward_row_names_its_forward_row() -> None:
    walk = _walk()
    assert _calls(walk, _drained([(_NEG, False, 5, 0)], [])) == [(0, 0, 0, -1)]
    later = _drained([(_NEG, False, 6, 0), (_NEG, True, 5, 7), (_NEG, True, -1, 3), (_NEG, False, -1, -2)], [], first_row=1)
    assert _calls(walk, later, parameters=(3,)) == [
        (0, 0, 1, -1),  # forward, module 0, its second call
        (1, 0, 0, 0),  # backward of seq 5: the forward row's module, its call 0 as fwd
        (1, 3, 0, -1),  # a gradient accumulation: named after the parameter (context 3), counted apart
        (2, -1, 0, -1),  # an optimizer step: no module
    ]
    walk.next_step()
    assert _calls(walk, _drained([(_NEG, True, 5, 7), (_NEG, False, 5, 0)], [], first_row=5)) == [(1, -1, 0, -1), (0, 0, 0, -1)]


def test_the_walk_fails_on_an_op_it_was_not_told_of() -> None:
    walk = SlotWalk(load_slot_walk())
    with pytest.raises(RuntimeError, match="not told of"):
        _ids(walk, _drained([(_NEG, False)], [(0, 1, _A, 1, (4,))]))


@pytest.fixture(scope="module")
def observer() -> NativeObserver:
    loaded = load_observer()
    assert loaded is not None, "a C++ compiler is here: the observer must build"
    return loaded


def _records(observer: NativeObserver, run) -> list[Record]:  # noqa: ANN001
    capture = NativeStepCapture(observer, None)
    capture.start()
    run()
    capture.stop()
    return capture.records()


def test_views_and_in_place_writes_of_real_tensors_keep_their_values(observer: NativeObserver) -> None:
    x = torch.randn(4, 4)

    def run() -> None:
        y = x.view(16)
        y.mul_(2.0)
        x.transpose(0, 1).contiguous().neg()

    records = {record.name: record for record in _records(observer, run)}
    source = records["forward/-/aten.view.default#0/input.0"]
    view = records["forward/-/aten.view.default#0/output.0"]
    assert view.view_of == source.value_id != view.value_id and source.view_of is None
    written = records["forward/-/aten.mul_.Tensor#0/input.0"]
    after = records["forward/-/aten.mul_.Tensor#0/output.0"]
    assert written.value_id == after.value_id == view.value_id and after.version == written.version + 1
    transposed = records["forward/-/aten.transpose.int#0/output.0"]
    assert transposed.view_of == source.value_id  # a view of the same memory names its owner
    copied = records["forward/-/aten.clone.default#0/output.0"]
    assert copied.view_of is None and records["forward/-/aten.neg.default#0/input.0"].value_id == copied.value_id


def test_a_tensor_freed_and_its_address_taken_again_gets_a_new_value_id(observer: NativeObserver) -> None:
    """Over two captures' drains of one walk: tensors freed between them, their memory reused."""
    capture = NativeStepCapture(observer, None)
    ids = []
    for _ in range(3):
        capture.start()
        made = torch.ones(8).add(1.0)
        made.neg()
        capture.stop()
        records = capture.records()
        ids.append({record.value_id for record in records if record.op == "aten.neg.default" and record.io == "input"})
        del made
    assert len(ids[0] | ids[1] | ids[2]) == 3


def test_the_walks_memory_stays_that_of_the_live_tensors_step_after_step(observer: NativeObserver) -> None:
    """A training loop holds as many addresses and unwritten storages at its ninth step as at its
    third (freed tensors are forgotten), and a step's memories no more than its records."""
    from tests.capture.native_compare import gpt_training

    model, step = gpt_training()
    capture = NativeStepCapture(observer, model)
    held, records = [], []
    for _ in range(9):
        capture.start()
        step()
        capture.stop()
        records.append(len(capture.records()))
        held.append(capture._slot_walk.entries())  # noqa: SLF001
        capture.next_step()
    assert (held[2]["addresses"], held[2]["unwritten"]) == (held[8]["addresses"], held[8]["unwritten"])
    assert all(0 < entries["made_in"] < count for entries, count in zip(held, records))
