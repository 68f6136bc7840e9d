"""The native op observer (``observer.cpp``): the aten ops a ``TorchDispatchMode`` would see, recorded
in C++ by an ``at::RecordFunction`` callback with no Python per op, drained into columns.

    observer = load_observer()          # None where it cannot be built (one warning) or TORCHDEBUG_NATIVE=0
    observer.start()
    observer.set_module(3)              # the module context rows get until the next call
    loss = model(x).sum(); loss.backward()
    observer.stop()
    ops = observer.drain()              # ops.names[ops.op[i]] == "aten.mm.default", ...

The drained columns: :class:`ObservedOps`; the design and its figures:
docs/architecture.md, "The native path (issue 48)".
"""

from __future__ import annotations

import ctypes
import functools
import sys
import warnings
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from types import CodeType
from typing import NamedTuple

import numpy as np
import torch

from torchdebug._torch.compiling import frame_callback_setter
from torchdebug.native.addresses import c_array, data_address
from torchdebug.native.build import load_library, load_python_library, load_torch_library
from torchdebug.stats import COLUMNS, WIDTH

EMPTY, EMPTY_WITH_VALUES, RECORD, MODULE_ROWS = 0, 1, 2, 3
"""Observer levels: callbacks that return at once, the same asking the dispatcher for inputs and
outputs (measurements of what ``RecordFunction`` costs), the recorder, and no callback at all: only
the rows :meth:`NativeObserver.module_row` adds (level ``module``)."""

PLAIN, SUBCLASS, NESTED, VALUE, LAID_OUT = 0, 1, 2, 4, 16
"""``slot_flag`` values: a tensor subclass or a nested tensor is flagged, not read; a non-tensor
argument or result (a number, sizes, a dtype, ``None``) is a value slot, its JSON text in
:attr:`ObservedOps.value_texts`; a tensor of a layout with no strides (sparse, mkldnn) is
``LAID_OUT`` plus its layout's code (:meth:`NativeObserver.layout_name`): its dtype, shape and device
are drained, its values not read."""

MODULE_ROW_OP = "torchdebug.module"
"""The op name of the rows :meth:`NativeObserver.module_row` adds: a module call's tensors, each an
input slot at arg 0, its element its index in the call's list."""

MODULE_ROW_SLOTS = 32767
"""Tensors a module row holds at most (its slots' element is an ``int16``)."""

STAGED_FACTS_WIDTH = 10
"""The facts :meth:`NativeObserver.staged_facts` gives of a tensor (``observer.cpp``'s ``kFactsWidth``)."""


class StagedFacts(NamedTuple):
    """What the observer knew of a kept tensor it handed over to be staged (:meth:`NativeObserver.stage_kept`)."""

    key: int
    """Its slot's ``slot_value``: the tensor, until the drain that reports it freed."""
    version: int
    """Its slot's ``slot_version``."""
    base: int
    """Its base's key, for a view (0: none)."""
    same_values: int
    """1 where another slot of the same key, version and :attr:`writes` holds the same values: a plain
    tensor outside compiled code (inductor's kernels and a subclass's handlers write unseen, moving no
    version), not a copy the observer took before a write (it holds the values from before it)."""
    writes: int
    """The collectives' writes into its storage so far (they move no version)."""
    address: int
    """Where its first element is (0: a subclass, or no memory to read): with the next four, what a
    kernel reads of it without Python asking the tensor (``StatsStager.add_landed``)."""
    numel: int
    """Its element count."""
    dtype: int
    """Its ``c10::ScalarType`` code (:attr:`NativeObserver.dtypes`)."""
    device: int
    """Its device: the ``c10::DeviceType`` code ``<< 8 |`` the index + 1 (0: the CPU)."""
    density: int
    """``stats_table.DENSE`` where its elements fill one span of memory with none twice (contiguous
    or permuted), ``| CONTIGUOUS`` where in their own order."""


def staged_fact(facts: array, index: int) -> StagedFacts:
    """The facts of the ``index``-th tensor of :meth:`NativeObserver.staged_facts`' ``facts``."""
    return StagedFacts(*facts[index * STAGED_FACTS_WIDTH : (index + 1) * STAGED_FACTS_WIDTH])


class OverflowRule(NamedTuple):
    """``nonfinite.py``'s rule as :meth:`NativeObserver.watch_overflow` takes it (``capture/native_overflow.py`` makes it)."""

    verdicts: bytes
    """256 entries, by ``inputs | outputs << 3 | made << 6 | held << 7`` (flags, and ``OriginTracker``'s
    state): the kind (0 none, 1 given, :data:`ORIGIN_FOUND`, :data:`ENTRY_FOUND`) ``| made << 2 | held << 3`` after the call."""
    limits: list[float]
    """By ``c10::ScalarType`` code: the dtype's largest finite magnitude (inf where none), NaN for a dtype not judged."""
    given: list[float]
    """Magnitudes of numbers that count as a given limit."""
    facts: Callable[[int], int]
    """An op id's facts (``watch`` in ``observer.cpp``): 1 never judged, with bit 30 an allocation
    (its outputs hold no value until an op writes them); bit ``1 + position`` an input it does not
    read, ``32 + index`` an output holding no value it made."""


ORIGIN_FOUND, ENTRY_FOUND = 2, 3
""":attr:`OverflowFound.kinds`: a call that made a NaN/Inf, one that passed on a NaN no call made."""


