"""The native observer's rows (``torchdebug.native.observer``) as the store's record columns, named as
eager capture (``eager.py``) names them: one Arrow record batch per drain, no record or statistics dict per slot
(:meth:`NativeStepCapture.slot_columns`, ``store/_slot_columns.py``); :meth:`~NativeStepCapture.records`
reads them back as :class:`~torchdebug.records.Record`\\ s.

    capture = NativeStepCapture(observer, model)
    capture.start()
    loss = model(x).sum(); loss.backward(); optimizer.step()
    capture.stop()
    records = capture.records()       # forward/fc1/aten.addmm.default#0/output.0, ...

How rows are named, ids, statistics, fingerprints and stacks given, and what is not mirrored (sent
to the dispatch mode by ``capture/native_capture.py``):
docs/architecture.md, "The native path (issue 48)".
"""

from __future__ import annotations

import functools
import logging
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn
from torch.compiler import is_compiling
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from torchdebug._torch.compiling import CompileEvents
from torchdebug._torch.custom_ops import DispatcherCalls
from torchdebug._torch.dispatch import OpOverload, op_schema
from torchdebug._torch.fsdp import issuing_group, unshard_buffers
from torchdebug._torch.global_hooks import never_compiled_as_a_frame
from torchdebug._torch.nn import parameters_and_hooked
from torchdebug.capture.eager import COPY_IN, OpInfo, op_info
from torchdebug.capture.filters import RangeGate
from torchdebug.capture.modules import ModuleTracker
from torchdebug.capture.native_recompute import RecomputeMarks
from torchdebug.capture.native_subclasses import Described, described, read_subclasses
from torchdebug.capture.native_values import (
    CHANGED,
    CHANGED_TEXT,
    FIRST_OWNER,
    PHASES,
    Owners,
    RowCalls,
    SlotWalk,
    WalkedSlots,
    distinct,
    load_slot_walk,
)
from torchdebug.capture.stacks import describe_stack, is_user_file
from torchdebug.capture.unwritten import markable
from torchdebug.errors import DumpError
from torchdebug.native.observer import (
    LAID_OUT,
    MODULE_ROW_OP,
    MODULE_ROWS,
    NESTED,
    PLAIN,
    RECORD,
    STAGED_FACTS_WIDTH,
    SUBCLASS,
    VALUE,
    NativeObserver,
    ObservedOps,
    StagedFacts,
    staged_fact,
)
from torchdebug.records import NO_MODULE, STATS_NOT_TAKEN, Record, layout_not_captured
from torchdebug.slots import dtype_name
from torchdebug.stats import NO_STATISTICS, empty_stats, has_statistics
from torchdebug.stats_table import FingerprintSink, LandedSums, Landing, StatsSink
from torchdebug.store import (
    FixedColumns,
    SavedTensors,
    SlotColumns,
    arrow_array,
    arrow_strings,
    arrow_text,
    records_from_table,
    unread_text,
)

__all__ = ["NativeStepCapture", "OpSlotNames", "RowNames", "Snapshots", "op_overload"]

logger = logging.getLogger(__name__)

_OUTSIDE, _OPTIMIZER = -1, -2
"""Module contexts that name no path: outside every module, inside an optimizer step."""

_IO = ("input", "output")

SWEEP_AFTER_BYTES = 64 << 20
"""Bytes of CPU tensors recorded after which the observer lets go of the freed ones it holds
(``NativeObserver.sweep_after``; why and how: docs/architecture.md, "The native path (issue 48)", value ids by address)."""

NO_STATISTICS_CODE, STATS_NOT_TAKEN_CODE = 5, 6
"""``WalkedSlots.errors`` codes Python sets: a kept tensor whose dtype has no statistics
(``stats.has_statistics``); one whose statistics failed to be taken (a fault of ours, logged)."""

_ERRORS = {
    SUBCLASS: "a tensor subclass: not read by the native path",
    NESTED: "a nested tensor: not read by the native path",
    CHANGED: CHANGED_TEXT,
    NO_STATISTICS_CODE: NO_STATISTICS,
    STATS_NOT_TAKEN_CODE: STATS_NOT_TAKEN,
}


def _without_statistics(walked: WalkedSlots, entries: list[int], code: int) -> None:
    """The slots whose statistics come from ``entries`` (``WalkedSlots.stats`` references) have none,
    and error ``code`` where they had no other."""
    if entries:
        without = np.isin(walked.stats, entries)
        walked.stats[without] = -1
        walked.errors[without & (walked.errors == 0)] = code


_LAYOUT_CODES = 16
"""Layout codes a ``LAID_OUT`` slot's flag may add (c10 has 8; a later one is named ``torch.layout``)."""


def _has(stats: dict[str, Any] | int, arrived: np.ndarray) -> bool:
    """Whether a ``taken`` entry's statistics arrived: a dict filled, or a key of sums landed."""
    return bool(arrived[stats]) if type(stats) is int else bool(stats)


def _not_arrived(read: np.ndarray, taken: list[dict | int], early_keys: np.ndarray | None, arrived: np.ndarray) -> list[int]:
    """The entries of ``read`` whose statistics have not arrived (:func:`_has`): those whose sums
    landed before the drain (``early_keys``, by entry, -1 not) by array, the others one by one."""
    if early_keys is None:
        return [entry for entry in read.tolist() if not _has(taken[entry], arrived)]
    keys = np.full(len(read), -1, np.int64)  # (a subclass's entries come after the walk's: not staged before)
    walked = read < len(early_keys)
    keys[walked] = early_keys[read[walked]]
    early = keys >= 0
    missing = read[early][~arrived[keys[early]]].tolist()
    return missing + [entry for entry in read[~early].tolist() if not _has(taken[entry], arrived)]


@functools.cache
def _error_texts(observer: NativeObserver) -> pa.Array:
    """``capture_error`` by the walk's code (``WalkedSlots.errors``), made once an observer names its layouts."""
    texts = _ERRORS | {LAID_OUT + code: layout_not_captured(observer.layout_name(code)) for code in range(1, _LAYOUT_CODES)}
    return arrow_strings([texts.get(code) for code in range(max(texts) + 1)])


@dataclass(slots=True)
class _Staged:
    """A kept tensor's statistics and fingerprint staged (:meth:`NativeStepCapture.stage_kept`) or
    read at the drain, as they arrive: made where one is used, :class:`_StagedValues` holding what
    it holds from a staging to the drain."""

    stats: dict[str, Any] | int
    """Its statistics, or the key of its sums among the drain's :class:`LandedSums`."""
    reduced: bool
    """Its dtype has statistics (else a fingerprint alone)."""
    fingerprint: Landing
    """Where the fingerprint lands, at :attr:`at`, once it arrives."""
    at: int = 0
    failed: bool = False
    """Staging raised for it: its slots say the statistics were not taken."""
    tensor: dict[str, Any] | None = None
    """With ``task="tensor"``: its tensor reference (:class:`Snapshots`)."""
    sampled: int | None = None
    """Its sampling stride where it was saved sampled."""


StageLanded = Callable[[list[torch.Tensor], LandedSums, np.ndarray, np.ndarray, bool], None]
"""``StatsStager.add_landed``: tensors whose statistics land as sums at their keys, what the
observer says of where their elements are (``StagedFacts`` from :attr:`~StagedFacts.address` on),
and whether their fingerprints land there too."""

_DTYPE_FACT = StagedFacts._fields.index("dtype")
_MEMORY_FACTS = StagedFacts._fields.index("address")

