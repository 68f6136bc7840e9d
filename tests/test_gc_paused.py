"""The paused collector: restored on exit, what was made meanwhile moved to the oldest generation
without a collection, a program's frozen objects left frozen, cycles still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from torchdebug.gc_paused import paused_gc


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _in_generation(obj: object, generation: int) -> bool:
    return any(held is obj for held in gc.get_objects(generation))


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector on and nothing frozen, as a plain program has it; restored after."""
    enabled = gc.isenabled()
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    gc.enable()
    yield
    (gc.enable if enabled else gc.disable)()
    if frozen:
        gc.freeze()


def test_what_was_made_while_paused_joins_the_oldest_generation_with_the_collector_back_on(collector: None) -> None:
    collections = gc.get_stats()[0]["collections"]
    with paused_gc():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]
    assert gc.isenabled()
    assert _in_generation(made, 2) and _in_generation(made[-1], 2)
    assert not _in_generation(made, 0) and gc.get_count()[0] < 100
    assert gc.get_stats()[0]["collections"] == collections  # moved, not walked by a collection
    assert gc.get_freeze_count() == 0


def test_objects_a_program_froze_stay_frozen(collector: None) -> None:
    kept = [[]]
    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        with paused_gc():
            made = [[index] for index in range(10)]
        assert 0 < gc.get_freeze_count() <= frozen  # not unfrozen (a frozen object freed meanwhile leaves the count)
        assert not _in_generation(kept, 2)  # still in the permanent generation
        assert not _in_generation(made, 2)  # the young stay young: no unfreeze for them
    finally:
        gc.unfreeze()


def test_a_paused_collector_stays_paused_and_an_error_restores_it(collector: None) -> None:
    gc.disable()
    with paused_gc():
        pass
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("in the block")
    assert gc.isenabled()


def test_a_cycle_made_while_paused_is_collected_after(collector: None) -> None:
    with paused_gc():
        first, second = _Node(), _Node()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
    assert gone() is not None  # a cycle: no reference count frees it
    gc.collect()
    assert gone() is None
