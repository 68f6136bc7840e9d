"""Value ids from addresses: the tensor at an address is the one last seen there while its memory
is the same; an op's output is new unless it is one of its arguments; a backward op's input over the
memory a value was made in is that value; views name their memory's owner."""

from __future__ import annotations

from torchdebug.capture.native_values import NativeValueIds

_A, _B, _C = 0x100, 0x200, 0x300
"""``TensorImpl`` addresses."""


def _memory(storage: int, shape: tuple[int, ...] = (4,)) -> tuple:
    return (storage, 0, shape, 6)


def test_an_address_reused_over_other_memory_is_another_tensor() -> None:
    ids = NativeValueIds()
    made = ids.of(0, 1, _A, _memory(1))
    assert ids.of(1, 0, _A, _memory(1)) == made
    assert ids.of(2, 0, _A, _memory(2)) != made


def test_an_in_place_ops_output_is_the_argument_it_wrote_and_a_new_output_is_new() -> None:
    ids = NativeValueIds()
    written = ids.of(0, 0, _A, _memory(1))
    assert ids.of(0, 1, _A, _memory(1)) == written
    assert ids.of(1, 1, _B, _memory(2)) not in (written,)


def test_a_saved_output_unpacked_in_the_backward_is_the_value_made_in_its_memory() -> None:
    ids = NativeValueIds()
    made = ids.of(0, 1, _A, _memory(1))
    assert ids.of(5, 0, _B, _memory(1), backward=True) == made  # a new TensorImpl over the same memory
    assert ids.of(6, 0, _C, _memory(1), backward=False) != made  # outside the backward: another tensor


def test_a_view_names_the_first_owner_of_its_memory_and_a_view_first_seen_its_base() -> None:
    ids = NativeValueIds()
    owner = ids.of(0, 1, _A, _memory(1))
    view = ids.of(1, 1, _B, _memory(1, (2, 2)))
    ids.made_view(view, owner)
    view_of_view = ids.of(2, 1, _C, _memory(1, (4, 1)))
    ids.made_view(view_of_view, view)
    assert ids.view_of[view] == ids.view_of[view_of_view] == owner
    outside = ids.of(3, 0, 0x400, _memory(9, (2,)), base=0x500)  # a slice of a batch made before capture
    assert ids.view_of[outside] not in (owner, outside)
    assert ids.of(4, 0, 0x500, _memory(9)) == ids.view_of[outside]  # the base, seen later, is that value