_LISTED_FROM = 32
"""Tensors of a staging's part from which their statistics are staged by array
(:meth:`NativeStepCapture._stage_listed`): below, numpy's calls a part cost more than the Python a
tensor they spare (``docs/architecture.md``, "The native path (issue 48)", staging)."""

_STAGED_TOGETHER = 256
"""Kept tensors the observer hands over together at most, the objects made for them (their Python
tensors, the stager's items) alive meanwhile: a staging of more is taken in parts, each its own
launches of the Triton kernel. Why 256, not one launch's 1,024: ``docs/architecture.md``, "The
native path (issue 48)", staging."""


class _StagedValues:
    """What the stagings of one step took of its kept tensors until the drain, by the id the observer
    gave each, in dicts of plain values: an object a tensor (a :class:`_Staged`, its fingerprint's
    list) would outlive the young collections of the step, and at every tensor of a step staged (an
    accelerator's, ``task="tensor"``) bring on a full collection of the process every few steps
    (``docs/architecture.md``, "The native path (issue 48)", staging). Their statistics land as sums
    in :attr:`landed`, by id less :attr:`first`, finished at the drain all at once; those a saved
    copy took (``task="tensor"``) come as dicts."""

    def __init__(self, first: int) -> None:
        self.first = first
        """The id of the first tensor staged after the last drain."""
        self.landed = LandedSums()
        """By id less :attr:`first`: the sums of the tensors staged without a copy."""
        self.stats: dict[int, dict[str, Any]] = {}
        """By the id of the tensor that read them, those a saved copy took (a statistics dict of
        numbers: untracked by the collector)."""
        self.fingerprints: dict[int, int | None] = {}
        """By the same id, ``None`` until it arrives: those of saved tensors (the others land in
        :attr:`landed`, by key)."""
        self.unreduced: set[int] = set()
        """The ids of tensors whose dtype has no statistics (a fingerprint alone)."""
        self.failed: set[int] = set()
        self.tensors: dict[int, dict[str, Any] | None] = {}
        """With ``task="tensor"``: by id, its tensor reference (``None``: not saved)."""
        self.sampled: dict[int, int] = {}
        """With ``task="tensor"``: by id, its sampling stride where it was saved sampled."""

    def staged(self, id_: int) -> _Staged | None:
        """What staging ``id_`` took, or ``None``: not staged."""
        stats: dict[str, Any] | int | None = self.stats.get(id_)
        fingerprint: Landing = self.fingerprints
        at = id_
        if stats is None:
            stats = at = id_ - self.first
            fingerprint = self.landed
            if not self.landed.holds(stats):
                return None
        return _Staged(
            stats,
            id_ not in self.unreduced,
            fingerprint,
            at,
            id_ in self.failed,
            self.tensors.get(id_),
            self.sampled.get(id_),
        )


class _StagedBySlot:
    """A drain's kept tensors staged before it, by drained slot (``ObservedOps.kept_staged`` gives
    their ids): each a :class:`_Staged` made as it is asked for and let go after, where a dict of all
    of them (a step's every tensor, on an accelerator) would be alive through the drain's young
    collections; those the drain saves itself (``task="tensor"``) are set."""

    def __init__(self, values: _StagedValues, ids: dict[int, int]) -> None:
        self._values = values
        self._ids = ids
        self._set: dict[int, _Staged] = {}

    def get(self, slot: int) -> _Staged | None:
        found = self._set.get(slot)
        if found is not None:
            return found
        id_ = self._ids.get(slot)
        return None if id_ is None else self._values.staged(id_)

    def __setitem__(self, slot: int, staged: _Staged) -> None:
        self._set[slot] = staged


Saved = tuple[dict[str, Any], dict[str, Any] | None, int | None]
"""A saved tensor's reference, its statistics where its copy took them, its sampling stride."""

Save = Callable[[str, torch.Tensor, bool], Saved]
"""``CaptureSession.snapshot``: saves a tensor under a key, with its statistics where the copy took them."""


class Snapshots:
    """The kept tensors one step saves (``task="tensor"``), each under a key of its own
    (``saved.<n>``: no call is named yet). A tensor staged again at the same version (another slot
    of it) takes the reference saved first, and a view of a tensor saved whole at that version (a
    view's version is its base's) a view of it, as ``CaptureSession`` shares what it saved; but
    where its values may have changed unseen (``StagedFacts.same_values``) and where the observer
    said nothing (``facts`` ``None``)."""

    def __init__(self, save: Save, view_ref: Callable[..., dict[str, Any]], counter: list[int]) -> None:
        self._save = save
        self._view_ref = view_ref
        self._counter = counter
        # Held to the drain, so in dicts of their own rather than a tuple a tensor (``_StagedValues``).
        self._saved: dict[tuple[int, int, int], dict[str, Any]] = {}
        """By key, version and collectives' writes: the reference of what was saved of a tensor."""
        self._saved_stats: dict[tuple[int, int, int], dict[str, Any]] = {}
        """By the same: its statistics, where its copy took them."""
        self._saved_sampled: dict[tuple[int, int, int], int] = {}
        """By the same: its sampling stride, where it was saved sampled."""
        self._whole: dict[tuple[int, int, int], dict[str, Any]] = {}
        """By key, version and collectives' writes: the reference of a tensor saved whole."""
        self._whole_span: dict[tuple[int, int, int], tuple[int, int, torch.dtype]] = {}
        """By the same: its first element, element count and dtype."""

    def take(self, tensor: torch.Tensor, with_stats: bool, facts: StagedFacts | None) -> Saved:
        """``tensor``'s reference, its statistics where its copy took them, its sampling stride."""
        shared = facts is not None and facts.same_values
        values = (facts.key, facts.version, facts.writes) if shared else None
        if values is not None and (ref := self._saved.get(values)) is not None:  # (most: an earlier op's output)
            return ref, self._saved_stats.get(values), self._saved_sampled.get(values)
        offset = tensor.storage_offset()
        last = offset + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size)
        if tensor.numel() and tensor.untyped_storage().nbytes() < (last + 1) * tensor.element_size():
            raise RuntimeError("its memory was freed since it was kept")  # (FSDP2's reshard frees its buffers so)
        of_base = (facts.base, facts.version, facts.writes) if values is not None and facts.base else None
        base = self._whole.get(of_base) if of_base is not None else None
        if values is not None and base is not None and tensor.numel() and not (tensor.is_conj() or tensor.is_neg()):
            first, count, dtype = self._whole_span[of_base]
            if dtype == tensor.dtype and first <= offset and last < first + count:
                view = self._saved[values] = self._view_ref(base, list(tensor.shape), list(tensor.stride()), offset - first)
                return view, None, None
        self._counter[0] += 1
        ref, stats, sampled = self._save(f"saved.{self._counter[0]}", tensor, with_stats)
        if values is not None:
            self._saved[values] = ref
            if stats is not None:
                self._saved_stats[values] = stats
            if sampled is not None:
                self._saved_sampled[values] = sampled
            elif tensor.is_contiguous() and not (tensor.is_complex() or tensor.is_neg()):  # (as saved)
                self._whole[values] = ref
                self._whole_span[values] = (offset, tensor.numel(), tensor.dtype)
        return ref, stats, sampled


