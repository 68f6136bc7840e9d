"""The native op observer (``observer.cpp``): the aten ops a ``TorchDispatchMode`` would see, recorded
in C++ by an ``at::RecordFunction`` callback with no Python per op, drained into columns.

    observer = load_observer()          # None where it cannot be built (one warning) or TORCHDEBUG_NATIVE=0
    observer.start()
    observer.set_module(3)              # the module context rows get until the next call
    loss = model(x).sum(); loss.backward()
    observer.stop()
    ops = observer.drain()              # ops.names[ops.op[i]] == "aten.mm.default", ...

A row per op: its name (``op``, an id into ``names``), ``seq`` (for a forward op the sequence number
of the autograd node it makes, for a backward op that of the node it runs: equal numbers link the
two), ``backward``, ``module`` (what :meth:`NativeObserver.set_module` last set). A slot per tensor
argument or result: ``slot_row`` (its op row), ``slot_io`` (0 input, 1 output), ``slot_arg`` (the
schema position of the argument, or of the result), ``slot_element`` (index in a list argument, -1
outside lists), ``slot_dtype`` (a ``c10::ScalarType`` code: :attr:`NativeObserver.dtypes` maps them),
``slot_flag`` (:data:`SUBCLASS`, :data:`NESTED`: sizes not read), ``slot_ndim``
with the sizes concatenated in ``shape``, ``slot_value`` (the ``TensorImpl``'s address, which is
``Tensor._cdata``), ``slot_version`` (its version counter, -1 for inference tensors), ``slot_storage``
(its ``StorageImpl``'s address, 0 for a flagged slot or one without storage) and ``slot_offset`` (its
storage offset); after :meth:`NativeObserver.use_stats`, ``stats``: the sums of each CPU float
tensor (``slot_has_stats``).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from array import array
from dataclasses import dataclass
from itertools import accumulate

import torch

from torchdebug.native.build import load_library, load_torch_library
from torchdebug.stats._schema import COLUMNS, WIDTH

EMPTY, EMPTY_WITH_VALUES, RECORD = 0, 1, 2
"""Observer levels: callbacks that return at once, the same asking the dispatcher for inputs and
outputs (measurements of what ``RecordFunction`` costs), and the recorder."""

PLAIN, SUBCLASS, NESTED = 0, 1, 2
"""``slot_flag`` values: a tensor subclass or a nested tensor is flagged, not read."""

_COLUMNS = (
    ("op", "i"),
    ("seq", "q"),
    ("backward", "b"),
    ("module", "q"),
    ("slot_row", "q"),
    ("slot_io", "b"),
    ("slot_arg", "h"),
    ("slot_element", "h"),
    ("slot_dtype", "b"),
    ("slot_flag", "b"),
    ("slot_ndim", "b"),
    ("slot_value", "q"),
    ("slot_version", "q"),
    ("slot_storage", "q"),
    ("slot_offset", "q"),
    ("shape", "q"),
    ("slot_has_stats", "b"),
    ("stats", "d"),
)
"""The drained columns, in ``td_observer_drain``'s order, with their ``array`` type codes."""

_OP_COLUMNS, _SLOT_COLUMNS = 4, 11


@dataclass
class ObservedOps:
    """Rows drained from the observer (the module docstring describes the columns)."""

    names: list[str]
    """Op names by id: ``aten.mm.default``."""
    first_row: int
    """The number of op rows drained before these: ``slot_row`` counts from there."""
    op: array
    seq: array
    backward: array
    module: array
    slot_row: array
    slot_io: array
    slot_arg: array
    slot_element: array
    slot_dtype: array
    slot_flag: array
    slot_ndim: array
    slot_value: array
    slot_version: array
    slot_storage: array
    slot_offset: array
    shape: array
    slot_has_stats: array
    stats: array
    """``WIDTH`` sums a slot (``torchdebug.stats._schema.COLUMNS``; NaN where ``slot_has_stats`` is 0)."""

    def op_names(self) -> list[str]:
        """The op name of each row."""
        return [self.names[op] for op in self.op]

    def slot_shapes(self) -> list[tuple[int, ...]]:
        """The sizes of each slot (``()`` for a flagged one)."""
        return [tuple(self.shape[end - n : end]) for n, end in zip(self.slot_ndim, accumulate(self.slot_ndim))]