class OverflowFound(NamedTuple):
    """The calls :meth:`NativeObserver.watch_overflow` found among the rows drained last."""

    rows: array
    """Their rows (absolute, as ``slot_row``), in the order they ended."""
    kinds: array
    """:data:`ORIGIN_FOUND` or :data:`ENTRY_FOUND`, by call."""
    kept: dict[int, torch.Tensor]
    """By drained slot: a copy of its tensor as the call had it."""


GRAD_ON, CHECKPOINT_NODE = 1, 2
""":attr:`ObservedOps.mark` bits Python reads: grad mode was on; run by a reentrant checkpoint's node.
(4 is ``native_values.RECOMPUTED``, which Python adds; read by the walk only: 8, a forward op that made
no node of its sequence number, which the next node made takes: a custom autograd function's; 32, an op
of compiled code, whose slots share no statistics with others: inductor's kernels write there unseen.)"""

_COLUMNS = (
    ("op", np.int32),
    ("seq", np.int64),
    ("backward", np.int8),
    ("module", np.int64),
    ("slot_row", np.int64),
    ("slot_io", np.int8),
    ("slot_arg", np.int16),
    ("slot_element", np.int16),
    ("slot_dtype", np.int8),
    ("slot_flag", np.int8),
    ("slot_ndim", np.int8),
    ("slot_value", np.int64),
    ("slot_version", np.int64),
    ("slot_storage", np.int64),
    ("slot_offset", np.int64),
    ("shape", np.int64),
    ("stride", np.int64),
    ("slot_device_type", np.int8),
    ("slot_device_index", np.int8),
    ("slot_has_stats", np.int8),
    ("stats", np.float64),
    ("kept_slot", np.int64),
    ("stack", np.int64),
    ("slot_base", np.int64),
    ("slot_has_fingerprint", np.int8),
    ("slot_fingerprint", np.int64),
    ("mark", np.int8),
    ("made", np.int64),
    ("kept_staged", np.int64),
)
"""The drained columns, in ``td_observer_drain``'s order, with their types."""

_OP_COLUMNS, _SLOT_COLUMNS = 4, 11