@dataclass(frozen=True, slots=True)
class OpSlotNames:
    """How a dispatch mode's ``iter_slots`` names an op's tensor slots, from its schema."""

    inputs: tuple[str, ...]
    """By schema position: ``"0"``, ``"1"``, ..., the name of a keyword-only argument."""
    list_result: bool
    """The op returns one list (``split``): a dispatch mode sees a list, its elements are ``0``, ``1``."""

    @classmethod
    def of(cls, overload: OpOverload) -> OpSlotNames:
        """The slot names of an op overload (``op_overload("aten.mm.default")``)."""
        schema = op_schema(overload)
        inputs = tuple(argument.name if argument.kwarg_only else str(index) for index, argument in enumerate(schema.arguments))
        returns = schema.returns
        list_result = len(returns) == 1 and isinstance(returns[0].type, torch.ListType)
        return cls(inputs, list_result)


def op_overload(op_name: str) -> OpOverload:
    """The overload named ``aten.mm.default`` (any namespace ``torch.ops`` knows)."""
    namespace, _, rest = op_name.partition(".")
    name, _, overload = rest.rpartition(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


class NativeStepCapture:
    """One step's ops, seen by the native observer and named as eager capture names them.

    While it runs, the observer's module context holds what eager capture asks Python for per op:
    the path of the innermost running module (kept by
    :class:`~torchdebug.capture.modules.ModuleTracker`'s global hooks), ``optimizer`` between an
    optimizer's step pre- and post-hooks (a closure given to the step runs outside it), and a
    parameter's path while its ``AccumulateGrad`` node runs (a tensor hook before it, a
    post-accumulate-grad hook after it).
    """

    def __init__(
        self,
        observer: NativeObserver,
        model: nn.Module | None,
        *,
        tracker: ModuleTracker | None = None,
        step: int = 0,
        rank: int = 0,
        stacks: bool = False,
        stack_range: list[str] | None = None,
        ops: bool = True,
    ) -> None:
        """``tracker``: a module tracker its owner starts and stops (default: one of its own).
        ``stacks``: each forward op's user frames, and each backward op its forward op's;
        ``stack_range`` (``[FROM, TO]``): only the calls of that range, each step, keep them, as
        eager capture's ``OpCapture._stack`` keeps them. ``ops=False``: no op is observed, the rows
        are module calls' only (level ``module``, ``native_modules.py``)."""
        self.observer = observer
        self.ops = ops
        self.stacks = stacks
        self._stack_gate = RangeGate(stack_range) if stack_range else None
        self._stacked: dict[str, bool] = {}
        """This step's forward (and recomputed) calls by name: whether the range gave them a stack,
        which the backward calls that differentiate them inherit."""
        self.model = model
        self.step = step
        self.rank = rank
        self._own_tracker = tracker is None
        self.tracker = ModuleTracker(model) if tracker is None else tracker
        self.tracker.recorder = self
        self._paths: list[str] = []
        self._context_of: dict[str, int] = {}
        self._parameter_contexts: set[int] = set()
        self._context = _OUTSIDE
        self._before_optimizer = _OUTSIDE
        self._in_optimizer = 0
        self._handles: list[Any] = []
        self._dtype_names = {code: dtype_name(dtype) for code, dtype in observer.dtypes.items()}
        """By ``c10::ScalarType`` code: ``float32``."""
        self._op_names: list[str] = []
        """By op name id (``ObservedOps.names``), of the ops the walk was told of: ``aten.mm.default``."""
        self._stacks: list[tuple[str, list[str], str]] = []
        self._stack_of_key: dict[tuple, int] = {}
        self._stack_indices: list[int] = []
        """By the observer's stack id: an index into :attr:`stack_table`, -1 for no user frame."""
        self._slot_walk: SlotWalk | None = None
        """Row names, value ids, shared statistics and unwritten memory, walked in C++ (made at the first drain)."""
        self._text_columns: dict[str, tuple[list[str | None], pa.Array]] = {}
        self._named: tuple[list[np.ndarray], dict[str, pa.Array]] = ([], {})
        """The ops and calls of the last drain named, and their columns: the same object again for
        a drain of the same calls, which lets :class:`FixedColumns` keep the columns made of them."""
        self._fixed = FixedColumns()
        self._arg_columns: pa.RecordBatch | None = None
        self._observed = False
        """Whether this capture started the observer before (its first start drops older weak references)."""
        self._devices: dict[tuple[int, int], str] = {}
        self._recompute = RecomputeMarks(observer)
        self._dispatcher_calls = DispatcherCalls()
        self._compiles = CompileEvents(observer.compiling)
        self._adopted: set[int] = set()
        """The ids of the modules :meth:`_adopt` adopted since :meth:`start`."""
        self._accumulated: tuple[list[torch.Tensor], list[int]] = ([], [])
        """The parameters whose accumulations the observer names, and their contexts (:meth:`_adopt`)."""
        self._owners: dict[tuple[int, int], int] = {}
        """FSDP2 groups' ops' owners, ``(phase code or -1, module context)``, by index (``_owned``)."""
        self._unshards: list[list[int]] = []
        """The storages each FSDP2 copy-in recorded since the last walk hands out, in order (``_unshard``)."""
        self._described: dict[int, Described] = {}
        """The subclass instances met since the last drain, by the key their slots name them by (``_subclass``)."""
        self._at_address: dict[int, Described] = {}
        """The same by ``TensorImpl`` address, the last instance met at each."""
        self.record_slots = np.zeros(0, np.int64)
        """The drained slot of each record :meth:`slot_columns` made last, in order."""
        self._staged = _StagedValues(observer.next_staged_id)
        """The kept tensors staged before the drain, by the id the observer gave them (:meth:`stage_kept`)."""
        self._told_stage_fault = False
        self._told_save_fault = False
        self._has_statistics: np.ndarray | None = None
        """Whether a dtype has statistics, by ``c10::ScalarType`` code (:meth:`_reduced`)."""
        self._saved = [0]
        """Tensors saved in this run (``task="tensor"``): the last key's number (:class:`Snapshots`)."""

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> None:
        """Track modules, optimizer steps and gradient accumulations, and start the observer."""
        self._handles = [
            register_optimizer_step_pre_hook(self._optimizer_enter),
            register_optimizer_step_post_hook(self._optimizer_exit),
        ]
        self._accumulated = ([], [])
        self._adopted.clear()
        self._unshards.clear()  # (left by a drain not named: records no longer taken)
        self._described.clear()
        self._at_address.clear()
        self.observer.sweep_after(SWEEP_AFTER_BYTES)
        if self.model is not None:
            self._adopt(self.model)
        if self._own_tracker:
            self.tracker.start()
        self._set_context(_OUTSIDE)
        self.observer.use_owners(self._owner, self._unshard)
        if self.ops:
            self._dispatcher_calls.enter()  # custom ops reach the observer (torch 2.14's skip the dispatcher's call)
        self._compiles.enter()  # the ops Dynamo runs while it compiles are not recorded
        self.observer.use_subclass_hook(self._subclass)
        self.observer.want_stacks(self.stacks)
        self.observer.want_values(True)
        if not self._observed:  # a new run's value ids: the addresses an earlier capture drained are not its
            self._observed = True
            self.observer.forget_seen()
        self.observer.start(RECORD if self.ops else MODULE_ROWS)

    def stop(self) -> None:
        self.observer.stop()
        self.observer.use_owners(None, None)
        self._dispatcher_calls.exit()
        self._compiles.exit()
        self.observer.use_subclass_hook(None)
        self.observer.want_values(False)
        self._recompute.reset()
        if self._own_tracker:
            self.tracker.stop()
        self.observer.name_accumulations([], [])
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._in_optimizer = 0

    def _adopt(self, root: nn.Module) -> None:
        """Adopt ``root``'s modules, as the module tracker adopts a model: a gradient's accumulation
        (its hooks, the user's included, the sum, its post hooks: DDP's copy into a bucket) runs in its
        parameter's context, which the observer names from the node; the ops a module's own forward
        hooks run are its (``ModuleTracker.current``) until they are done, which a hook registered
        after them says. The model handed to :meth:`start`, else each top-level module as its call
        starts (:meth:`enter`)."""
        self._adopted.add(id(root))
        every, hooked = parameters_and_hooked(root)
        parameters, contexts = self._accumulated
        for parameter in every:
            path = self.tracker.parameter_path(parameter)
            if parameter.requires_grad and path is not None:
                contexts.append(self._intern(path))
                parameters.append(parameter)
        self._parameter_contexts.update(contexts)
        self.observer.name_accumulations(parameters, contexts)
        for module in hooked:
            self._handles.append(module.register_forward_hook(never_compiled_as_a_frame(self._own_hooks_done), always_call=True))

    # -- module context ------------------------------------------------------------------------
    def _intern(self, path: str) -> int:
        context = self._context_of.get(path)
        if context is None:
            context = self._context_of[path] = len(self._paths)
            self._paths.append(path)
        return context

    def _set_context(self, context: int) -> None:
        if is_compiling():  # a module hook Dynamo traces: compiled code runs in the context of its call
            return
        self._set_module(context)

    def _set_module(self, context: int) -> None:
        """The module context of the rows from now on (``_set_context`` without the question, for
        callers that asked it)."""
        self._context = context
        self.observer.set_module(context)

    def enter(self, module: nn.Module, name: str, args: tuple, phase: str, traced: bool) -> None:
        """The tracker entered ``module`` (its path ``name``), in ``phase`` ``forward`` or ``recompute``;
        ``traced`` by Dynamo (torch 2.11 and 2.14 trace global hooks), nothing: a path interned there
        would be a guard on the paths known, and each new one a recompile. With no model handed to
        :meth:`start`, a top-level module is adopted at its call's start (:meth:`_adopt`)."""
        if not traced:
            if self.model is None and self.tracker.depth == 1 and id(module) not in self._adopted:
                self._adopt(module)
            self._set_module(self._intern(name))

    def exit(self, module: nn.Module, name: str, kwargs: dict[str, Any], output: Any, traced: bool) -> None:
        """The tracker left ``module``: the context is the enclosing module's."""
        self.drop(traced)

    def _own_hooks_done(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.tracker.hooks_done(module)
        self.drop(is_compiling())

    def drop(self, traced: bool) -> None:
        if traced:  # as enter
            return
        current = self.tracker.current()
        self._set_module(_OUTSIDE if current == NO_MODULE else self._intern(current))

    def _optimizer_enter(self, optimizer: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
        if self.observer.accumulating():  # a step in a gradient's accumulation (the optimizer in the backward): its ops
            return None
        if not self._in_optimizer:
            self._before_optimizer = self._context
        self._in_optimizer += 1
        self._set_context(_OPTIMIZER)
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._outside_optimizer(kwargs["closure"])}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
            return (args[0], self._outside_optimizer(args[1]), *args[2:]), kwargs
        return None

    def _outside_optimizer(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        """``closure``, run in the context the optimizer step was called in (its forward is a forward)."""

        def run() -> Any:
            self._set_context(self._before_optimizer)
            try:
                return closure()
            finally:
                self._set_context(_OPTIMIZER)

        return run

    def _optimizer_exit(self, *_: Any) -> None:
        if self.observer.accumulating():
            return
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if not self._in_optimizer:
            self._set_context(self._before_optimizer)

    # -- tensor subclasses ------------------------------------------------------------------------
    def _subclass(self, tensor: torch.Tensor) -> int:
        """Called by the observer at each op taking or returning a subclass instance (``observer.cpp``'s
        find_subclasses): describe it, once a drain, and return the address of the plain tensor the
        callback reads it through, or 0. (Once a sweep let go of a freed instance, another may take
        its address before the drain, under another key: ``NativeObserver.sweep_after``.)"""
        found = self._at_address.get(address := tensor._cdata)
        if found is None or found.instance() is not tensor:
            found = self._at_address[address] = described(tensor)
            self._described[self.observer.keys([address])[0]] = found
        return found.plain

    # -- FSDP2 groups' ops -----------------------------------------------------------------------
    def _owner(self) -> int:
        """Called by the observer at a collective or an fsdp op (``observer.cpp``'s Owners): the row's
        module context, an owner's when an FSDP2 group runs the op (``collective_owner``), else -1."""
        return self._owned(issuing_group(sys._getframe(1)))

    def _unshard(self) -> int:
        """At FSDP2's copy-in: as :meth:`_owner`, noting the buffers its unshard hands out (``eager.py``'s
        ``_passes_through``), which the walk marks at its row, and the observer's overflow check at once."""
        frame = sys._getframe(1)
        buffers = list(markable(unshard_buffers(frame)))
        keys = self.observer.keys([key for key, _, _ in buffers])
        self._unshards.append(keys)
        self.observer.overflow_unwritten(keys, [tensor for _, tensor, _ in buffers])  # (the overflow check's, if one watches)
        return self._owned(issuing_group(frame))

    def _owned(self, group: tuple[tuple[nn.Module, ...], str | None] | None) -> int:
        if group is None:
            return -1
        modules, phase = group
        key = (-1 if phase is None else PHASES.index(phase), self._intern("+".join(map(self.tracker.name_of, modules))))
        return FIRST_OWNER - self._owners.setdefault(key, len(self._owners))

    def _unshard_rows(self, ops: ObservedOps) -> list[tuple[int, list[int]]]:
        """The drain's copy-in rows with the storages each hands out, taken from :attr:`_unshards`."""
        if not self._unshards:
            return []
        copy_in = [op_id for op_id, name in enumerate(ops.names) if name == COPY_IN]
        rows = np.flatnonzero(np.isin(np.frombuffer(ops.op, np.int32), copy_in)) + ops.first_row
        taken, self._unshards = self._unshards[: len(rows)], self._unshards[len(rows) :]
        return list(zip(rows.tolist(), taken))

    # -- conversion ----------------------------------------------------------------------------
    def next_step(self) -> None:
        """Count calls and link backward rows afresh (value ids stay: they are the run's)."""
        self.step += 1
        if self._slot_walk is not None:
            self._slot_walk.next_step()
        if self._stack_gate is not None:
            self._stack_gate.reset()
            self._stacked.clear()

    def records(self) -> list[Record]:
        """Drain the observer and name its rows (see the module docstring), as records read back."""
        return self.convert(self.observer.drain())

    def convert(self, ops: ObservedOps) -> list[Record]:
        """The tensor records of drained rows, in row order (inputs, then outputs, of each op): the
        columns of :meth:`slot_columns` read as a dump's reader reads them."""
        return records_from_table(pa.Table.from_batches([self.slot_columns(ops, self.name_rows(ops))]))

    def name_rows(self, ops: ObservedOps) -> RowNames:
        """Each drained row's call (see the module docstring), named in C++ (``SlotWalk.name_rows``)
        and spelled as columns; calls are counted on from the rows drained before in this step."""
        walk = self._walk(ops)
        stack_ids, frames = self._stack_ids(ops)
        stacks = self._user_stacks(stack_ids, frames) if self.stacks else np.full(len(ops.op), -1, np.int64)
        marks = self._recompute.marks(ops, stack_ids, frames)
        calls = walk.name_rows(
            ops,
            stacks,
            np.fromiter(self._parameter_contexts, np.int64, len(self._parameter_contexts)),
            marks,
            _ends(ops) if self._recompute.recomputed else np.zeros((len(ops.op), 2), np.int64),  # (read for recomputations only)
            Owners(tuple(phase for phase, _ in self._owners), tuple(module for _, module in self._owners)),
        )
        if self._stack_gate is not None:
            self._gate_stacks(ops, calls)
        structure = [np.asarray(ops.op), *calls]
        if len(structure) == len(self._named[0]) and all(np.array_equal(a, b) for a, b in zip(structure, self._named[0])):
            return RowNames(calls.phase, calls.stack, self._named[1])  # as the last drain's: a steady step
        modules = self._texts([NO_MODULE, *self._paths], "modules")
        op_names = self._texts(self._op_names, "ops")
        ops_column = op_names.take(arrow_array(np.frombuffer(ops.op, np.int32)))
        module = modules.take(arrow_array(calls.module + 1))
        call = arrow_array(calls.call)
        phases = self._texts(list(PHASES), "phases")
        fwd = pc.binary_join_element_wise(
            phases.take(arrow_array(calls.fwd_phase)),
            modules.take(arrow_array(calls.fwd_module + 1)),
            pc.binary_join_element_wise(
                op_names.take(arrow_array(calls.fwd_op, missing=calls.fwd_op < 0)), call_text(calls.fwd_call), arrow_text("#")
            ),
            arrow_text("/"),
        )
        phase = phases.take(arrow_array(calls.phase, missing=calls.phase < 0))
        stack = arrow_array(calls.stack, missing=calls.stack < 0)
        columns = {
            "call_name": pc.binary_join_element_wise(
                phase, module, pc.binary_join_element_wise(ops_column, call_text(calls.call), arrow_text("#")), arrow_text("/")
            ),
            "phase": phase,
            "module": module,
            "op": ops_column,
            "call": call,
            "fwd": fwd,
            "stack": self._texts([described[0] for described in self._stacks], "stack ids").take(stack),
            "source": self._texts([described[2] for described in self._stacks], "sources").take(stack),
        }
        self._named = (structure, columns)
        return RowNames(calls.phase, calls.stack, columns)

    def _gate_stacks(self, ops: ObservedOps, calls: RowCalls) -> None:
        """Take the stacks of the calls outside ``stack_range`` (in place): each call is checked in
        row order, and a backward call keeps its forward call's stack only where both are inside."""
        gate, stacked, stack = self._stack_gate, self._stacked, calls.stack
        assert gate is not None
        modules, op_names = [NO_MODULE, *self._paths], self._op_names

        def name(phase: int, module: int, op: int, call: int) -> str:
            return f"{PHASES[phase]}/{modules[module + 1]}/{op_names[op]}#{call}"

        backward = PHASES.index("backward")
        fwd = zip(calls.fwd_phase.tolist(), calls.fwd_module.tolist(), calls.fwd_op.tolist(), calls.fwd_call.tolist())
        rows = zip(calls.phase.tolist(), calls.module.tolist(), np.asarray(ops.op).tolist(), calls.call.tolist(), fwd)
        for row, (phase, module, op, call, (fwd_phase, fwd_module, fwd_op, fwd_call)) in enumerate(rows):
            if phase < 0:
                continue
            inside = gate.check(own := name(phase, module, op, call))
            if phase == backward:
                inside = inside and fwd_op >= 0 and stacked.get(name(fwd_phase, fwd_module, fwd_op, fwd_call), False)
            else:
                stacked[own] = inside
            if not inside:
                stack[row] = -1

    def _stack_ids(self, ops: ObservedOps) -> tuple[np.ndarray, list[list[tuple[str, int, str]]]]:
        """Each row's frames: the observer's stack id (-1: none taken), and the frames by id."""
        stack_ids = np.frombuffer(ops.stack, np.int64)
        return stack_ids, self.observer.stacks() if (stack_ids >= 0).any() else []

    def _user_stacks(self, stack_ids: np.ndarray, frames: list[list[tuple[str, int, str]]]) -> np.ndarray:
        """Each row's stack as eager capture's ``StackRecorder`` describes it (user frames only): an
        index into :attr:`stack_table`, or -1: none taken, one with no user frame."""
        indices = self._stack_indices
        indices += [self._stack_index(stack) for stack in frames[len(indices) :]]
        return np.array(indices + [-1], np.int64)[stack_ids]

    def _stack_index(self, frames: list[tuple[str, int, str]]) -> int:
        key = tuple((f, function, line) for f, line, function in frames if is_user_file(f))
        if not key:
            return -1
        index = self._stack_of_key.get(key)
        if index is None:
            index = self._stack_of_key[key] = len(self._stacks)
            self._stacks.append(describe_stack(key))
        return index

    @property
    def stack_table(self) -> list[tuple[str, list[str], str]]:
        """The stacks rows name (``RowNames.stack``): ``(stack id, frames, source)``, as ``describe_stack`` gives them."""
        return self._stacks

    def stage_kept(
        self,
        stage: Callable[[list[tuple]], None],
        stage_landed: StageLanded,
        statistics: bool,
        fingerprints: bool,
        snapshots: Snapshots | None = None,
    ) -> None:
        """Stage the statistics (with ``statistics``) and fingerprints (with ``fingerprints``) of the
        kept tensors the observer lets go now (``stage``: ``CaptureSession.stage_stats``; many at once,
        their sums and fingerprints landed by key: ``stage_landed``, ``CaptureSession.stage_landed``), for
        :meth:`slot_columns` to take at the drain: the observer's hook, run before an op writes memory
        a kept tensor is on, and once enough bytes of them are held; with ``snapshots``
        (:meth:`snapshots`), save them too. A fault here costs their statistics (their slots say so),
        never the op. A tensor kept by several slots at one version (an op's output, the next op's
        input) is handed over once a staging (``NativeObserver.stage_kept``): its slots share what it gives."""
        first_part = True
        while True:  # in parts: the objects made for a part's tensors alive only meanwhile
            first, tensors = self.observer.stage_kept(_STAGED_TOGETHER, first_part)
            facts = self.observer.staged_facts(len(tensors))
            self._stage_part(first, tensors, facts, stage, stage_landed, statistics, fingerprints, snapshots)
            if len(tensors) < _STAGED_TOGETHER:
                return
            first_part = False

    def _stage_part(
        self,
        first: int,
        tensors: list[torch.Tensor],
        facts: array,
        stage: Callable[[list[tuple]], None],
        stage_landed: StageLanded,
        statistics: bool,
        fingerprints: bool,
        snapshots: Snapshots | None,
    ) -> None:
        """Stage one part of a staging, ``tensors`` (ids from ``first`` on), and hold what they give
        in :class:`_StagedValues`: statistics alone of :data:`_LISTED_FROM` tensors or more by array
        (:meth:`_stage_listed`), else a few objects a tensor, alive only meanwhile."""
        if snapshots is None and statistics and len(tensors) >= _LISTED_FROM:
            self._stage_listed(first, tensors, facts, stage, stage_landed, fingerprints)
            return
        values_of = self._staged
        first_key = first - values_of.first
        due, ids = [], []
        for index, tensor in enumerate(tensors):
            id_ = first + index
            if fingerprints and snapshots is not None:
                values_of.fingerprints[id_] = None
            reduced = statistics and has_statistics(tensor.dtype)
            if not reduced:
                values_of.unreduced.add(id_)
            sink: StatsSink | None = None
            if snapshots is None:  # its sums land (no object a tensor)
                if reduced:
                    sink = (values_of.landed, first_key + index)
            else:
                stats: dict[str, Any] = {}
                values_of.stats[id_] = stats
                sink = stats if reduced else None  # (a dict the statistics update)
                staged = _Staged(stats, reduced, values_of.fingerprints, id_)
                sink = self._save(snapshots, staged, tensor, sink, staged_fact(facts, index))
                values_of.tensors[id_] = staged.tensor
                if staged.sampled is not None:
                    values_of.sampled[id_] = staged.sampled
            if sink is not None or fingerprints:  # (not where the copy took the statistics)
                fingerprint_sink: FingerprintSink | None = None
                if fingerprints and snapshots is not None:
                    fingerprint_sink = (values_of.fingerprints, id_)
                elif fingerprints:  # (by key, where its sums land)
                    fingerprint_sink = (values_of.landed, first_key + index)
                due.append((tensor, sink, fingerprint_sink))
                ids.append(id_)
        if snapshots is None:
            values_of.landed.expect(range(first_key, first_key + len(tensors)))
        for failed in self._failed_to_stage(stage, due) if due else ():
            values_of.failed.add(ids[failed])

    def _stage_listed(
        self,
        first: int,
        tensors: list[torch.Tensor],
        facts: array,
        stage: Callable[[list[tuple]], None],
        stage_landed: StageLanded,
        fingerprints: bool,
    ) -> None:
        """:meth:`_stage_part` of the statistics (and ``fingerprints``) of many tensors, by array: the
        observer's facts say each one's dtype and where its elements are, and ``stage_landed`` reads
        them without Python a tensor (``StatsStager.add_landed``; a dtype without statistics, its
        fingerprint alone, through ``stage``); where that raises, each again alone."""
        values_of, count = self._staged, len(tensors)
        table = np.frombuffer(facts, np.int64).reshape(count, STAGED_FACTS_WIDTH)
        keys = np.arange(first - values_of.first, first - values_of.first + count)
        landed = values_of.landed
        landed.expect(keys)
        reduced = self._reduced(table[:, _DTYPE_FACT])
        taken = np.flatnonzero(reduced)
        if len(taken) < count:
            left = np.flatnonzero(~reduced)
            values_of.unreduced.update((left + first).tolist())
            if fingerprints:  # (a dtype without statistics: its fingerprint alone)
                printed = [(tensors[index], None, (landed, key)) for index, key in zip(left.tolist(), keys[left].tolist())]
                failed = self._failed_to_stage(stage, printed)
                values_of.failed.update((first + left[failed]).tolist())
            tensors = [tensors[index] for index in taken.tolist()]
        try:
            stage_landed(tensors, landed, keys[taken], table[taken, _MEMORY_FACTS:], fingerprints)
            return
        except Exception as error:
            self._tell_stage_fault(error)
        landing = [(landed, key) for key in keys[taken].tolist()]
        failed = self._failed_alone(stage, [(tensor, at, at if fingerprints else None) for tensor, at in zip(tensors, landing)])
        values_of.failed.update((first + taken[failed]).tolist())

    def _reduced(self, dtypes: np.ndarray) -> np.ndarray:
        """Whether each of ``dtypes`` (``c10::ScalarType`` codes) has statistics."""
        if self._has_statistics is None:
            known = self.observer.dtypes
            self._has_statistics = np.zeros(max(known) + 1, bool)
            self._has_statistics[list(known)] = [has_statistics(dtype) for dtype in known.values()]
        return self._has_statistics[dtypes]

    def snapshots(self, save: Save, view_ref: Callable[..., dict[str, Any]]) -> Snapshots:
        """What saves the kept tensors of one step (``save``: ``CaptureSession.snapshot``, ``view_ref``:
        ``CaptureSession.view_ref``), their keys numbered on through the run."""
        return Snapshots(save, view_ref, self._saved)

    def _save(
        self,
        snapshots: Snapshots,
        staged: _Staged,
        tensor: torch.Tensor,
        sink: dict[str, Any] | None,
        facts: StagedFacts | None = None,
    ) -> dict[str, Any] | None:
        """Save ``tensor`` into ``staged`` (its statistics too, where its copy took them); the
        statistics still to take (``sink``, their dict; ``None`` once filled). A failed save (a write
        of the dump failed, a fault of ours) leaves it unsaved, with its statistics still to take."""
        try:
            staged.tensor, stats, staged.sampled = snapshots.take(tensor, sink is not None, facts)
        except DumpError:  # a write of the dump failed (said once by the writer): statistics alone from now on
            return sink
        except Exception as error:
            if not self._told_save_fault:
                self._told_save_fault = True
                logger.warning("torchdebug: could not save kept tensors (%s: %s)", type(error).__name__, error)
            return sink
        if stats is not None and sink is not None:
            sink.update(stats)
            return None
        return sink

    def _failed_to_stage(self, stage: Callable[[list[tuple]], None], due: list[tuple]) -> list[int]:
        """Stage ``due`` (``CaptureSession.stage_stats``); where that raises (a fault of ours: memory, a
        kernel; said once a capture), each item again alone. The indices of the items that failed."""
        try:
            stage(due)
            return []
        except Exception as error:
            self._tell_stage_fault(error)
        return self._failed_alone(stage, due)

    def _tell_stage_fault(self, error: Exception) -> None:
        """Say once a capture that staging raised (a fault of ours: memory, a kernel)."""
        if not self._told_stage_fault:
            self._told_stage_fault = True
            logger.warning("torchdebug: could not take the statistics of kept tensors (%s: %s)", type(error).__name__, error)

    def _failed_alone(self, stage: Callable[[list[tuple]], None], due: list[tuple]) -> list[int]:
        """Stage each of ``due`` alone; the indices of those that raised."""
        failed = []
        for index, item in enumerate(due):
            try:
                stage([item])
            except Exception:
                failed.append(index)
        return failed

    def slot_columns(
        self,
        ops: ObservedOps,
        rows: RowNames,
        recorded: np.ndarray | None = None,
        *,
        ios: frozenset[str] = frozenset(_IO),
        seqs: np.ndarray | None = None,
        statistics: bool = False,
        fingerprints: bool = False,
        stage: Callable[[list[tuple]], None] | None = None,
        deliver: Callable[[], None] | None = None,
        snapshots: Snapshots | None = None,
        saving: dict[int, torch.Tensor] | None = None,
    ) -> pa.RecordBatch:
        """The records of the slots of the rows ``recorded`` marks (``int8`` per row; default: every
        row with a call in ``rows``), of the sides in ``ios``, as one record batch of the store's
        schema (``records_batch``'s); ``seqs`` numbers the recorded calls by row (default: the row).

        With ``statistics``, as eager capture takes them (``CaptureSession``): the callback's sums,
        finished; ``stage`` gets the kept tensors (``CaptureSession.stage_stats``, which fills them
        at once for CPU tensors, and for an accelerator's once ``deliver`` runs: ``CaptureSession.flush``,
        called only where one is still to come; those staged before, :meth:`stage_kept`, too); a
        tensor seen before at the same version, and the output of a view or copy with its input's
        elements (``OpCapture._alias_source``), has the statistics taken first. With
        ``fingerprints``, each slot's fingerprint (``checksum``) as eager capture takes it: the
        callback's, or the kept tensor's (``stage`` gets ``(tensor, statistics sink, fingerprint
        sink)``), shared where ``CaptureSession.share_alias`` shares it (a view reading its
        argument's memory in order, a copy). A slot whose memory holds no value of the run (an
        allocation's, an argument the op overwrites) is described, not read
        (``CaptureSession.add_call``'s ``unread``). With ``snapshots`` (``task="tensor"``, every
        tensor kept), each read slot's tensor is saved (those staged before were saved then), and
        ``deliver`` names their files; ``saving`` (by drained slot) gives the tensors saved in place of
        the kept ones (``task="overflow_check"``: the copies the observer kept of the calls it found).

        What the slots' order tells (value ids, which statistics a slot shares, memory not written
        yet) comes from the C++ walk (``native_values.py``); the columns are made from the drained
        arrays (``store/_slot_columns.py``)."""
        if recorded is None:
            recorded = (rows.phase >= 0).astype(np.int8)
        walk = self._walk(ops)
        walked = walk.walk(
            ops,
            recorded,
            inputs="input" in ios,
            outputs="output" in ios,
            statistics=statistics,
            fingerprints=fingerprints,
            unshards=self._unshard_rows(ops),
        )
        self.record_slots = walked.slots
        handed, was_staged = (ops.kept_slot >= 0) & (ops.kept_staged < 0), ops.kept_staged >= 0  # (no tuple an entry)
        kept = dict(zip(ops.kept_slot[handed].tolist(), ops.kept))
        landed = self._staged.landed
        next_key = self.observer.next_staged_id - self._staged.first  # (the keys after the staged ones': the drain's)
        drained_keys = []
        values = self._staged
        staged = _StagedBySlot(values, dict(zip(ops.kept_slot[was_staged].tolist(), ops.kept_staged[was_staged].tolist())))
        # (what is not asked for: of calls found hidden after they were staged)
        self._staged = _StagedValues(self.observer.next_staged_id)
        refs = walked.fingerprints
        hashed = set((-2 - refs[refs <= -2]).tolist())  # the entries whose fingerprint a slot takes (not the callback's)
        arriving: list[tuple[int, Landing, int]] = []  # the entries whose fingerprint a sink sets: where it lands
        early_keys = self._landed_early(ops, walked.taken, values) if snapshots is None else None
        landed_before: list[int] = [] if early_keys is None else early_keys.tolist()
        if early_keys is None:
            taken: list[dict | int] = []  # (an int: a key of ``landed``)
            unreduced, failed = [], []  # the entries of tensors whose dtype has no statistics, or whose staging failed
        else:  # (those whose sums landed before the drain, by array)
            taken = list(landed_before)
            unreduced, failed = self._early_entries(early_keys, values, hashed, arriving, statistics)
        taken_fingerprints: list[int | None] = [None] * len(walked.taken)
        due: list[tuple] = []
        for entry, slot in enumerate(walked.taken.tolist()):
            if landed_before and landed_before[entry] >= 0:
                continue
            stats = empty_stats() if slot < 0 else {}
            if slot < 0:
                taken_fingerprints[entry] = 0  # the fingerprint of no elements
            early = staged.get(slot) if early_keys is None else None
            if early is not None:  # staged before the drain (stage_kept)
                stats = early.stats
                if entry in hashed:
                    arriving.append((entry, early.fingerprint, early.at))
                if statistics and not early.reduced:
                    unreduced.append(-2 - entry)
                if early.failed:
                    failed.append(-2 - entry)
            elif slot >= 0:
                fingerprint_sink = None
                if entry in hashed:
                    fingerprint_sink = (taken_fingerprints, entry)
                    arriving.append((entry, taken_fingerprints, entry))
                reduced = statistics and has_statistics(kept[slot].dtype)
                if statistics and not reduced:
                    unreduced.append(-2 - entry)
                sink: StatsSink | None = None
                if snapshots is None:  # its sums land, as a staging's
                    stats, next_key = next_key, next_key + 1
                    drained_keys.append(stats)
                    sink = (landed, stats) if reduced else None
                else:
                    sink = stats if reduced else None
                    staged[slot] = saved = _Staged(stats, reduced, [None])
                    sink = self._save(snapshots, saved, kept[slot], sink)
                due.append((kept[slot], sink, fingerprint_sink))
            if early_keys is None:
                taken.append(stats)
            else:
                taken[entry] = stats
        described_at, self._described = self._described, {}
        self._at_address.clear()
        overrides = read_subclasses(
            walked,
            kept,
            ops.slot_value,
            described_at,
            ops.slot_version,
            taken,
            taken_fingerprints,
            due,
            staged.get,
            arriving,
            statistics=statistics,
            fingerprints=fingerprints,
        )
        tensors = (
            self._saved_refs(ops, walked, staged, kept if saving is None else saving, snapshots)
            if snapshots is not None
            else None
        )
        due = [item for item in due if item[1] is not None or item[2] is not None]
        landed.expect(drained_keys)
        if due and stage is not None:
            self._failed_to_stage(stage, due)  # (what failed is left empty: said below)
        _without_statistics(walked, failed, STATS_NOT_TAKEN_CODE)
        _without_statistics(walked, unreduced, NO_STATISTICS_CODE)
        refs = walked.stats
        read = distinct(-2 - refs[refs <= -2]) if statistics else np.zeros(0, np.int64)  # the entries slots take statistics from
        waiting = _not_arrived(read, taken, early_keys, landed.arrived) or any(into[at] is None for _, into, at in arriving)
        if (waiting or tensors is not None) and deliver is not None:
            deliver()  # an accelerator's tensors: their values arrive with one host read
        for entry, into, at in arriving:
            taken_fingerprints[entry] = into[at]
        missing = _not_arrived(read, taken, early_keys, landed.arrived)
        _without_statistics(walked, [-2 - entry for entry in missing], STATS_NOT_TAKEN_CODE)
        columns = SlotColumns(
            walked.slots,
            walked.args,
            self._args(walk),
            walked.value_ids,
            walked.view_of,
            walked.stats,
            taken,
            walked.fingerprints,
            taken_fingerprints,
            walked.errors,
            _error_texts(self.observer),
            walked.unread,
            self._texts([None if why is None else unread_text(why) for why in walk.whys], "whys"),
            overrides,
            tensors,
            landed,
        )
        return columns.batch(
            ops,
            rows.columns,
            np.arange(ops.first_row, ops.first_row + len(ops.op)) if seqs is None else seqs,
            step=self.step,
            rank=self.rank,
            dtype_names=self._dtype_names,
            device_name=self._device_name,
            flagged=PLAIN,
            valued=VALUE,
            laid_out=LAID_OUT,
            fixed=self._fixed,
        )

    def _landed_early(self, ops: ObservedOps, entries: np.ndarray, values: _StagedValues) -> np.ndarray:
        """By taken entry (its drained slot, -1: an empty tensor), the key its sums landed at in
        ``values.landed`` where a staging before the drain took it, else -1: of every entry at
        once, where the drain's loop asked each (``_StagedBySlot``: 1.5 µs an entry)."""
        ids = np.full(len(ops.slot_flag) + 1, -1, np.int64)  # (by slot; the last for -1)
        was_staged = ops.kept_staged >= 0
        ids[ops.kept_slot[was_staged]] = ops.kept_staged[was_staged]
        keys = ids[entries] - values.first
        expected = values.landed.expected
        inside = (keys >= 0) & (keys < len(expected))
        keys[~inside] = -1
        keys[inside] = np.where(expected[keys[inside]], keys[inside], -1)
        return keys

    def _early_entries(
        self, keys: np.ndarray, values: _StagedValues, hashed: set[int], arriving: list, statistics: bool
    ) -> tuple[list[int], list[int]]:
        """Of the entries whose sums landed before the drain (``keys``, :meth:`_landed_early`): those
        whose fingerprint a slot takes join ``arriving`` (where it lands); returns the codes
        (``-2 - entry``) of those whose dtype has no statistics and of those whose staging failed."""
        early = np.flatnonzero(keys >= 0)
        ids = keys[early] + values.first
        for entry in hashed:
            if keys[entry] >= 0:
                arriving.append((entry, values.landed, int(keys[entry])))
        codes = []
        for marked, asked in ((values.unreduced, statistics), (values.failed, True)):
            found = early[np.isin(ids, np.fromiter(marked, np.int64, len(marked)))] if marked and asked else early[:0]
            codes.append((-2 - found).tolist())
        return codes[0], codes[1]

    def _saved_refs(
        self,
        ops: ObservedOps,
        walked: WalkedSlots,
        staged: _StagedBySlot,
        kept: dict[int, torch.Tensor],
        snapshots: Snapshots,
    ) -> SavedTensors:
        """Each recorded slot's saved tensor (``task="tensor"``): its own kept tensor's, saved when it
        was staged or now (an empty one, which nothing keeps, made now); none for a slot not read
        (``unread``) or with no tensor kept."""
        refs: list[dict[str, Any] | None] = []
        sampled: list[int | None] = []
        ends: list[np.ndarray] = []  # where each slot's sizes end in ops.shape, once an empty one needs them
        for slot, unread in zip(walked.slots.tolist(), walked.unread.tolist()):
            own = staged.get(slot)
            if own is None and not unread:
                tensor = kept.get(slot)
                if tensor is None and ops.slot_flag[slot] == PLAIN:
                    tensor = self._if_empty(ops, slot, ends)
                if tensor is not None:
                    own = staged[slot] = _Staged({}, False, [None])
                    self._save(snapshots, own, tensor, None)
            refs.append(None if own is None or unread else own.tensor)
            sampled.append(None if own is None or unread else own.sampled)
        return SavedTensors(refs, sampled)

    def _if_empty(self, ops: ObservedOps, slot: int, ends: list[np.ndarray]) -> torch.Tensor | None:
        """An empty tensor of drained ``slot``'s dtype and shape, if it has no elements, else ``None``
        (``ends``: where each slot's sizes end in ``ops.shape``, made on first use)."""
        if not ends:
            ends.append(np.cumsum(ops.slot_ndim, dtype=np.int64))
        end = int(ends[0][slot])
        shape = ops.shape[end - int(ops.slot_ndim[slot]) : end].tolist()
        return torch.empty(shape, dtype=self.observer.dtypes[int(ops.slot_dtype[slot])]) if 0 in shape else None

    def _walk(self, ops: ObservedOps) -> SlotWalk:
        """The C++ walk of this capture (made at its first drain), told of the ops of ``ops``."""
        if self._slot_walk is None:
            library = load_slot_walk()
            if library is None:
                raise RuntimeError("native/slot_walk.cpp cannot be built here")
            self._slot_walk = SlotWalk(library)
        walk = self._slot_walk
        for op_id in walk.untold(np.frombuffer(ops.op, np.int32)):
            self._op_names += [""] * (op_id + 1 - len(self._op_names))
            if ops.names[op_id] == MODULE_ROW_OP:
                self._op_names[op_id] = MODULE_ROW_OP
                walk.add_module_op(op_id)
                continue
            facts = _OpFacts.of(ops.names[op_id])
            self._op_names[op_id] = facts.info.name
            inputs, list_result = facts.names.inputs, facts.names.list_result
            walk.add_op(op_id, facts.info, inputs, facts.results, list_result=list_result, one_tensor=facts.one_tensor)
        return walk

    def _args(self, walk: SlotWalk) -> pa.RecordBatch:
        """The args the walk named, by code: ``arg``, ``io`` and ``io_arg`` (made again when it named more)."""
        if self._arg_columns is None or self._arg_columns.num_rows != len(walk.args):
            io = [io_arg.partition(".")[0] for io_arg in walk.io_args]
            self._arg_columns = pa.RecordBatch.from_arrays(
                [arrow_strings(walk.args), arrow_strings(io), arrow_strings(walk.io_args)], schema=_ARG_SCHEMA
            )
        return self._arg_columns

    def _texts(self, texts: list[str | None], key: str) -> pa.Array:
        """``texts`` as a string column, made again only when they changed since the last call with ``key``."""
        cached = self._text_columns.get(key)
        if cached is None or cached[0] != texts:
            cached = self._text_columns[key] = (list(texts), arrow_strings(texts))
        return cached[1]

    def _device_name(self, device_type: int, device_index: int) -> str:
        device = (device_type, device_index)
        return self._devices.get(device) or self._devices.setdefault(device, self.observer.device_name(*device))


class RowNames(NamedTuple):
    """Each drained row's call: what every slot record of the row shares."""

    phase: np.ndarray
    """An index into ``PHASES`` (``native_values.py``); -1 for a row capture skips."""
    stack: np.ndarray
    """An index into :attr:`NativeStepCapture.stack_table`, -1 for none."""
    columns: dict[str, pa.Array]
    """By record field, a row each: ``call_name``, ``phase``, ``module``, ``op``, ``call``, ``fwd``,
    ``stack``, ``source`` (empty for a row without a call)."""


def _ends(ops: ObservedOps) -> np.ndarray:
    """The ``TensorImpl`` address of each row's first input and first output (a plain argument, not
    in a list), 0 for none: what ``recompute.py``'s ``RebuiltTensors`` knows a rebuilt tensor by."""
    ends = np.zeros((len(ops.op), 2), np.int64)
    rows = np.frombuffer(ops.slot_row, np.int64) - ops.first_row
    first = (np.frombuffer(ops.slot_arg, np.int16) == 0) & (np.frombuffer(ops.slot_element, np.int16) < 0)
    first &= np.frombuffer(ops.slot_flag, np.int8) != VALUE
    first &= (rows >= 0) & (rows < len(ops.op))
    io = np.frombuffer(ops.slot_io, np.int8)
    ends[rows[first], io[first]] = np.frombuffer(ops.slot_value, np.int64)[first]
    return ends


_ARG_SCHEMA = pa.schema([("arg", pa.string()), ("io", pa.string()), ("io_arg", pa.string())])


def call_text(calls: np.ndarray) -> pa.Array:
    """Call indices as text (``make_call_name``'s ``#1``)."""
    return pc.cast(arrow_array(calls), pa.string())


@dataclass(frozen=True, slots=True)
class _OpFacts:
    """What the conversion needs of an op overload: its slot names, and eager capture's facts of it."""

    names: OpSlotNames
    info: OpInfo
    one_tensor: bool
    """It returns one tensor (not a tuple or list): a dispatch mode sees ``out`` as a tensor."""
    results: int
    """The number of its results."""

    @classmethod
    def of(cls, op_name: str) -> _OpFacts:
        overload = op_overload(op_name)
        returns = op_schema(overload).returns
        one_tensor = len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)
        return cls(OpSlotNames.of(overload), op_info(overload), one_tensor, len(returns))