class NativeObserver:
    """The loaded observer library: start, stop, module context, drain."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        library.td_observer_start.argtypes = [ctypes.c_int]
        library.td_observer_start.restype = ctypes.c_int
        library.td_observer_set_module.argtypes = [ctypes.c_int64]
        library.td_observer_set_module.restype = None
        library.td_observer_op_name.argtypes = [ctypes.c_int]
        library.td_observer_op_name.restype = ctypes.c_char_p
        library.td_observer_counts.argtypes = [ctypes.c_void_p]
        library.td_observer_drain.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_scalar_type.argtypes = [ctypes.c_void_p]
        library.td_fallback_start.argtypes = [ctypes.c_int]
        library.td_observer_use_stats.argtypes = [ctypes.c_void_p] * 3
        self.set_module = library.td_observer_set_module
        """``set_module(context)``: the module context of the rows recorded from now on (an int)."""
        self.dtypes = _scalar_types(library)
        """``c10::ScalarType`` code → ``torch.dtype``."""
        self._names: list[str] = []

    def use_stats(self, enabled: bool = True) -> bool:
        """Take the sums of CPU float32, bfloat16 and float64 tensors (``torchdebug.native.stats.c``'s
        kernels, as :func:`~torchdebug.native.fused_stats.fused_sums_into` calls them) in the rows
        recorded from now on, or no longer; ``False`` where the stats library cannot be built."""
        stats = load_library("stats")
        if stats is None or not enabled:
            self._lib.td_observer_use_stats(None, None, None)
            return stats is not None
        stats.td_stats_columns.restype = ctypes.c_char_p
        if tuple(stats.td_stats_columns().decode().split(",")) != COLUMNS:
            raise RuntimeError(f"native/stats.c writes the columns {stats.td_stats_columns().decode()}, not {COLUMNS}")
        entries = (ctypes.cast(getattr(stats, f"td_stats_{suffix}"), ctypes.c_void_p) for suffix in ("f32", "bf16", "f64"))
        if self._lib.td_observer_use_stats(*entries) != WIDTH:
            raise RuntimeError(f"native/observer.cpp keeps sums of another width than {WIDTH}")
        return True

    def start(self, level: int = RECORD) -> bool:
        """Observe the ops of this thread and of the autograd graph tasks it runs; ``False`` when it
        already observes."""
        return bool(self._lib.td_observer_start(level))

    def stop(self) -> None:
        self._lib.td_observer_stop()

    def start_fallback(self, records: bool) -> bool:
        """The alternative observation point, for measurements (``bench/observation_point.py``): a
        boxed dispatcher fallback on ``DispatchKey::Fake`` (below autograd, unused by torch 2.11-2.14)
        that passes every op on, recording op and slot rows if ``records`` (no sequence numbers, no
        backward marks). ``False`` where that key already has a fallback."""
        return bool(self._lib.td_fallback_start(int(records)))

    def stop_fallback(self) -> None:
        self._lib.td_fallback_stop()

    def drain(self) -> ObservedOps:
        """Move the rows buffered so far into Python arrays (one native call)."""
        counts = (ctypes.c_int64 * 4)()
        self._lib.td_observer_counts(counts)
        sizes = [counts[0]] * _OP_COLUMNS + [counts[1]] * _SLOT_COLUMNS + [counts[2], counts[1], counts[1] * WIDTH]
        columns = {name: array(code, bytes(array(code).itemsize * size)) for (name, code), size in zip(_COLUMNS, sizes)}
        pointers = (ctypes.c_void_p * len(_COLUMNS))(*(column.buffer_info()[0] for column in columns.values()))
        self._lib.td_observer_drain(counts, pointers)
        for op_id in range(len(self._names), self._lib.td_observer_op_names()):
            self._names.append(self._lib.td_observer_op_name(op_id).decode())
        return ObservedOps(list(self._names), counts[3], **columns)


def _scalar_types(library: ctypes.CDLL) -> dict[int, torch.dtype]:
    """Each dtype's ``c10::ScalarType`` code, read from an empty tensor of it."""
    codes = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized dtypes are deprecated, complex32 experimental
        for dtype in {value for value in vars(torch).values() if isinstance(value, torch.dtype)}:
            try:
                example = torch.empty(0, dtype=dtype)
            except (RuntimeError, TypeError):  # bit dtypes have no plain empty tensor
                continue
            codes[library.td_observer_scalar_type(example._cdata)] = dtype
    return codes


@functools.cache
def load_observer() -> NativeObserver | None:
    """The native observer, built on first use; ``None`` where it cannot be built (a warning says
    why, once) or native code is disabled (``TORCHDEBUG_NATIVE=0``)."""
    library = load_torch_library("observer")
    return NativeObserver(library) if library is not None else None