@dataclass
class ObservedOps:
    """Rows drained from the observer.

    A row per op: its name (``op``, an id into ``names``), ``seq`` (for a forward op the sequence
    number of the autograd node it makes, for a backward op that of the node it runs: equal numbers
    link the two), ``backward``, ``module`` (what :meth:`NativeObserver.set_module` last set), and
    after :meth:`NativeObserver.want_stacks` ``stack`` (:meth:`NativeObserver.stacks` symbolizes
    them). A slot per tensor argument or result: ``slot_row`` (its op row), ``slot_io`` (0 input, 1
    output), ``slot_arg`` (the schema position of the argument, or of the result), ``slot_element``
    (index in a list argument, -1 outside lists), ``slot_dtype`` (a ``c10::ScalarType`` code:
    :attr:`NativeObserver.dtypes` maps them), ``slot_flag`` (:data:`SUBCLASS`, :data:`NESTED`: sizes
    not read; :data:`VALUE`: a non-tensor argument or result, those a dispatch mode is handed, its
    ``slot_value`` an index into :attr:`value_texts`), ``slot_ndim`` with the sizes concatenated in
    ``shape`` and the strides in ``stride``,
    ``slot_device_type`` and ``slot_device_index`` (:meth:`NativeObserver.device_name`),
    ``slot_value`` (the ``TensorImpl``'s address, which is ``Tensor._cdata``, or once a sweep let go
    of that address its key: :meth:`NativeObserver.sweep_after`; the same for the storages and
    bases), ``slot_version`` (its
    version counter, -1 for inference tensors), ``slot_storage`` (its ``StorageImpl``'s address; a
    subclass's or nested tensor's own ``TensorImpl`` address, its memory not being its value; 0 for a
    value slot), ``slot_offset`` (its storage offset) and
    ``slot_base`` (a view's base ``TensorImpl``, 0 for none); after
    :meth:`NativeObserver.use_stats`, ``stats``: the sums of each CPU tensor ``stats.c`` sums
    (``slot_has_stats``); after :meth:`NativeObserver.use_fingerprints`, ``slot_fingerprint``: the
    fingerprint (``torchdebug.checksum``) of each CPU tensor the callback read
    (``slot_has_fingerprint``), in the statistics' pass; after :meth:`NativeObserver.keep_unsummed`,
    ``kept``: the other plain non-empty tensors, handed over by the operator the library registers
    (``torch.ops.torchdebug.observer_kept``), and their slots (``kept_slot``), but for those
    :meth:`NativeObserver.stage_kept` handed over before (``kept_staged``).
    """

    names: list[str]
    """Op names by id: ``aten.mm.default``."""
    first_row: int
    """The number of op rows drained before these: ``slot_row`` counts from there."""
    op: np.ndarray
    seq: np.ndarray
    backward: np.ndarray
    module: np.ndarray
    slot_row: np.ndarray
    slot_io: np.ndarray
    slot_arg: np.ndarray
    slot_element: np.ndarray
    slot_dtype: np.ndarray
    slot_flag: np.ndarray
    slot_ndim: np.ndarray
    slot_value: np.ndarray
    slot_version: np.ndarray
    slot_storage: np.ndarray
    slot_offset: np.ndarray
    shape: np.ndarray
    stride: np.ndarray
    slot_device_type: np.ndarray
    slot_device_index: np.ndarray
    slot_has_stats: np.ndarray
    stats: np.ndarray
    """``WIDTH`` sums a slot (``torchdebug.stats._schema.COLUMNS``; NaN where ``slot_has_stats`` is 0)."""
    kept_slot: np.ndarray
    """The slots of :attr:`kept`, and -1 for each tensor not handed over: an output freed before the next
    op started, or a tensor changed in place since it was recorded (its version moved)."""
    stack: np.ndarray
    """By op row: its stack's id, an index into :meth:`NativeObserver.stacks` (-1: none taken)."""
    slot_base: np.ndarray
    """A view's: the ``TensorImpl`` address of the tensor whose memory it shares (autograd's ``_base``,
    the first one for views of views); 0 for a tensor that is no view, or a flagged one."""
    slot_has_fingerprint: np.ndarray
    slot_fingerprint: np.ndarray
    """The fingerprint's 64 bits as int64 (0 where ``slot_has_fingerprint`` is 0)."""
    mark: np.ndarray
    """By op row: :data:`GRAD_ON` (grad mode was on at the op), :data:`CHECKPOINT_NODE` (the engine ran
    a reentrant checkpoint's node, see :meth:`NativeObserver.watch_checkpoint`), or-ed."""
    made: np.ndarray
    """By op row: the sequence number of the last autograd node made before the op started."""
    kept_staged: np.ndarray
    """By entry of :attr:`kept_slot`: the id :meth:`NativeObserver.stage_kept` gave the tensor it
    handed over before the drain (its statistics staged then), -1 for one not staged (in :attr:`kept`, or not handed)."""
    kept: list[torch.Tensor]
    """After :meth:`NativeObserver.keep_unsummed`: the plain non-empty tensors whose sums the
    callback did not take, still at the version recorded when drained."""
    value_texts: list[str] = field(default_factory=list)
    """The distinct JSON texts of the value slots (``slot_flag`` :data:`VALUE`): a value slot's
    ``slot_value`` indexes them."""
    freed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """``TensorImpl`` addresses (keys) of slots (and of views' bases) whose tensors were freed since
    they were drained, or since a sweep, and ``StorageImpl`` addresses of plain slots' storages freed
    so: from now on no slot names them (until then the observer held them weakly, or a sweep let
    another tensor take the address under another key)."""
    addresses: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    """Where the drain put each column (:meth:`address`)."""

    def address(self, name: str) -> int:
        """The address of column ``name``'s first element, for native code (0 for an empty column)."""
        address = self.addresses.get(name)
        if address is None:
            column = getattr(self, name)
            address = self.addresses[name] = data_address(column) if len(column) else 0
        return address

    def op_names(self) -> list[str]:
        """The op name of each row."""
        return [self.names[op] for op in self.op.tolist()]

    def slot_shapes(self) -> list[tuple[int, ...]]:
        """The sizes of each slot (``()`` for a flagged one)."""
        return _split(self.shape, self.slot_ndim)

    def slot_strides(self) -> list[tuple[int, ...]]:
        """The strides of each slot (``()`` for a flagged one, zeros for a layout without strides)."""
        return _split(self.stride, self.slot_ndim)


