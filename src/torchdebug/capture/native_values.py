"""What the native path's slots hold that only their order tells, walked in C++ once per drain
(``native/slot_walk.cpp``, loaded here): value ids (as ``value_ids.py``'s ``ValueIds`` gives them to
eager capture's slots, from ``TensorImpl`` addresses), the statistics a slot shares with an earlier
one (``CaptureSession``'s sharing), and memory that holds no value of the run yet (as
``unwritten.py``'s ``UnwrittenStorages`` follows it). :class:`SlotWalk` keeps that state for one
capture; :meth:`SlotWalk.walk` gives it per recorded slot as arrays (:class:`WalkedSlots`), which
``store/_slot_columns.py`` turns into the record batch. The rules are in the C++ file's header.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from torchdebug.capture.eager import OpInfo
from torchdebug.capture.recompute import RECOMPUTE
from torchdebug.native.addresses import c_array, data_address
from torchdebug.native.build import load_torch_library
from torchdebug.native.observer import ObservedOps
from torchdebug.records import UNINITIALISED

__all__ = [
    "CHANGED",
    "CHANGED_TEXT",
    "FIRST_OWNER",
    "PHASES",
    "RECOMPUTED",
    "Owners",
    "RowCalls",
    "SlotWalk",
    "WalkedSlots",
    "distinct",
    "load_slot_walk",
]

CHANGED = 3
"""A ``WalkedSlots.errors`` code: a kept tensor changed or freed before the flush (after ``observer.py``'s flags)."""
CHANGED_TEXT = (
    "not read by the native path: freed before the next op, or changed in place before the flush "
    "(TORCHDEBUG_NATIVE=0 reads it at the op)"
)
"""The ``capture_error`` of such a slot."""

_MUTABLE, _MAKES_VIEWS, _VALUE_PRESERVING, _ONE_TENSOR, _LIST_RESULT, _SKIPPED = 1, 2, 4, 8, 16, 32
_ACCUMULATES, _DETACH, _COLLECTIVE, _MODULE, _UNRETURNED = 64, 128, 256, 512, 1024
"""``td_walk_op``'s flags (``OpFlag`` in the C++ file)."""
_ENGINE_SUM = "aten.add_.Tensor"
"""The op autograd's engine sums gradients with in place, which a dispatch mode runs out of place."""

_INPUT_COLUMNS = (
    "op", "backward", None, "slot_row", "slot_io", "slot_arg", "slot_element", "slot_dtype", "slot_flag", "slot_ndim",
    "slot_value", "slot_version", "slot_storage", "slot_offset", "shape", "slot_device_type", "slot_device_index",
    "slot_has_stats", "slot_base", "kept_slot", "freed", "slot_has_fingerprint", "stride",
)  # fmt: skip
"""The ``ObservedOps`` columns ``td_walk`` reads, in its order (``None``: which rows are recorded)."""

_OUTPUT_TYPES = (np.int64, np.int64, np.int64, np.int64, np.int8, np.int8, np.int32, np.int64)
"""``td_walk``'s per-slot outputs: :class:`WalkedSlots`' first eight fields."""


class WalkedSlots(NamedTuple):
    """The recorded slots of one drain, in row order, as the walk gives them."""

    slots: np.ndarray
    """Each recorded slot's index in the drained columns."""
    value_ids: np.ndarray
    view_of: np.ndarray
    """The ``value_id`` of the memory's owner, for a view; -1 for none."""
    stats: np.ndarray
    """Where the statistics come from: ``>= 0`` the callback's sums of that drained slot, ``-1`` none,
    ``<= -2`` the entry ``-2 - ref`` of :attr:`taken`."""
    errors: np.ndarray
    """``capture_error`` codes: 0 none, then ``SUBCLASS``, ``NESTED`` (``observer.py``), 3 changed
    before the flush (a kept tensor written or freed: not read)."""
    unread: np.ndarray
    """Why the slot is described and not read: an index into :attr:`SlotWalk.whys` (0: it is read)."""
    args: np.ndarray
    """Each slot's ``arg``: an index into :attr:`SlotWalk.args`."""
    fingerprints: np.ndarray
    """Where the fingerprint comes from, as :attr:`stats`: the callback's of a drained slot, none, or
    an entry of :attr:`taken` (shared where ``CaptureSession.share_alias`` shares it)."""
    taken: np.ndarray
    """The drained slots whose kept tensor is reduced at the flush; -1: the statistics (and
    fingerprint) of no elements."""


PHASES = ("forward", "backward", "optimizer", RECOMPUTE)
"""``RowCalls.phase`` codes' names (-1: a row capture skips)."""


class RowCalls(NamedTuple):
    """Each drained row's call, as :meth:`SlotWalk.name_rows` gives it."""

    phase: np.ndarray
    """An index into :data:`PHASES`; -1 for an op capture skips (``record_function``'s bookkeeping)."""
    module: np.ndarray
    """A module context (a path's index), -1 for none."""
    call: np.ndarray
    """The call index per (phase, module, op), in row order, counted on through the step."""
    fwd_module: np.ndarray
    fwd_op: np.ndarray
    """For a backward row, the forward row that made its autograd node, for a recomputed row the
    forward row it repeats: its module, op id (-1: none), call and phase (a recomputed call's own,
    for a backward row of a node a recomputation made)."""
    fwd_call: np.ndarray
    stack: np.ndarray
    """The row's stack as given, or for a backward row its forward row's (-1: none)."""
    fwd_phase: np.ndarray


class Owners(NamedTuple):
    """The owners of FSDP2 groups' ops a drain's rows name (``observer.cpp``'s Owners), by index."""

    phases: tuple[int, ...] = ()
    """Each owner's phase code (:data:`PHASES`), -1 where the row keeps its own (the group is idle)."""
    modules: tuple[int, ...] = ()
    """Each owner's module context."""


NO_OWNERS = Owners()

FIRST_OWNER = -3
"""Module contexts from here down name an owner: ``FIRST_OWNER - context`` (``slot_walk.cpp``'s ``kFirstOwner``)."""


RECOMPUTED = 4
"""The row mark :meth:`SlotWalk.name_rows` takes beside the observer's (``ObservedOps.mark``:
``GRAD_ON``, ``CHECKPOINT_NODE``): a recomputation's op or checkpoint's own bookkeeping (phase
``recompute``)."""


class SlotWalk:
    """The walk's state for one capture (value ids of the run, this step's statistics, unwritten
    storages), and the ops it was told of."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        self._handle = ctypes.c_void_p(library.td_walk_new())
        if not self._handle:
            raise MemoryError("native/slot_walk.cpp: no memory for a walk")
        weakref.finalize(self, library.td_walk_free, self._handle)
        self.whys: list[str | None] = [None, UNINITIALISED]
        """Why a slot is not read, by the code the walk gives (``UNINITIALISED`` is 1, as in the C++ file)."""
        self.args: list[str] = []
        """Each ``arg`` the walk named (``0``, ``1.2``, ``out``), by code."""
        self.io_args: list[str] = []
        """The same with its side: ``input.0``, ``output.1``."""
        self._told = np.zeros(0, bool)
        """By op id: whether :meth:`add_op` told the walk of it."""

    def next_step(self) -> None:
        """Forget the memory values were made in and the statistics taken: another step's tensors fill it."""
        self._lib.td_walk_next_step(self._handle)

    def untold(self, op_ids: np.ndarray) -> list[int]:
        """The distinct ids of ``op_ids`` that :meth:`add_op` did not tell the walk of (mostly none:
        one look-up per row, no sort)."""
        told = self._told
        if not op_ids.size or (op_ids.max() < len(told) and told[op_ids].all()):
            return []
        return [op_id for op_id in distinct(op_ids).tolist() if op_id >= len(told) or not told[op_id]]

    def add_op(
        self, op_id: int, info: OpInfo, inputs: tuple[str, ...], results: int, *, list_result: bool, one_tensor: bool
    ) -> None:
        """Tell the walk of observer op ``op_id``: eager capture's facts of it (``info``), its
        inputs' names by schema position (``OpSlotNames.inputs``), its number of results, whether it
        returns one list (its elements are the results) or one tensor."""
        flags = (
            _MUTABLE * info.mutable
            | _MAKES_VIEWS * info.makes_views
            | _VALUE_PRESERVING * info.value_preserving
            | _ONE_TENSOR * one_tensor
            | _LIST_RESULT * list_result
            | _SKIPPED * info.skipped
            | _ACCUMULATES * (info.name == _ENGINE_SUM)
            | _DETACH * info.detach
            | _COLLECTIVE * (info.collective and not info.functional)
            | _UNRETURNED * (bool(info.written) and results == 0)
        )
        unread_in, unread_out = info.unread_inputs, info.unread_outputs
        in_codes = bytes(self._code(unread_in.get(name, unread_in.get("*"))) if unread_in else 0 for name in inputs)
        keyed = [int(key) for key in unread_out if key.isdigit()]
        width = max(keyed, default=-1) + 1 if list_result else results
        star = unread_out.get("*")
        out_codes = bytes(self._code(unread_out.get(str(index), star)) for index in range(width))
        self._tell(op_id, flags, inputs, in_codes, out_codes, self._code(star))

    def add_module_op(self, op_id: int) -> None:
        """Tell the walk that observer op ``op_id`` is ``observer.py``'s ``MODULE_ROW_OP``: its rows are
        module calls' tensors (``native_modules.py``), not named as calls, their slots walked as
        inputs whichever sides are recorded."""
        self._tell(op_id, _MODULE | _SKIPPED, (), b"", b"", 0)

    def _tell(self, op_id: int, flags: int, inputs: tuple[str, ...], in_codes: bytes, out_codes: bytes, other: int) -> None:
        names = "".join(f"{name}\n" for name in inputs).encode()
        if self._lib.td_walk_op(self._handle, op_id, flags, names, len(inputs), in_codes, len(out_codes), out_codes, other):
            raise MemoryError("native/slot_walk.cpp: no memory for an op's facts")
        if op_id >= len(self._told):
            self._told = np.concatenate([self._told, np.zeros(op_id + 1 - len(self._told), bool)])
        self._told[op_id] = True

    def _code(self, why: str | None) -> int:
        if why not in self.whys:
            self.whys.append(why)
        return self.whys.index(why)

    def entries(self) -> dict[str, int]:
        """What the walk holds: the addresses it knows (live tensors, and those freed since the last
        drain), the memories values were made in and the statistics seen this step, the unwritten storages."""
        counts = c_array(ctypes.c_int64, 4)()
        self._lib.td_walk_entries(self._handle, counts)
        return dict(zip(("addresses", "made_in", "seen", "unwritten"), counts))

    def name_rows(
        self,
        ops: ObservedOps,
        stacks: np.ndarray,
        parameter_contexts: np.ndarray,
        marks: np.ndarray,
        ends: np.ndarray,
        owners: Owners = NO_OWNERS,
    ) -> RowCalls:
        """The calls of the rows of ``ops`` (every op told with :meth:`add_op`): phases from the
        backward marks and module contexts (``-2``: an optimizer step), a backward row's module that
        of the forward row with its sequence number, else, for a context in ``parameter_contexts``
        (a gradient accumulation), that parameter's; recomputation as ``recompute.py`` names it,
        from ``marks`` (the observer's marks and :data:`RECOMPUTED` per row, ``int8``) and ``ends`` (the
        ``TensorImpl`` address of each row's first input and first output, ``int64`` of shape
        ``(rows, 2)``, 0 for none); ``stacks``: each row's (``int64``, -1 none); ``owners``: those a
        module context ``FIRST_OWNER - owner`` names (an FSDP2 group's op: its module and phase)."""
        rows = len(ops.op)
        calls = RowCalls(
            *(np.empty(rows, kind) for kind in (np.int8, np.int64, np.int64, np.int64, np.int32, np.int64, np.int64, np.int8))
        )
        inputs, outputs = np.ascontiguousarray(ends[:, 0]), np.ascontiguousarray(ends[:, 1])
        pointers = [ops.address(name) for name in ("op", "seq", "backward", "module")]
        pointers += [data_address(column) for column in (stacks, parameter_contexts, *calls[:7])]
        pointers += [data_address(marks), ops.address("made"), data_address(inputs), data_address(outputs)]
        phases, modules = np.asarray(owners.phases, np.int8), np.asarray(owners.modules, np.int64)
        pointers += [data_address(calls.fwd_phase), data_address(phases), data_address(modules)]
        counts = c_array(ctypes.c_int64, 3)(rows, len(parameter_contexts), len(phases))
        if self._lib.td_walk_rows(self._handle, counts, c_array(ctypes.c_void_p, len(pointers))(*pointers)) < 0:
            raise RuntimeError("native/slot_walk.cpp failed to name a drain's rows (an op it was not told of, or no memory)")
        return calls

    def walk(
        self,
        ops: ObservedOps,
        recorded: np.ndarray,
        *,
        inputs: bool,
        outputs: bool,
        statistics: bool,
        fingerprints: bool = False,
        unshards: Sequence[tuple[int, list[int]]] = (),
    ) -> WalkedSlots:
        """Walk the slots of ``ops`` (the observer's last drain) whose rows ``recorded`` marks (an
        ``int8`` per row; every op told with :meth:`add_op`), recording the ``inputs`` and ``outputs``
        sides; ``statistics``, ``fingerprints``: say where each slot's come from; ``unshards``: FSDP2's
        copy-ins, ``(row, storages)`` in row order, whose buffers hold no value of the run from that
        row on. Then forget the addresses ``ops.freed`` names."""
        slots = len(ops.slot_row)
        outputs_ = [np.empty(slots, kind) for kind in _OUTPUT_TYPES]
        taken = np.empty(slots, np.int64)
        pointers = [data_address(recorded) if name is None else ops.address(name) for name in _INPUT_COLUMNS]
        unshard_rows = np.array([row for row, _ in unshards], np.int64)
        starts = np.cumsum([0, *(len(storages) for _, storages in unshards)], dtype=np.int64)
        storages = np.array([storage for _, marked in unshards for storage in marked], np.int64)
        pointers += [data_address(column) for column in (*outputs_, taken, unshard_rows, starts, storages)]
        pointers.append(ops.address("mark"))  # (a row of compiled code shares no statistics)
        counts = c_array(ctypes.c_int64, 6)(len(ops.op), slots, len(ops.kept_slot), len(ops.freed), ops.first_row, len(unshards))
        options = c_array(ctypes.c_int, 2)(inputs | outputs << 1, statistics | fingerprints << 1)
        taken_count = ctypes.c_int64()
        count = self._lib.td_walk(
            self._handle, counts, options, c_array(ctypes.c_void_p, len(pointers))(*pointers), ctypes.byref(taken_count)
        )
        if count < 0:
            raise RuntimeError("native/slot_walk.cpp failed on a drain (an op it was not told of, or no memory)")
        for code in range(len(self.args), self._lib.td_walk_args(self._handle)):
            io = ctypes.c_int()
            arg = self._lib.td_walk_arg(self._handle, code, ctypes.byref(io)).decode()
            self.args.append(arg)
            self.io_args.append(f"{('input', 'output')[io.value]}.{arg}")
        return WalkedSlots(*(column[:count] for column in outputs_), taken[: taken_count.value])


@functools.cache
def load_slot_walk() -> ctypes.CDLL | None:
    """The walk's library, built on first use (no torch headers: seconds); ``None`` where it cannot
    be built (a warning says why, once) or native code is disabled."""
    library = load_torch_library("slot_walk")
    if library is None:
        return None
    library.td_walk_new.restype = ctypes.c_void_p
    library.td_walk_free.argtypes = [ctypes.c_void_p]
    library.td_walk_next_step.argtypes = [ctypes.c_void_p]
    library.td_walk_op.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    library.td_walk_op.argtypes += [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    library.td_walk_args.argtypes = [ctypes.c_void_p]
    library.td_walk_arg.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    library.td_walk_arg.restype = ctypes.c_char_p
    library.td_walk.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    library.td_walk.restype = ctypes.c_int64
    library.td_walk_rows.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    library.td_walk_entries.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return library


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a plain array (its distinct values, sorted), without the import of
    ``numpy.ma`` that ``np.unique``'s first call without indices makes (numpy 2.4 asks
    ``np.ma.is_masked``: 40-55 ms of a process's first captured step)."""
    ordered = np.sort(values, axis=None)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered
