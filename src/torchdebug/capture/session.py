"""Turning tensor slots into records and batches of records into files.

:class:`CaptureSession` is what eager op capture, module capture and (later) graph capture share:
``add_call`` makes one record per slot of a call, takes statistics now (a tensor may be changed
in place later), fingerprints (``task="checksum"`` or ``checksum=True``; in the statistics' pass,
see :class:`~torchdebug.stats_table.StatsStager`) and snapshots tensors for ``task="tensor"``;
``flush`` resolves the staged statistics and fingerprints, writes the tensor batch
and appends the records. A tensor seen again unchanged (an op's output fed to the next op) reuses
the statistics, fingerprint and saved tensor of its first slot. Every tensor slot carries the id of
the tensor it holds and its version (``value_ids.py``): a dump's data flow, exact.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch

from torchdebug._torch.autograd import tensor_version
from torchdebug._torch.subclasses import describe as describe_subclass
from torchdebug._torch.subclasses import is_subclass
from torchdebug.capture.filters import NameMatcher
from torchdebug.capture.unwritten import UnwrittenStorages, storage_id
from torchdebug.capture.value_ids import ValueIds
from torchdebug.checksum import hex_digits
from torchdebug.errors import DumpError
from torchdebug.records import STATS_NOT_TAKEN, UNINITIALISED, UNREAD, Record, layout_not_captured, make_name
from torchdebug.slots import DTYPE_NAMES, Slot, dtype_name, json_value
from torchdebug.stats import NO_STATISTICS, has_statistics, stats_from_sums
from torchdebug.stats_table import LandedSums, StatsStager
from torchdebug.store import RankWriter, TensorBatch, register_live, storable

logger = logging.getLogger("torchdebug.capture.session")

SAMPLE_EDGE = 256
"""Elements kept at each end of a sampled tensor (ptdbg's convention)."""

_FLUSH_RECORDS = 2048

PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
"""Classes that are never wrapper subclasses (most tensors: no subclass check, no collective to wait for)."""

_DEVICE_NAMES: dict[torch.device, str] = {}

_STRIDED = torch.strided
"""Layouts are singletons: compared by identity on the hot path."""


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


_T = TypeVar("_T")


class _Seen:
    """What was captured for a tensor object at one version (for reuse by later slots): its
    description, statistics dict, fingerprint and tensor reference, shared by every record of that
    tensor."""

    __slots__ = ("ref", "version", "stats", "tensor", "base", "desc", "checksum", "storage", "writes")

    def __init__(
        self,
        ref: weakref.ref,
        version: int | None,
        stats: dict | None,
        tensor: dict | None,
        base: tuple | None = None,
        storage: tuple[int | None, int] = (None, 0),
    ) -> None:
        self.ref, self.version, self.stats, self.tensor = ref, version, stats, tensor
        self.storage, self.writes = storage
        """The tensor's storage (``unwritten.storage_id``) and the writes into it counted then
        (``CaptureSession._storage_writes``)."""
        self.base = base
        """``(tensor ref, storage offset, numel)`` of a contiguous saved tensor whose memory this
        tensor's memory lies in (views of it are saved as strided views)."""
        self.desc: tuple[str, list[int], list[int], str] | None = None
        """``(dtype, shape, stride, device)`` as records hold them (the lists are shared, never
        changed)."""
        self.checksum: str | _PendingChecksum | None = None
        """The fingerprint, or the records waiting for it while it is staged on the device."""


class _PendingChecksum:
    """A fingerprint on its way from the device: the tensors it is for (an alias with the same bits
    in the same order shares it) and the records waiting for it."""

    __slots__ = ("seens", "records")

    def __init__(self, seen: _Seen) -> None:
        self.seens = [seen]
        self.records: list[Record] = []

    def deliver(self, value: int) -> None:
        text = hex_digits(value)
        for seen in self.seens:
            seen.checksum = text
        for record in self.records:
            record.checksum = text


def _same_memory_in_order(alias: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether a view reads its source's memory in the same order (a reshape, detach, unsqueeze, ...
    of a contiguous tensor; not a transpose), so that it has the source's fingerprint."""
    if alias.dtype != source.dtype or alias.numel() != source.numel():
        return False
    if not (alias.is_contiguous() and source.is_contiguous()):
        return False
    try:
        return alias.data_ptr() == source.data_ptr()
    except RuntimeError:  # a tensor subclass without storage of its own
        return False


class SessionConfig(Protocol):
    """What a session reads of its dump's options: ``DebuggerConfig`` (eager dumps) has them all,
    :class:`SessionOptions` holds them for dumps configured otherwise (graph dumps)."""

    @property
    def task(self) -> str: ...
    @property
    def checksum(self) -> bool: ...
    @property
    def overflow_nums(self) -> int: ...
    @property
    def tensor_list(self) -> Sequence[str]: ...
    @property
    def sample_stride(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """A session's options without a ``DebuggerConfig``: a ``task`` and the eager defaults
    (no checksums, no ``tensor_list`` filter, whole tensors)."""

    task: str
    checksum: bool = False
    overflow_nums: int = 1
    tensor_list: Sequence[str] = ()
    sample_stride: int = 0


class CaptureSession:
    """Builds records for one rank and writes them through a :class:`RankWriter` in batches."""

    def __init__(self, config: SessionConfig, writer: RankWriter, rank: int) -> None:
        self.writer = writer
        self.rank = rank
        self.step = 0
        self.seq = 0
        self.want_stats = config.task in ("statistics", "tensor")
        self.want_tensors = config.task == "tensor"
        self.want_checksum = config.task == "checksum" or config.checksum
        self.reuses_captures = self.want_stats or self.want_tensors or self.want_checksum
        """Whether what is captured for a tensor (statistics, fingerprint, saved tensor) is kept for the
        later slots of that tensor and of its aliases (:meth:`share_alias`); a structure dump keeps none."""
        self.overflow_nums = config.overflow_nums if config.task == "overflow_check" else None
        """``task="overflow_check"``: op capture records only overflowing calls (``overflow_check.py``)."""
        self.tensor_matcher = NameMatcher(config.tensor_list)
        self.sample_stride = config.sample_stride if config.sample_stride >= 2 else 0
        self._records: list[Record] = []
        self._columns: list[tuple[int, Callable[[], pa.RecordBatch]]] = []
        """Records queued as columns (:meth:`add_columns`): each builder with how many of ``_records``
        were queued before it."""
        self._batch: TensorBatch | None = None
        self._tensor_refs: list[dict[str, str]] = []
        self._stager = StatsStager()
        self._stats_due: list[tuple[torch.Tensor, Callable[[dict], None] | None, Callable[[int], None] | None]] = []
        """Tensors of the slots being recorded whose statistics and/or fingerprints are still to be
        taken (one pass for both): an op's inputs (or outputs) go to the device table together,
        several per kernel launch."""
        self._stats_due_seen: list[_Seen] = []
        """What each entry of ``_stats_due`` fills."""
        self._waiting: list[list[Record]] = []
        """Records handed over by mid-step flushes whose statistics are still on their way to the host."""
        self._seen: dict[int, _Seen] = {}
        self._storage_writes: dict[int | None, int] = {}
        """In-place writes into each storage this step: what was taken of a tensor on a storage written
        since is taken again, though its own version did not move (``p.data.mul_()`` writes through an
        alias with a version counter of its own)."""
        self._sizes: dict[tuple[int, ...], list[int]] = {}
        """One list per distinct shape or stride this step, shared by the records that have it (as
        records read from a dump share them, never changed in place): a step makes a few hundred
        lists, not two per tensor slot. Each is a container the garbage collector walks and, kept until
        the flush, promotes; promoted objects bring on the process's full collections (about a fifth
        of a structure dump's host time on the tiny GPT of ``bench/host_per_op.py`` before this)."""
        self.unwritten = UnwrittenStorages()
        """Storages of this step that hold no value of the run yet (allocations, FSDP2's all-gather
        buffers): a slot on one is described, not read (``unwritten.py``)."""
        self.values = ValueIds()
        """The id of each tensor recorded, for every tensor slot (``value_ids.py``)."""
        self._warned: set[str] = set()
        self.in_compiled_code = False
        """Whether the op being captured runs as compiled code (``_torch.frames.in_compiled_code``):
        inductor's kernels write buffers there with no aten op and no version moved (a matmul's output
        in place with its bias and activation, a donated saved activation), so its tensors are read
        anew, neither taking what an earlier read took nor leaving theirs for a later one."""
        self.busy = False
        """Whether the session is running torch ops of its own (statistics, snapshots, copies): a
        module or gradient hook calls :meth:`add_call` while the op capture's dispatch mode is active,
        and that capture must let those ops through unrecorded (``OpCapture.on_op``)."""
        register_live(writer.rank_dir, self.flush_for_readers)

    # -- building records -------------------------------------------------------------------
    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def wants_tensor(self, call_name: str) -> bool:
        """Whether a call's tensors are saved: ``task="tensor"``, ``tensor_list``, and a writer that
        still takes tensors (none after a failed write)."""
        return self.want_tensors and self.writer.takes_tensors and (not self.tensor_matcher or self.tensor_matcher(call_name))

    def add_call(
        self,
        slots: Iterator[Slot],
        *,
        phase: str,
        module: str,
        op: str,
        call: int,
        seq: int,
        io: str,
        save_tensors: bool,
        mutated: bool = False,
        stack: str | None = None,
        source: str | None = None,
        fwd: str | None = None,
        unread: Mapping[str, str] | None = None,
        bumps: bool | None = None,
        identities: Mapping[int, tuple[int, int | None, int | None]] | None = None,
    ) -> None:
        """One record per slot of one side (inputs or outputs) of a call.

        ``mutated``: the call wrote into its arguments, so output tensors may be the input objects
        with new values. ``bumps`` (default: ``mutated``): torch moves the version counter of the
        arguments it wrote as the op returns, after these records (a mutable schema; not a c10d
        collective, recorded once complete, whose schema declares no write). ``unread``: the
        top-level argument keys (``"*"``: every slot) whose tensors are described, not read, and why
        (:data:`~torchdebug.records.UNREAD`): they hold no value of the run. ``identities``: by ``id()``
        of a slot's tensor that stands for another (a copy taken before the call), the ``value_id``,
        ``version`` and ``view_of`` its records take (:meth:`ValueIds.identity` of the original).
        """
        if not self.writer.takes_records:
            return  # a write of records failed: capture stopped (the writer said so once)
        save_tensors = save_tensors and self.writer.takes_tensors
        bumps = mutated if bumps is None else bumps
        busy, self.busy = self.busy, True  # the ops below are the session's own (see ``busy``)
        try:
            step, rank, mark = self.step, self.rank, self.values.mark
            made = []  # this call's records
            for arg, value in slots:
                record = Record(make_name(phase, module, op, call, io, arg), step, rank, phase, module, op, call, seq, io, arg)
                record.stack, record.source, record.fwd = stack, source, fwd
                if isinstance(value, torch.Tensor):
                    try:
                        if identities and (identity := identities.get(id(value))) is not None:
                            record.value_id, record.version, record.view_of = identity
                        else:
                            mark(record, value, bumps)
                        why = unread.get(arg.partition(".")[0], unread.get("*")) if unread else None
                        if why is None and self.unwritten:
                            if mutated:  # an in-place op's written argument holds values from now on
                                self.unwritten.written(value)
                            else:
                                why = self.unwritten.why(value)
                        if why and value.numel():
                            self._fill_description(record, value)  # values the op neither made nor read
                            record.extra = {UNREAD: why}
                            if why == UNINITIALISED and io == "output":  # the allocation (its views find it there)
                                self.unwritten.add((value,))
                            elif why != UNINITIALISED:  # the op writes it, maybe unannounced
                                self.unwritten.written(value)
                        elif value.__class__ not in PLAIN_TENSORS and is_subclass(value):
                            self._describe_subclass(record, value, save_tensors, mutated)
                        elif not (self.reuses_captures or save_tensors):  # the description is all there is
                            self._fill_description(record, value)
                        else:
                            self._describe_tensor(record, value, save_tensors, mutated)
                    except Exception as error:  # never crash the user's run for one slot
                        record.capture_error = f"{type(error).__name__}: {error}"
                        if op not in self._warned:
                            self._warned.add(op)
                            logger.warning("could not capture a tensor of %s (%s); recorded the error", op, record.capture_error)
                else:
                    record.kind = "value"
                    record.value = json_value(value)
                self._records.append(record)  # not a local: a tensor snapshot may flush and start a new list
                made.append(record)
            if self._stats_due:
                self._take_due_stats(made, op)
            if len(self._records) >= _FLUSH_RECORDS:
                self._flush_records()
        finally:
            self.busy = busy

    def _describe_subclass(self, record: Record, tensor: torch.Tensor, save: bool, mutated: bool) -> None:
        """A wrapper subclass (DTensor, FSDP2 parameters, float8 weights): described as itself (dtype,
        global shape), captured through the plain tensor that holds its elements (a DTensor's local
        shard), its facts in ``extra``; one without such a tensor gets a ``capture_error``. That tensor
        is read at each op, never taken from an earlier read: the subclass's handlers write it below
        autograd, where its version may not move (a DTensor's foreach ops)."""
        view = describe_subclass(tensor)
        record.extra = view.info
        if view.local is None:
            self._fill_description(record, tensor)
            record.capture_error = view.why_unread()
            return
        self._describe_tensor(record, view.local, save, mutated, reuse=False)
        record.shape, record.stride = list(tensor.shape), list(tensor.stride())

    def _describe_tensor(self, record: Record, tensor: torch.Tensor, save: bool, mutated: bool, reuse: bool = True) -> None:
        want_stats = self.want_stats or save
        if want_stats and not has_statistics(tensor.dtype):  # bits: a fingerprint, no statistics
            record.capture_error = NO_STATISTICS
            want_stats = False
        if not (want_stats or self.want_checksum or save):
            self._fill_description(record, tensor)
            return
        # After an in-place op returns, autograd bumps the version once more.
        version = tensor_version(tensor)
        version = None if version is None else version + (1 if mutated else 0)
        compiled = self.in_compiled_code
        seen = None if mutated or not reuse or compiled or version is None else self._seen.get(id(tensor))
        if seen is None or seen.ref() is not tensor or seen.version != version or self._written_since(seen):
            seen = _Seen(weakref.ref(tensor), version, None, None, storage=self._storage_of(tensor))
            if version is not None and not compiled:  # an inference tensor is read at each op: its writes leave no trace
                self._seen[id(tensor)] = seen
        elif (
            seen.desc is not None
            and (seen.stats is not None or not want_stats)
            and (seen.checksum is not None or not self.want_checksum)
            and not (save and seen.tensor is None)
        ):
            # seen unchanged before: an earlier op's output fed to this op (the common case)
            record.dtype, record.shape, record.stride, record.device = seen.desc
            self._attach(record, tensor, seen, save, want_stats)
            return
        if not self._fill_description(record, tensor):
            return
        seen.desc = (record.dtype, record.shape, record.stride, record.device)
        if save and seen.tensor is None:
            try:
                seen.tensor, stats, sampled = self.snapshot(record.name, tensor, with_stats=want_stats and seen.stats is None)
            except DumpError:  # a write failed since the call began: its statistics alone, as the calls after it
                save = False
            else:
                if stats is not None:  # taken during the copy
                    seen.stats = stats
                if tensor.is_contiguous() and not sampled and not tensor.is_complex():  # (complex: saved as real pairs)
                    seen.base = (seen.tensor, tensor.storage_offset(), tensor.numel())
        stats_sink = checksum_sink = None
        if want_stats and seen.stats is None:
            seen.stats = {}
            stats_sink = seen.stats.update
        if self.want_checksum and seen.checksum is None and not tensor.is_meta:
            seen.checksum = _PendingChecksum(seen)
            checksum_sink = seen.checksum.deliver
        if stats_sink is not None or checksum_sink is not None:
            self._stats_due.append((tensor, stats_sink, checksum_sink))
            self._stats_due_seen.append(seen)
        self._attach(record, tensor, seen, save, want_stats)

    def _attach(self, record: Record, tensor: torch.Tensor, seen: _Seen, save: bool, want_stats: bool) -> None:
        """Point the record at what was captured for its tensor."""
        if want_stats:
            record.stats = seen.stats
        if isinstance(seen.checksum, str):
            record.checksum = seen.checksum
        elif seen.checksum is not None:
            seen.checksum.records.append(record)  # filled in when the flush reads the fingerprint
        if save:
            record.tensor = seen.tensor
            record.sampled = self._sampling_for(tensor)

    def _take_due_stats(self, records: Sequence[Record] = (), op: str = "") -> None:
        """Take the statistics and fingerprints the slots described since the last call wait for
        (``records``: those slots', of ``op``). A failure (device memory, a kernel that does not
        build here) is a fault of ours: the records it leaves without statistics say so, and the
        step goes on."""
        if self._stats_due:
            due, self._stats_due = self._stats_due, []
            seens, self._stats_due_seen = self._stats_due_seen, []
            try:
                self._stager.add_all(due)
            except Exception as error:  # never the user's step: each again, alone, and those that fail say so
                text = f"{type(error).__name__}: {error}"
                failed = set()  # the statistics dicts of the tensors that fail alone (the others may wait for the flush)
                for item, seen in zip(due, seens):
                    try:
                        self._stager.add_all([item])
                    except Exception:
                        if seen.stats is not None:
                            failed.add(id(seen.stats))
                            seen.stats = None  # taken again at the next read
                for record in records:
                    if record.stats is not None and id(record.stats) in failed:
                        record.stats = None
                        record.capture_error = record.capture_error or STATS_NOT_TAKEN
                if op not in self._warned:
                    self._warned.add(op)
                    logger.warning("torchdebug: could not take the statistics of %s (%s); recorded it", op or "a call", text)

    def memory_info(self) -> dict[str, int]:
        """What the capture holds besides the writer's buffers, for the run's completion marker:
        ``statistics_table_bytes``, the device statistics tables (on devices and pinned on the host)."""
        return {"statistics_table_bytes": self._stager.memory_bytes()}

    def tensor_stats(self, tensor: torch.Tensor) -> dict:
        """The statistics of ``tensor`` as taken now: a dict filled at once on the CPU, by the next
        :meth:`flush` on an accelerator (the device table, no host synchronisation)."""
        stats: dict = {}
        self._stager.add(tensor, stats.update)
        return stats

    def stage(self, result: torch.Tensor, sink: Callable[[list], None]) -> None:
        """Deliver ``result`` (a small tensor, e.g. a graph's statistics table) to ``sink`` as a list
        of Python numbers by the next :meth:`flush`: at once on the CPU, without a host
        synchronisation on an accelerator (read with everything else staged, once per flush)."""
        self._stager.stage(result, sink)

    def stage_stats(self, items: list[tuple]) -> None:
        """Hand each ``(tensor, sink)``'s statistics as taken now to its sink (or ``(tensor, sink,
        checksum_sink)``: ``StatsStager.add_all``'s items): at once on the CPU, by the next
        :meth:`flush` on an accelerator (pass one side of an op's tensors together: they share
        kernel launches)."""
        self._stager.add_all(items)

    def stage_landed(
        self, tensors: list[torch.Tensor], landed: LandedSums, keys: np.ndarray, memory: np.ndarray, hashed: bool
    ) -> None:
        """:meth:`stage_stats` of tensors whose sums (and with ``hashed``, fingerprints) land in
        ``landed`` at ``keys``, ``memory`` saying where each one's elements are
        (``StatsStager.add_landed``: no Python a tensor the kernel reads)."""
        self._stager.add_landed(tensors, landed, keys, memory, hashed)

    def _fill_description(self, record: Record, tensor: torch.Tensor) -> bool:
        """Set dtype, shape, device and stride; ``False`` (with the reason in ``record.capture_error``) for
        layouts that are not captured."""
        dtype, device, sizes = tensor.dtype, tensor.device, self._sizes
        record.dtype = DTYPE_NAMES.get(dtype) or dtype_name(dtype)  # the lookup inlined: once per slot
        shape = tensor.shape
        record.shape = sizes.get(shape) or sizes.setdefault(shape, list(shape))
        record.device = _DEVICE_NAMES.get(device) or _device_name(device)
        if tensor.layout is not _STRIDED:
            record.capture_error = layout_not_captured(tensor.layout)
            return False
        stride = tensor.stride()
        record.stride = sizes.get(stride) or sizes.setdefault(stride, list(stride))
        return True

    def wrote(self, tensors: list[torch.Tensor], versions: list[int | None], unmoved: bool) -> None:
        """A call wrote ``tensors`` in place, whose versions were ``versions`` before it. Torch moves
        a written tensor's version once the call returns to autograd, or never (``unmoved``,
        ``OpInfo.unmoved``: BatchNorm's running statistics, a fused optimizer's writes, and under a
        dispatch mode a ``_foreach_*_`` op's, whose versions move without one). What was taken of each
        before is forgotten, so a read at the same version takes its new values; with ``unmoved``,
        its value id's version counts the write, as the native path's does (``observer.cpp``)."""
        for tensor, version in zip(tensors, versions):
            key = storage_id(tensor) if tensor.__class__ in PLAIN_TENSORS else None
            if key is not None:
                self._storage_writes[key] = self._storage_writes.get(key, 0) + 1
            if version is not None and tensor_version(tensor) == version:
                self._seen.pop(id(tensor), None)
                if unmoved:
                    self.values.wrote(tensor)

    def share_alias(self, alias: torch.Tensor, source: torch.Tensor, same_elements: bool, shares_memory: bool) -> None:
        """Let ``alias`` (an op output sharing ``source``'s memory) reuse what was captured for it.

        ``same_elements`` (a reshape, transpose, detach or clone): the statistics are equal.
        ``shares_memory`` (a view): when the memory was saved from a contiguous tensor, the alias
        is saved as a strided view of it
        (``{"view": {"shape", "stride", "offset"}}`` in its tensor reference) instead of a copy.
        """
        seen = self._seen.get(id(source))
        if seen is None or seen.ref() is not source or seen.version != tensor_version(source) or self._written_since(seen):
            return
        view_ref = None
        if shares_memory and seen.base is not None and alias.dtype == source.dtype and not alias.is_neg():  # (elements as saved)
            base_ref, base_offset, base_numel = seen.base
            offset = alias.storage_offset() - base_offset
            last = offset + sum((size - 1) * stride for size, stride in zip(alias.shape, alias.stride()) if size)
            if alias.numel() and offset >= 0 and last < base_numel:
                view_ref = self.view_ref(base_ref, list(alias.shape), list(alias.stride()), offset)
        stats = seen.stats if same_elements else None
        base = seen.base if view_ref is not None else None
        alias_seen = self._seen[id(alias)] = _Seen(
            weakref.ref(alias), tensor_version(alias), stats, view_ref, base, storage=self._storage_of(alias)
        )
        same_order = same_elements and not shares_memory  # a copy
        if not same_order and shares_memory:
            same_order = _same_memory_in_order(alias, source)
        if same_order and seen.checksum is not None:  # the same bits in the same logical order
            alias_seen.checksum = seen.checksum
            if isinstance(seen.checksum, _PendingChecksum):
                seen.checksum.seens.append(alias_seen)

    def _storage_of(self, tensor: torch.Tensor) -> tuple[int | None, int]:
        """``tensor``'s storage and the writes into it so far (``_Seen.storage``, ``_Seen.writes``)."""
        key = storage_id(tensor) if tensor.__class__ in PLAIN_TENSORS else None
        return key, self._storage_writes.get(key, 0)

    def _written_since(self, seen: _Seen) -> bool:
        """Whether an op wrote ``seen``'s storage since it was taken."""
        return bool(self._storage_writes) and self._storage_writes.get(seen.storage, 0) != seen.writes

    def _sampling_for(self, tensor: torch.Tensor) -> int | None:
        if self.sample_stride and tensor.numel() > 2 * SAMPLE_EDGE:
            return self.sample_stride
        return None

    def snapshot(
        self, key: str, tensor: torch.Tensor, with_stats: bool = False
    ) -> tuple[dict[str, str], dict | None, int | None]:
        """Save ``tensor`` as it is now under ``key`` (:meth:`_snapshot`): its tensor reference, its
        statistics where the copy took them (``with_stats``; else ``None``), and its sampling stride
        (``None``: saved whole). Raises :class:`DumpError` once a write of the dump failed."""
        ref, sums = self._snapshot(key, tensor, with_stats)
        stats = None if sums is None else stats_from_sums(sums, tensor.numel(), integral=not tensor.is_floating_point())
        return ref, stats, self._sampling_for(tensor)

    def view_ref(self, base: dict, shape: list[int], stride: list[int], offset: int) -> dict:
        """The tensor reference of a view of the saved tensor ``base`` refers to (``as_strided`` of it
        flattened, from element ``offset``), saved as no copy of its own."""
        ref = {"key": base["key"], "view": {"shape": shape, "stride": stride, "offset": offset}}
        if "file" in base:
            ref["file"] = base["file"]
        else:  # the base is in the pending batch: the file name is set when it is submitted
            self._tensor_refs.append(ref)
        return ref

    def _snapshot(self, key: str, tensor: torch.Tensor, with_stats: bool = False) -> tuple[dict[str, str], list[float] | None]:
        """Copy the tensor now into the current tensor batch (it may change later). Returns its
        tensor reference and, when ``with_stats`` and the copy could take them, the native sums of
        the whole tensor (never of a sample)."""
        data = storable(tensor.detach())
        sampled = self._sampling_for(tensor)
        if sampled:
            flat = data.reshape(-1)
            middle = flat[SAMPLE_EDGE : flat.shape[0] - SAMPLE_EDGE : self.sample_stride]
            data = torch.cat([flat[:SAMPLE_EDGE], middle, flat[flat.shape[0] - SAMPLE_EDGE :]])
        nbytes = data.numel() * data.element_size()
        if self._batch is not None and not self._batch.fits(nbytes):
            self.flush()
        if self._batch is None:
            self._batch = self.writer.tensor_batch(nbytes + 64)
        whole = with_stats and not sampled and not tensor.is_complex()
        sums = self._batch.add(key, data, with_stats=whole)
        ref = {"key": key}
        self._tensor_refs.append(ref)
        return ref, sums

    def add_records(self, records: list[Record]) -> None:
        """Queue finished records (graph capture computes their statistics in the graph)."""
        if self.writer.takes_records:
            self._records.extend(records)

    def add_columns(self, build: Callable[[], pa.RecordBatch]) -> None:
        """Queue records that ``build`` makes as columns (``records_batch``'s schema) at the flush,
        once the statistics staged before have arrived: a graph run's records, whose fields but
        statistics and value ids repeat from step to step (``store/_template_columns.py``). They keep
        their place among the queued records."""
        if self.writer.takes_records:
            self._columns.append((len(self._records), build))

    def save(self, key: str, tensor: torch.Tensor) -> dict[str, str] | None:
        """Copy ``tensor`` into the current tensor batch now; returns its tensor reference, or
        ``None`` once tensors are no longer saved (a failed write of the dump)."""
        if not self.writer.takes_tensors:
            return None
        try:
            return self._snapshot(key, tensor)[0]
        except DumpError:  # the write failed while this batch was being filled
            return None

    # -- writing -----------------------------------------------------------------------------
    def add_stack(self, stack_id: str, frames: list[str]) -> None:
        if not self.writer.has_stack(stack_id):
            self.writer.add_stack(stack_id, frames)

    def flush(self, wait: bool = False, tensors: bool = False, until: int | None = None) -> None:
        """Resolve staged statistics (one host read) and hand pending records and tensors to the writer.

        ``wait``: return only once the records are on disk (those submitted before ``until``, a
        writer's ``mark()``: the debugger's ``stop`` waits for the stop before's); ``tensors``: once
        the tensor files are too.
        """
        self._take_due_stats()
        self._safely(self._stager.flush, None)
        self._submit_waiting()
        if self._records or self._columns or self._batch is not None:
            self._submit_queued()
        if wait or tensors:
            self.writer.drain(tensors=tensors, until=until)

    def flush_for_readers(self) -> bool:
        """Write everything captured so far, tensor files included, for a reader in this process
        (``torchdebug.store._live``); ``False`` once the dump is closed."""
        if self.writer.closed:
            return False
        self.flush(wait=True, tensors=True)
        return True

    def _submit_queued(self) -> None:
        """Hand the queued records, those queued as columns built now, in their order, and the tensor
        batch (with the first of them) to the writer."""
        records, self._records = self._records, []
        columns, self._columns = self._columns, []
        batch, refs = self._batch, self._tensor_refs
        self._batch, self._tensor_refs = None, []
        start = 0
        for before, build in columns:
            if before > start or batch is not None:
                self.writer.submit(self.step, records[start:before], batch, refs)
                start, batch, refs = before, None, []
            self.writer.submit_columns(self.step, build())
        if start < len(records) or batch is not None:
            self.writer.submit(self.step, records[start:], batch, refs)

    def _flush_records(self) -> None:
        """The flush of a full list of records in mid-step: start the transfer of their statistics and
        keep the records until it lands, without waiting for the device (a pending tensor batch, or
        records queued as columns, are flushed in full: the batch's buffer is one of the writer's two)."""
        if self._batch is not None or self._columns:
            self.flush()
            return
        self._safely(self._stager.send, None)
        self._waiting.append(self._records)
        self._records = []
        if self._safely(lambda: self._stager.deliver(block=False), True):
            self._submit_waiting()

    def _safely(self, action: Callable[[], _T], failed: _T) -> _T:
        """Run a stager's ``action`` (send, deliver, flush) and return its result, or ``failed`` when it
        raised: a fault of ours (a device lost, memory), never the user's step. The results not
        delivered are dropped, the records waiting for them say so (``STATS_NOT_TAKEN``), and one
        warning tells it."""
        try:
            return action()
        except Exception as error:
            dropped = self._stager.abandon()
            for record in (record for records in (self._records, *self._waiting) for record in records):
                if record.stats is not None and not record.stats:  # a sink never called: still empty
                    record.stats = None
                    record.capture_error = record.capture_error or STATS_NOT_TAKEN
            if dropped and "delivery" not in self._warned:
                self._warned.add("delivery")
                text = f"{type(error).__name__}: {error}"
                logger.warning("torchdebug: the statistics of %d tensors were lost (%s); their records say so", dropped, text)
            return failed

    def _submit_waiting(self) -> None:
        for records in self._waiting:
            self.writer.submit(self.step, records, None, [])
        self._waiting = []

    def next_step(self) -> None:
        """Flush (the caller waits for the writer as it needs) and start the next step (call
        indices and reuse caches start over)."""
        self.flush()
        self.step += 1
        self.writer.begin_step(self.step)
        self.seq = 0
        self._seen.clear()
        self._storage_writes.clear()
        self._sizes.clear()
        self.unwritten.clear()
        self.values.prune()