def _split(values: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    counts, flat = np.asarray(lengths).tolist(), np.asarray(values).tolist()
    return [tuple(flat[end - n : end]) for n, end in zip(counts, accumulate(counts))]


_SUMMED = ("f32", "bf16", "f64", "i64", "i32", "i16", "i8", "u8")
"""The suffixes of the ``stats.c`` entry points the observer takes, in ``kSummedTypes``' order (``observer.cpp``)."""


def _symbolized(address: int, position: int, lines: bool) -> list[tuple[str, int, str]]:
    """A frame of a stack (its code object, which the observer holds, and its position: a line where
    ``lines``, else an instruction's offset) as ``torch::symbolize`` gives it: followed by the frames
    of the source it was generated from, for code inductor generated (looked up where inductor's code
    cache is loaded: ``getattr(torch, "_inductor")``, as torch's own symbolize asks, would import
    inductor, seconds on the first flush, where no inductor code can have run)."""
    code = ctypes.cast(address, ctypes.py_object).value
    line = position if lines else _line(code, position)
    frames = [(code.co_filename, line, code.co_name)]
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None:
        extra = codecache.PyCodeCache.stack_frames_for_code(code.co_filename, line)
        frames += [(frame["filename"], frame["line"], frame["name"]) for frame in extra or ()]
    return frames


def _line(code: CodeType, offset: int) -> int:
    """The line of the instruction at byte ``offset`` of ``code`` (``PyCode_Addr2Line``: the first
    line for a negative offset, -1 for an instruction with no line)."""
    if offset < 0:
        return code.co_firstlineno
    starts, ends, lines = _line_table(code)
    at = bisect_right(starts, offset) - 1
    line = lines[at] if at >= 0 and offset < ends[at] else None
    return -1 if line is None else line


@functools.lru_cache(maxsize=1 << 12)
def _line_table(code: CodeType) -> tuple[list[int], list[int], list[int | None]]:
    """``code``'s ranges of instructions (``co_lines``, in order) as their starts, ends and lines, a
    new stack's frames looked up by bisection: a scan of the table for each frame took 12 ms of the
    tiny GPT's first captured step (708 frames; 3.4 ms so). The observer holds its stacks' code
    objects anyway."""
    starts: list[int] = []
    ends: list[int] = []
    lines: list[int | None] = []
    for start, end, line in code.co_lines():
        starts.append(start)
        ends.append(end)
        lines.append(line)
    return starts, ends, lines


@functools.cache
def _entries(stats: ctypes.CDLL, prefix: str) -> ctypes.Array:
    """The addresses of ``stats.c``'s ``<prefix><suffix>`` entry points, in :data:`_SUMMED` order
    (made once: a capture hands them over at each step's start)."""
    entries = (ctypes.cast(getattr(stats, prefix + suffix), ctypes.c_void_p) for suffix in _SUMMED)
    return (ctypes.c_void_p * len(_SUMMED))(*entries)


@functools.cache
def _check_columns(stats: ctypes.CDLL) -> None:
    """Raise unless ``stats.c`` writes the sums in :data:`COLUMNS` order (checked once a library)."""
    stats.td_stats_columns.restype = ctypes.c_char_p
    if tuple(stats.td_stats_columns().decode().split(",")) != COLUMNS:
        raise RuntimeError(f"native/stats.c writes the columns {stats.td_stats_columns().decode()}, not {COLUMNS}")


class NativeObserver:
    """The loaded observer library: start, stop, module context, drain."""

    set_module: Callable[[int], None]
    """``set_module(context)``: the module context of the rows recorded from now on (an int). A
    store into the observer's memory, no foreign call (a module call sets it twice: 0.06 µs each,
    0.4 µs through ctypes' call)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        self._owner_hooks: tuple[Callable[[], int] | None, Callable[[], int] | None] = (None, None)
        self._subclass_hook: Callable[[torch.Tensor], int] | None = None
        library.td_observer_start.argtypes = [ctypes.c_int]
        library.td_observer_start.restype = ctypes.c_int
        library.td_observer_op_name.argtypes = [ctypes.c_int]
        library.td_observer_op_name.restype = ctypes.c_char_p
        library.td_observer_counts.argtypes = [ctypes.c_void_p]
        library.td_observer_drain.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_scalar_type.argtypes = [ctypes.c_void_p]
        library.td_fallback_start.argtypes = [ctypes.c_int]
        library.td_observer_use_stats.argtypes = [ctypes.c_void_p]
        library.td_observer_use_fingerprints.argtypes = [ctypes.c_void_p] * 5
        library.td_observer_keep_unsummed.argtypes = [ctypes.c_int]
        library.td_observer_stage_kept.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        library.td_observer_stage_kept.restype = None
        library.td_observer_defer_cpu.argtypes = [ctypes.c_int]
        library.td_observer_defer_cpu.restype = None
        library.td_observer_staged_facts.argtypes = [ctypes.c_void_p]
        library.td_observer_staged_facts.restype = None
        library.td_observer_sweep_after.argtypes = [ctypes.c_int64]
        library.td_observer_sweep_after.restype = None
        library.td_observer_keys.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        library.td_observer_keys.restype = None
        library.td_observer_held.argtypes = [ctypes.c_void_p]
        library.td_observer_held.restype = None
        library.td_observer_stage_looked.argtypes = []
        library.td_observer_stage_looked.restype = ctypes.c_int64
        library.td_observer_write_looked.argtypes = []
        library.td_observer_write_looked.restype = ctypes.c_int64
        library.td_observer_want_stacks.argtypes = [ctypes.c_int]
        library.td_observer_want_values.argtypes = [ctypes.c_int]
        library.td_observer_compiling.argtypes = [ctypes.c_int]
        library.td_observer_stack_count.restype = ctypes.c_int64
        library.td_observer_stack.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        library.td_observer_stack.restype = ctypes.POINTER(ctypes.c_int64)
        library.td_observer_take_lines.argtypes = [ctypes.c_int]
        library.td_observer_device_type_name.argtypes = [ctypes.c_int]
        library.td_observer_device_type_name.restype = ctypes.c_char_p
        library.td_observer_layout_name.restype = ctypes.c_char_p
        library.td_observer_layout_name.argtypes = [ctypes.c_int]
        library.td_observer_freed_count.restype = ctypes.c_int64
        library.td_observer_take_freed.argtypes = [ctypes.c_void_p]
        library.td_observer_value_texts.argtypes = [ctypes.c_void_p]
        library.td_observer_value_texts.restype = ctypes.c_void_p
        library.td_observer_checkpoint.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        library.td_observer_checkpoint.restype = None
        library.td_observer_hidden_in_transforms.restype = ctypes.c_int64
        library.td_observer_parameters.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_parameters.restype = None
        library.td_observer_accumulating.restype = ctypes.c_int
        library.td_observer_module_row.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_module_row.restype = ctypes.c_int64
        library.td_observer_use_works.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
        library.td_observer_use_works.restype = None
        library.td_observer_finish_collectives.restype = None
        library.td_observer_use_owners.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_use_owners.restype = None
        library.td_observer_use_subclass_hook.argtypes = [ctypes.c_void_p]
        library.td_observer_use_subclass_hook.restype = None
        library.td_observer_tensor_type.argtypes = [ctypes.c_void_p]
        library.td_observer_tensor_type.restype = None
        library.td_observer_tensor_type(id(torch.Tensor))
        library.td_observer_use_eval_frame.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_use_eval_frame.restype = None
        self._frame_callback_setter = frame_callback_setter()  # held while the library holds its address
        if self._frame_callback_setter is not None:  # the hooks run with Dynamo off (observer.cpp's call_hook)
            library.td_observer_use_eval_frame(id(self._frame_callback_setter), id(None))
        library.td_observer_finish_functional.restype = None
        library.td_observer_watch_overflow.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int,
        ]
        library.td_observer_watch_overflow.restype = None
        library.td_observer_overflow_step.argtypes = [ctypes.c_int64, ctypes.c_int]
        library.td_observer_overflow_step.restype = None
        library.td_observer_overflow_unwritten.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_overflow_unwritten.restype = None
        library.td_observer_overflow_copies_fail.argtypes = [ctypes.c_int]
        library.td_observer_overflow_copies_fail.restype = None
        library.td_observer_overflow_counts.argtypes = [ctypes.c_void_p]
        library.td_observer_overflow_counts.restype = None
        library.td_observer_overflow_found.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        library.td_observer_overflow_found.restype = None
        library.td_observer_use_frames.argtypes = [ctypes.c_void_p]
        library.td_observer_use_frames.restype = None
        library.td_observer_module_context.restype = ctypes.c_void_p
        context = ctypes.c_int64.from_address(library.td_observer_module_context())
        self.set_module = functools.partial(setattr, context, "value")
        self.dtypes = _scalar_types(library)
        """``c10::ScalarType`` code → ``torch.dtype``."""
        self._names: list[str] = []
        self._stacks: list[list[tuple[str, int, str]]] = []
        self._device_types: dict[int, str] = {}
        self._staged = 0  # the kept tensors stage_kept handed over so far: the next one's id
        self._stage_hook: Callable[[], None] | None = None
        self.running = False
        """Between :meth:`start` and :meth:`stop`: the process has one observer, one user at a time."""
        self.read_frames_directly()

    def device_name(self, device_type: int, index: int) -> str:
        """``str(tensor.device)`` of a slot's ``slot_device_type`` and ``slot_device_index``."""
        name = self._device_types.get(device_type)
        if name is None:
            name = self._device_types[device_type] = self._lib.td_observer_device_type_name(device_type).decode()
        return name if index < 0 else f"{name}:{index}"

    def layout_name(self, code: int) -> str:
        """``str(tensor.layout)`` of a ``LAID_OUT`` slot's layout code (its flag less ``LAID_OUT``)."""
        return self._lib.td_observer_layout_name(code).decode()

    def name_accumulations(self, parameters: list[torch.Tensor], contexts: list[int]) -> None:
        """Record the ops of each of ``parameters``' gradient accumulations (the engine's evaluation of
        its ``AccumulateGrad`` node: its gradient hooks, the sum, its post hooks) in its context of
        ``contexts`` (as :attr:`set_module` numbers them), in place of the parameters told before (from
        the next accumulation on: a model-less capture names them as its modules' calls start)."""
        impls = array("q", (parameter._cdata for parameter in parameters))
        numbers = array("q", contexts)
        self._lib.td_observer_parameters(len(impls), impls.buffer_info()[0], numbers.buffer_info()[0])

    def accumulating(self) -> bool:
        """Whether this thread runs a gradient accumulation :meth:`name_accumulations` named (in its
        hooks: an optimizer stepped in the backward)."""
        return bool(self._lib.td_observer_accumulating())

    def module_row(self, tensors: list[torch.Tensor]) -> tuple[int, int]:
        """Add a row of :data:`MODULE_ROW_OP` holding ``tensors`` (at most :data:`MODULE_ROW_SLOTS`; a
        module call's, ``capture/native_modules.py``) after the rows recorded so far: its slots are
        read, and take value ids, as an op's inputs (a subclass instance through the plain tensor the
        subclass hook names, as at an op; never itself). Returns its absolute row number (-1 when the
        observer is not started) and where its slots start among those the next drain hands over."""
        slot_at = ctypes.c_int64()
        if not tensors:  # (a call's start: the most frequent, no array to make)
            return self._lib.td_observer_module_row(0, None, ctypes.byref(slot_at)), slot_at.value
        impls = array("q", [tensor._cdata for tensor in tensors])
        return self._lib.td_observer_module_row(len(impls), impls.buffer_info()[0], ctypes.byref(slot_at)), slot_at.value

    def want_stacks(self, enabled: bool = True) -> None:
        """Take the Python frames each forward op is called from (code objects and instruction
        offsets, as torch's ``CapturedTraceback`` takes them for the CUDA memory snapshot), in the rows
        recorded from now on, or no longer."""
        self._lib.td_observer_want_stacks(int(enabled))

    def watch_checkpoint(self, node: str, ops: list[str]) -> None:
        """Mark the rows the engine runs in autograd nodes named ``node`` (a reentrant checkpoint's,
        :data:`CHECKPOINT_NODE`), and take the Python frames of every row of ``ops``
        (``aten.detach.default``) and of the backward rows that may be a recomputation's (grad mode
        on, and the ops after one in its node): their frames tell checkpointing's own calls."""
        self._lib.td_observer_checkpoint(node.encode(), "".join(f"{op}\n" for op in ops).encode())

    def hidden_in_transforms(self) -> int:
        """The op calls since the last call that ran inside a torch.func transform (vmap, grad): a
        capture mode sees the plain ops its batching rules run, which the observer cannot tell from a
        kernel's own calls."""
        return int(self._lib.td_observer_hidden_in_transforms())

    def want_values(self, enabled: bool = True) -> None:
        """Record each op's non-tensor arguments (those a dispatch mode is handed: not left at their
        defaults) and results as value slots (:data:`VALUE`), in the rows recorded from now on, or no longer."""
        self._lib.td_observer_want_values(int(enabled))

    def compiling(self, starts: bool) -> None:
        """Dynamo starts (``starts``) or ends a compilation on this thread: the ops run meanwhile are
        the compiler's, not the step's, and are not recorded (a dispatch mode does not see them)."""
        self._lib.td_observer_compiling(int(starts))

    def stacks(self) -> list[list[tuple[str, int, str]]]:
        """The stacks the rows hold (``ObservedOps.stack``: their ids), as ``(file, line, function)``
        frames, innermost first: every stack this process has taken (ids stay; only the stacks new
        since the last call are symbolized, as torch's ``CapturedTraceback`` symbolizes its frames)."""
        size = ctypes.c_int64()
        for stack_id in range(len(self._stacks), self._lib.td_observer_stack_count()):
            lines, *words = self._lib.td_observer_stack(stack_id, ctypes.byref(size))[: size.value]
            self._stacks.append(
                [frame for at in range(0, len(words), 2) for frame in _symbolized(words[at], words[at + 1], bool(lines))]
            )
        return self._stacks

    def read_frames_directly(self, enabled: bool = True) -> bool:
        """Read the frames of the stacks taken from now on from the interpreter's own structures,
        without the GIL (``py_frames.c``: no frame object made, no reference taken), where this Python
        allows it (CPython 3.11 through 3.13 with the GIL), or through Python's C API; returns whether
        they are read directly. Both give the same stacks: the first is cheaper (the default)."""
        frames = load_python_library("py_frames") if enabled else None  # (held by the cache)
        if frames is None or not frames.td_frames_supported():
            self._lib.td_observer_use_frames(None)
            return False
        self._lib.td_observer_use_frames(ctypes.cast(frames.td_frames_take, ctypes.c_void_p))
        return True

    def take_lines(self, lines: bool = True) -> bool:
        """Take each frame's line when an op's frames are taken (what Python 3.10, whose frames tell no
        last instruction, always does), or the offset of its last instruction (from 3.11 on, by
        default: cheaper, the line read once a distinct stack); returns whether lines are taken."""
        return bool(self._lib.td_observer_take_lines(int(lines)))

    def keep_unsummed(self, enabled: bool = True) -> None:
        """Keep a reference to each plain non-empty tensor whose sums or fingerprint (those asked
        for) the callback does not take (other dtypes, other devices, memory it cannot walk) in the
        rows recorded from now on, or no longer: :attr:`ObservedOps.kept` hands them to Python at the drain."""
        self._lib.td_observer_keep_unsummed(int(enabled))

    def use_stage_hook(self, hook: Callable[[], None] | None, after_bytes: int = -1) -> None:
        """Have ``hook`` (held by the caller; ``None``: none) stage the kept tensors before an op writes
        the memory one of them is on, and at the next op once ``after_bytes`` of them were kept since
        it last ran (-1: only before a write; 0: as each op starts and as it ends, an op's inputs and
        its outputs): it calls :meth:`stage_kept`. Without one, each such tensor is copied before the
        write and all are held to the drain."""
        self._stage_hook = hook  # alive while the observer holds its address
        self._lib.td_observer_stage_kept(None if hook is None else id(hook), after_bytes)

    def stage_kept(self, most: int, first_part: bool) -> tuple[int, list[torch.Tensor]]:
        """The kept tensors not handed over yet, let go by the observer, whose statistics are to be
        staged now, at most ``most`` of them (fewer: none is left), and the id of the first (the
        others' follow): :attr:`ObservedOps.kept_staged` names them so. A staging takes them in parts
        (``first_part``: its first call); a kept tensor holding the values of one it handed over
        (:attr:`StagedFacts.same_values`) is not handed over again: its slots name that one's id."""
        first = self._staged
        tensors = torch.ops.torchdebug.observer_stage_kept(most, first_part)
        self._staged += len(tensors)
        return first, tensors

    @property
    def next_staged_id(self) -> int:
        """The id :meth:`stage_kept` gives the next tensor it hands over."""
        return self._staged

    def staged_facts(self, count: int) -> array:
        """What the observer knew of each of the ``count`` tensors the last :meth:`stage_kept` handed
        over: :data:`STAGED_FACTS_WIDTH` numbers a tensor, in :class:`StagedFacts`' order
        (:func:`staged_fact` reads one), no object a tensor."""
        facts = array("q", [0]) * (STAGED_FACTS_WIDTH * count)
        if count:
            self._lib.td_observer_staged_facts(facts.buffer_info()[0])
        return facts

    def sweep_after(self, nbytes: int) -> None:
        """Let go of the references the observer holds of tensors freed since, at the next op (at level
        module, module call) once ``nbytes`` of CPU tensors were recorded since it last did (-1: never;
        0: at every op, tests). The slots' ``slot_value``, ``slot_storage`` and ``slot_base`` are keys
        then: the address, and how often a sweep let it go, from bit 48 on (docs/architecture.md,
        "The native path (issue 48)", value ids by address)."""
        self._lib.td_observer_sweep_after(nbytes)

    def keys(self, addresses: list[int]) -> list[int]:
        """The keys slots name ``TensorImpl`` or ``StorageImpl`` ``addresses`` by now (:meth:`sweep_after`)."""
        keys = array("q", addresses)
        if keys:
            self._lib.td_observer_keys(len(keys), keys.buffer_info()[0])
        return keys.tolist()

    def stage_looked(self) -> int:
        """The kept entries the stagings (:meth:`stage_kept`) looked at so far in this process (tests)."""
        return int(self._lib.td_observer_stage_looked())

    def write_looked(self) -> int:
        """The kept entries the checks before an op's writes looked at so far in this process, for one
        on the memory the op writes (tests)."""
        return int(self._lib.td_observer_write_looked())

    def held(self) -> tuple[int, int]:
        """The weak references the observer holds of tensors and storages, and the keys sweeps let go
        of since the last drain (tests)."""
        out = array("q", [0, 0])
        self._lib.td_observer_held(out.buffer_info()[0])
        return out[0], out[1]

    def defer_cpu(self, enabled: bool = True) -> None:
        """Keep CPU tensors as other devices' are, their statistics and fingerprints not taken in the
        callback: ``task="tensor"``, which saves every tensor as it is staged, and tests (the path of an
        accelerator's tensors, run on the CPU)."""
        self._lib.td_observer_defer_cpu(int(enabled))

    def use_stats(self, enabled: bool = True) -> bool:
        """Take the sums of CPU float32, bfloat16, float64, integer and bool tensors
        (``torchdebug.native.stats.c``'s kernels, as :func:`~torchdebug.native.fused_stats.fused_sums_into`
        calls them) in the rows recorded from now on, or no longer; ``False`` where the stats library
        cannot be built."""
        stats = load_library("stats")
        if stats is None or not enabled:
            self._lib.td_observer_use_stats(None)
            return stats is not None
        _check_columns(stats)
        if self._lib.td_observer_use_stats(_entries(stats, "td_stats_")) != WIDTH:
            raise RuntimeError(f"native/observer.cpp keeps sums of another width than {WIDTH}")
        return True

    def use_fingerprints(self, enabled: bool = True) -> bool:
        """Take the fingerprint (:mod:`torchdebug.checksum`) of CPU tensors in the rows recorded from
        now on, or no longer: with :meth:`use_stats`, of the tensors it sums in the statistics' pass
        (``td_stats_hash_*``, as ``fused_stats.stats_and_fingerprint`` takes both), else of those of
        any dtype of 1, 2, 4 or 8 bytes (``td_hash_w*``); ``False`` where the stats library cannot be built."""
        stats = load_library("stats")
        if stats is None or not enabled:
            self._lib.td_observer_use_fingerprints(*[None] * 5)
            return stats is not None
        alone = (ctypes.cast(getattr(stats, f"td_hash_w{width}"), ctypes.c_void_p) for width in (1, 2, 4, 8))
        self._lib.td_observer_use_fingerprints(_entries(stats, "td_stats_hash_"), *alone)
        return True

    def use_works(self, works: ctypes.CDLL | None, distributed_dir: str = "") -> None:
        """Read each c10d collective's outputs once its Work completes, as ``works`` (the library of
        ``c10d_work.cpp``) tells, and not while ops run inside ``distributed_dir`` (torch.distributed's
        code); ``None`` (not a distributed run): at the collective's end."""
        completed = None if works is None else ctypes.cast(works.td_work_completed, ctypes.c_void_p)
        wait = None if works is None else ctypes.cast(works.td_work_wait, ctypes.c_void_p)
        self._lib.td_observer_use_works(completed, wait, distributed_dir.encode() if works is not None else None)

    def use_owners(self, owner: Callable[[], int] | None, unshard: Callable[[], int] | None) -> None:
        """Call ``owner()`` at each collective and fsdp op, ``unshard()`` at FSDP2's copy-in (with the
        GIL and Dynamo off, from the op's thread): each returns the row's module context, an owner's (an FSDP2
        group's op) or -1 (the row keeps its own); ``None``: none is called. Held until the next call."""
        self._owner_hooks = (owner, unshard)  # alive while the observer holds their addresses
        self._lib.td_observer_use_owners(*(None if hook is None else id(hook) for hook in self._owner_hooks))

    def use_subclass_hook(self, hook: Callable[[torch.Tensor], int] | None) -> None:
        """Call ``hook(tensor)`` at each subclass instance an op takes or returns (with the GIL and
        Dynamo off, before its slot): Python describes it, and returns the address of the ``TensorImpl`` of the plain
        tensor holding its elements, which the callback reads with the slot where values are read, or
        0; ``None``: none is called (the instance is not described)."""
        self._subclass_hook = hook  # alive while the observer holds its address
        self._lib.td_observer_use_subclass_hook(None if hook is None else id(hook))

    def watch_overflow(self, rule: OverflowRule | None, fresh: bool = False) -> None:
        """Judge each recorded call as it ends by ``rule`` (``task="overflow_check"``), and keep copies
        of the tensors of those found, which :meth:`overflow_found` hands over after each drain;
        ``fresh``: a check's first start (what the observer learnt of ops' facts and of memory no op
        wrote yet is forgotten). ``None``: no longer (what was found and not drained is dropped)."""
        self._overflow_rule = rule  # (its hook alive while the observer holds its address)
        if rule is None:
            self._lib.td_observer_watch_overflow(0, None, None, 0, None, 0, None, 0)
            return
        limits = array("d", rule.limits)
        given = array("d", rule.given)
        self._lib.td_observer_watch_overflow(
            1, rule.verdicts, limits.buffer_info()[0], len(limits), given.buffer_info()[0], len(given), id(rule.facts), int(fresh)
        )

    def op_name(self, op_id: int) -> str:
        """The name of op ``op_id`` (``aten.mm.default``), drained or not."""
        return self._lib.td_observer_op_name(op_id).decode()

    def overflow_step(self, budget: int, reset: bool) -> None:
        """For :meth:`watch_overflow`: at most ``budget`` calls found from now on keep their tensors (-1:
        every one); ``reset``: a new step, no NaN/Inf seen in it yet."""
        self._lib.td_observer_overflow_step(budget, int(reset))

    def overflow_unwritten(self, keys: list[int], tensors: list[torch.Tensor]) -> None:
        """For :meth:`watch_overflow`: the storages named by ``keys`` (:meth:`keys`) hold no value of the
        run until an op writes them, each marked by the plain tensor of ``tensors`` at its index (FSDP2's
        all-gather buffers at its copy-in); nothing while no check watches."""
        if keys:
            storages, impls = array("q", keys), array("q", [tensor._cdata for tensor in tensors])  # (alive through the call)
            self._lib.td_observer_overflow_unwritten(len(keys), storages.buffer_info()[0], impls.buffer_info()[0])

    def overflow_copies_fail(self, fail: bool = True) -> None:
        """Tests: every copy :meth:`watch_overflow` makes fails from now on, as where memory runs out
        (the calls found save no tensor; the ops run on), or no longer."""
        self._lib.td_observer_overflow_copies_fail(int(fail))

    def overflow_found(self) -> OverflowFound:
        """The calls :meth:`watch_overflow` found among the rows the last :meth:`drain` drained."""
        counts = array("q", [0, 0])
        self._lib.td_observer_overflow_counts(counts.buffer_info()[0])
        rows, kinds, slots = array("q", [0]) * counts[0], array("b", [0]) * counts[0], array("q", [0]) * counts[1]
        if counts[0] or counts[1]:
            self._lib.td_observer_overflow_found(rows.buffer_info()[0], kinds.buffer_info()[0], slots.buffer_info()[0])
        kept = torch.ops.torchdebug.observer_overflow_kept() if counts[1] else []
        return OverflowFound(rows, kinds, dict(zip(slots, kept)))

    def finish_collectives(self) -> None:
        """Wait for the collectives still in flight and record their outputs (before :meth:`stop`)."""
        self._lib.td_observer_finish_collectives()

    def finish_functional(self) -> None:
        """Wait for the functional collectives not waited for (after :meth:`stop`, before :meth:`drain`):
        the slots on their outputs were kept, to be read once final."""
        self._lib.td_observer_finish_functional()

    def start(self, level: int = RECORD) -> bool:
        """Observe the ops of this thread and of the autograd graph tasks it runs; ``False`` when it
        already observes."""
        started = bool(self._lib.td_observer_start(level))
        self.running = self.running or started
        return started

    def stop(self) -> None:
        self._lib.td_observer_stop()
        self.running = False

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
        counts = c_array(ctypes.c_int64, 5)()
        self._lib.td_observer_counts(counts)
        ops, slots, dims, kept = counts[0], counts[1], counts[2], counts[4]
        sizes = [ops] * _OP_COLUMNS + [slots] * _SLOT_COLUMNS + [dims, dims, slots, slots, slots, slots * WIDTH, kept, ops]
        sizes += [slots] * 3 + [ops] * 2 + [kept]  # slot_base, slot_has_fingerprint, slot_fingerprint; mark, made; kept_staged
        columns = {name: np.empty(size, kind) for (name, kind), size in zip(_COLUMNS, sizes)}  # (filled once: by the drain)
        addresses = {name: data_address(column) if len(column) else 0 for name, column in columns.items()}
        self._lib.td_observer_drain(counts, c_array(ctypes.c_void_p, len(_COLUMNS))(*addresses.values()))
        for op_id in range(len(self._names), self._lib.td_observer_op_names()):
            self._names.append(self._lib.td_observer_op_name(op_id).decode())
        tensors = torch.ops.torchdebug.observer_kept() if kept else []
        freed = np.empty(self._lib.td_observer_freed_count(), np.int64)
        addresses["freed"] = data_address(freed) if len(freed) else 0
        if len(freed):
            self._lib.td_observer_take_freed(addresses["freed"])
        size = ctypes.c_int64()
        texts = self._lib.td_observer_value_texts(ctypes.byref(size))
        value_texts = ctypes.string_at(texts, size.value).decode().split("\0")[:-1] if size.value else []
        return ObservedOps(
            list(self._names), counts[3], **columns, kept=tensors, value_texts=value_texts, freed=freed, addresses=addresses
        )

    def forget_seen(self) -> None:
        """Drop the weak references the drains hold (a new capture's value ids start afresh)."""
        self._lib.td_observer_forget_seen()


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
