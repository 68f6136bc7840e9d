"""The device-side table: statistics and other small results of a step, read by the host in one copy.

Reading a value computed on an accelerator (``.item()``, ``.tolist()``, ``.cpu()``) waits for the device
to finish everything queued before it; doing that per captured tensor serialises the host with the device
at every op. :class:`StatsStager` reduces each tensor at once into a row of a per-device table and copies
the table to the host once per flush. Why and how (the Triton kernel, scratch rows, the directory):
docs/architecture.md, "Decisions and their reasons" ("A Triton kernel for CUDA statistics, a table
for the host").
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from torchdebug.checksum import cpu_fingerprint, fingerprint
from torchdebug.native.build import DISABLE_ENV
from torchdebug.native.fused_stats import stats_and_fingerprint
from torchdebug.stats import (
    IDENTITY,
    WIDTH,
    as_real,
    cpu_stats,
    cpu_stats_and_fingerprint,
    cpu_sums,
    cpu_sums_many_into,
    device_sums,
    empty_stats,
    stats_from_sums,
)

logger = logging.getLogger("torchdebug.stats_table")

TABLE_ROWS = 1 << 16
"""Rows of one table (one per captured tensor)."""

SCRATCH_ROWS = 1 << 16
"""Partial rows of one table, for tensors that several kernel programs reduce together: a row per
program of a launch. A launch on the stream of every launch before it reuses them from the start
(those launches have finished when it starts), so this bounds one launch's programs, not a step's."""

DIRECTORY_ENTRIES = 1 << 16
"""Int64 entries of one table's directory: three per tensor of a launch of more than the kernel's
``SLOTS`` (about 21,000 such tensors a table)."""

_Sink = Callable[[Any], None]

DENSE, CONTIGUOUS = 1, 2
"""How a tensor's elements fill its memory (:meth:`StatsStager.add_landed`): its elements fill one span of
memory with none twice (contiguous or permuted: its statistics read it in memory order), and in
its own order (its fingerprint reads it so)."""


class LandedSums:
    """Sums vectors (``schema.COLUMNS``, as the kernels give them, not finished) landed by key 0, 1,
    2, ...: a staging's statistics held in one table until the drain finishes them all at once
    (``fused_stats.finish_sums``), with no dict a tensor and no statistics made one by one; the
    CPU's of one :meth:`StatsStager.add_all` are taken by one native call. Fingerprints land by key
    beside them: it is a :data:`Landing` (``landed[key]``: ``None`` until one arrives)."""

    def __init__(self) -> None:
        self.sums = np.zeros((0, WIDTH))
        self.numels = np.zeros(0, np.int64)
        self.expected = np.zeros(0, bool)
        """Keys whose sums are to land (given to a stager)."""
        self.arrived = np.zeros(0, bool)
        self.fingerprints: dict[int, int] = {}
        """By key, those arrived (a dict: one set at a time costs a third of a numpy array's)."""
        self._address = 0
        """Where :attr:`sums` starts."""

    def expect(self, keys: list[int] | range | np.ndarray) -> None:
        """Note that the sums of ``keys`` are to land (the table grows to hold them)."""
        if not len(keys):
            return
        end = (int(keys.max()) if isinstance(keys, np.ndarray) else max(keys)) + 1  # (numpy's max of a list: 4 µs)
        if end > len(self.expected):
            size = max(end, 2 * len(self.expected), 256)
            self.sums = _grown(self.sums, size)
            self.numels, self.expected, self.arrived = (_grown(a, size) for a in (self.numels, self.expected, self.arrived))
            self._address = self.sums.ctypes.data
        if type(keys) is range:  # (a staging's keys follow each other: a slice, where a list's indexing takes 2 µs)
            self.expected[keys.start : keys.stop] = True
        else:
            self.expected[keys] = True

    def holds(self, key: int) -> bool:
        """Whether ``key``'s sums were expected (see :meth:`expect`)."""
        return 0 <= key < len(self.expected) and bool(self.expected[key])

    def land(self, key: int, sums: Any, numel: int) -> None:
        """``key``'s sums, of a tensor of ``numel`` elements, have arrived."""
        self.sums[key] = sums
        self.numels[key] = numel
        self.arrived[key] = True

    def land_many(self, keys: list[int] | np.ndarray, sums: np.ndarray, numels: np.ndarray) -> None:
        """:meth:`land` of each of ``keys``, their sums the rows of ``sums``."""
        self.sums[keys] = sums
        self.numels[keys] = numels
        self.arrived[keys] = True

    def __setitem__(self, key: int, fingerprint: int) -> None:
        """``key``'s fingerprint (unsigned 64-bit) has arrived."""
        self.fingerprints[key] = fingerprint

    def __getitem__(self, key: int) -> int | None:
        """``key``'s fingerprint, ``None`` until it arrives."""
        return self.fingerprints.get(key)

    def land_fingerprints(self, keys: np.ndarray, fingerprints: np.ndarray) -> None:
        """:meth:`__setitem__` of each of ``keys``, their fingerprints ``fingerprints`` (``uint64``)."""
        self.fingerprints.update(zip(keys.tolist(), fingerprints.tolist()))

    def land_in_place(self, keys: list[int], tensors: list[torch.Tensor], numels: np.ndarray | None = None) -> None:
        """The CPU sums of ``tensors``, each written where its key's land (``cpu_sums_many_into``:
        the kernel's dtypes in one native call); ``numels``: their element counts, where known."""
        start, row = self._address, WIDTH * self.sums.itemsize
        cpu_sums_many_into(tensors, [start + key * row for key in keys])
        if numels is not None:
            self.numels[keys] = numels
            self.arrived[keys] = True
            return
        counts, arrived = self.numels, self.arrived
        for key, tensor in zip(keys, tensors):  # (a staging's few: numpy's indexing by a list costs more)
            counts[key] = tensor.numel()
            arrived[key] = True


def _grown(values: np.ndarray, size: int) -> np.ndarray:
    """``values`` with zeros after it up to ``size`` rows."""
    out = np.zeros((size, *values.shape[1:]), values.dtype)
    out[: len(values)] = values
    return out


StatsSink = Callable[[Any], None] | dict[str, Any] | tuple[LandedSums, int]
"""Where a tensor's statistics go: a callable that gets them, a dict a record's statistics update
(a stager that finishes them), or ``(landed, key)``: its sums land unfinished (:class:`LandedSums`).
The last two make no object a tensor, where ``NativeStepCapture``'s stagings hold thousands a step."""
Landing = dict[int, int | None] | list[int | None] | LandedSums
"""Where fingerprints land as they arrive, by id, by index or by key (``None`` until then)."""
FingerprintSink = Callable[[int], None] | tuple[Landing, int]
"""Where a tensor's fingerprint goes: a callable that gets it, or ``(container, key)``: it lands at
``container[key]``."""


def _give_stats(sink: StatsSink, stats: Any) -> None:
    """Hand ``stats`` to ``sink`` (:data:`StatsSink`)."""
    if type(sink) is dict:
        sink.update(stats)
    else:
        sink(stats)  # type: ignore[operator]


def _give_fingerprint(sink: FingerprintSink, value: int) -> None:
    """Hand ``value`` to ``sink`` (:data:`FingerprintSink`)."""
    if type(sink) is tuple:
        _give_fingerprint_at(sink[0], sink[1], value)
    else:
        sink(value)  # type: ignore[operator]


def _give_fingerprint_at(sink: Callable[[int], None] | Landing, key: int | None, value: int) -> None:
    """Hand ``value`` to a fingerprint sink as a table holds it: a callable (``key`` ``None``) or a
    container and its key."""
    if key is None:
        sink(value)  # type: ignore[operator]
    else:
        sink[key] = value  # type: ignore[index]


def _held(sink: Any) -> tuple[Any, int | None]:
    """How a table row holds a sink: ``(container, key)`` as it is, another (``None`` too) with key ``None``."""
    return sink if type(sink) is tuple else (sink, None)


def _resolves_now(tensor: torch.Tensor) -> bool:
    """CPU tensors need no table: the host can read them at no cost (tests patch this to exercise
    the device path on the CPU)."""
    return tensor.is_cpu


@functools.cache
def _triton() -> Any:
    """:mod:`torchdebug.native.triton_stats`, or ``None`` (no Triton, or ``TORCHDEBUG_NATIVE=0``)."""
    if os.environ.get(DISABLE_ENV) == "0" or importlib.util.find_spec("triton") is None:
        return None
    try:
        from torchdebug.native import triton_stats  # imports Triton: only once a device tensor arrives
    except Exception as error:  # an incompatible Triton must cost speed, not the run
        logger.warning("Triton statistics kernel unavailable (%s: %s); using torch ops", type(error).__name__, error)
        return None
    return triton_stats


def _kernel_for(tensor: torch.Tensor) -> Any:
    """The Triton kernel's module when it takes the statistics of ``tensor`` (dtype and device)."""
    triton_stats = _kernel_on(tensor)
    if triton_stats is None or tensor.dtype not in triton_stats.DTYPES:
        return None
    return triton_stats


def _kernel_on(tensor: torch.Tensor) -> Any:
    """The Triton kernel's module when it runs on ``tensor``'s device (it takes the fingerprint of
    any dtype there)."""
    triton_stats = _triton()
    if triton_stats is None:
        return None
    if tensor.device.type != "cuda" and not (tensor.is_cpu and triton_stats.interpreted()):
        return None
    return triton_stats


def _words(tensor: torch.Tensor, words: dict[int, torch.dtype]) -> torch.Tensor:
    """``tensor``'s bits as the fingerprint reads them: contiguous, as integers of the element's
    width (``words``: dtype by size in bytes), a 16-byte complex number as two 64-bit words."""
    x = tensor
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    if x.element_size() == 16:
        x = torch.view_as_real(x)
    return x.contiguous().view(words[x.element_size()])


def _current_stream(device: torch.device) -> Any:
    """The stream that work on ``device`` is queued on now (``None`` off CUDA: no streams there)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def _after_writers(streams: list[Any], device: torch.device) -> None:
    """Make the current stream of ``device`` wait, without the host waiting, for the work queued so
    far on ``streams`` (those that wrote a table's rows: the op capture reduces an op's outputs on
    the op's own stream, an FSDP all-gather's, say), so that the table's copy reads them finished."""
    current = _current_stream(device)
    for stream in streams:
        if stream is not None and stream != current:
            current.wait_stream(stream)


def _launch_groups(kernel: Any, members: list[tuple]) -> Iterator[list[tuple]]:
    """``members`` (tensor first) cut into launches of the Triton kernel: at most its
    ``TENSORS_PER_LAUNCH`` tensors, whose programs fit one table's scratch."""
    group: list[tuple] = []
    programs = 0
    for member in members:
        need = kernel.programs_for(member[0].numel())
        if group and (len(group) == kernel.TENSORS_PER_LAUNCH or programs + need > SCRATCH_ROWS):
            yield group
            group, programs = [], 0
        group.append(member)
        programs += need
    if group:
        yield group


class _Table:
    """One device's rows, their scratch and pinned host copy, and who waits for each row."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.values = torch.empty((TABLE_ROWS, WIDTH), dtype=torch.float64, device=device)
        self.scratch = torch.empty((SCRATCH_ROWS, WIDTH), dtype=torch.float64, device=device)
        self.counters = torch.zeros(TABLE_ROWS, dtype=torch.int32, device=device)
        self.fingerprints = torch.empty(TABLE_ROWS, dtype=torch.int64, device=device)
        """The fingerprint of each row's tensor, where asked: 64 bits, stored as int64."""
        self.scratch_fingerprints = torch.empty(SCRATCH_ROWS, dtype=torch.int64, device=device)
        self.directory = torch.empty(DIRECTORY_ENTRIES, dtype=torch.int64, device=device)
        """Addresses, element counts and first programs of the tensors that launches of more than
        the kernel's ``SLOTS`` reduce, written on the host (:attr:`host_directory`) and copied here."""
        pinned = device.type == "cuda"
        on_cpu = device.type == "cpu"
        self.host = self.values if on_cpu else torch.empty_like(self.values, device="cpu", pin_memory=pinned)
        self.host_fingerprints = (
            self.fingerprints if on_cpu else torch.empty_like(self.fingerprints, device="cpu", pin_memory=pinned)
        )
        self.host_directory = self.directory if on_cpu else torch.empty_like(self.directory, device="cpu", pin_memory=pinned)
        self.used = 0
        self.scratch_used = 0
        """Scratch rows that a launch still running may be using: the end of the furthest one taken."""
        self.directory_used = 0
        self.streams: list[Any] = []
        """The streams that wrote rows since the table was last read back (``None`` off CUDA)."""
        self.fingerprinted = False
        """Whether a row in use holds a fingerprint (else that column is not copied)."""
        # Each row's in-use facts, by row, in lists of their own: no object a row (a tuple holding
        # callables would outlive the collector's young passes, as StatsSink says).
        self.rows: list[int] = []
        """The row of each entry of the lists below (rows a run takes have none)."""
        self.numels: list[int] = []
        self.integral: list[bool] = []
        self.sinks: list[Callable[[Any], None] | dict[str, Any] | LandedSums | None] = []
        self.keys: list[int | None] = []
        """A :class:`LandedSums` sink's key (``None``: another sink)."""
        self.fingerprint_sinks: list[Callable[[int], None] | Landing | None] = []
        self.fingerprint_keys: list[int | None] = []
        """A fingerprint sink's key in its container (``None``: the sink is a callable)."""
        self.runs: list[tuple[int, LandedSums, np.ndarray, np.ndarray, bool]] = []
        """Rows whose sums land in a :class:`LandedSums` by array (:meth:`add_run`): the first row,
        where they land, their keys and element counts, whether their fingerprints too; no entry a row."""

    def fits(self, rows: int, scratch_rows: int, entries: int, stream: Any) -> bool:
        return (
            self.used + rows <= TABLE_ROWS
            and self._scratch_start(stream) + scratch_rows <= SCRATCH_ROWS
            and self.directory_used + entries <= DIRECTORY_ENTRIES
        )

    def _scratch_start(self, stream: Any) -> int:
        """Where a launch on ``stream`` may start in the scratch: at the start while every launch
        since the read-back ran on that stream (a launch starts once the one before it on its
        stream has finished, so their partial rows are free), else after every row that one still
        running may use."""
        return 0 if all(other == stream for other in self.streams) else self.scratch_used

    def take_scratch(self, rows: int, stream: Any) -> int:
        """The first of ``rows`` scratch rows for a launch on ``stream`` (see :meth:`fits`)."""
        start = self._scratch_start(stream)
        self.scratch_used = max(self.scratch_used, start + rows)
        self.written_on(stream)
        return start

    def written_on(self, stream: Any) -> None:
        """Note that work on ``stream`` writes rows of this table (the read-back waits for it)."""
        if stream not in self.streams:
            self.streams.append(stream)

    def take_directory(self, entries: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The next ``entries`` of the directory, on the device and on the host (``None`` for none).
        They stay untouched until the table is read back: the copy and the launch have run by then."""
        if not entries:
            return None
        start, self.directory_used = self.directory_used, self.directory_used + entries
        return self.directory[start : self.directory_used], self.host_directory[start : self.directory_used]

    def reset(self) -> None:
        """Empty the table once it has been read back (the kernel leaves its counters at zero)."""
        self.used = self.scratch_used = self.directory_used = 0
        self.streams = []
        self.fingerprinted = False
        self.rows, self.numels, self.integral, self.sinks, self.keys = [], [], [], [], []
        self.fingerprint_sinks, self.fingerprint_keys, self.runs = [], [], []

    def add_row(self, numel: int, integral: bool, sink: StatsSink | None, checksum_sink: FingerprintSink | None) -> int:
        """Take the next row for a tensor's statistics and/or fingerprint; returns its number."""
        row = self.used
        self.rows.append(row)
        self.numels.append(numel)
        self.integral.append(integral)
        into, key = _held(sink)
        self.sinks.append(into)
        self.keys.append(key)
        into, key = _held(checksum_sink)
        self.fingerprint_sinks.append(into)
        self.fingerprint_keys.append(key)
        self.fingerprinted |= checksum_sink is not None
        self.used += 1
        return row

    def add_run(self, landed: LandedSums, keys: np.ndarray, numels: np.ndarray, hashed: bool) -> None:
        """Take the next ``len(keys)`` rows for sums that land in ``landed`` at ``keys``, of tensors
        of ``numels`` elements, with their fingerprints where ``hashed``."""
        self.runs.append((self.used, landed, keys, numels, hashed))
        self.fingerprinted |= hashed
        self.used += len(keys)

    @property
    def nbytes(self) -> int:
        device = self.values.nbytes + self.scratch.nbytes + self.counters.nbytes
        device += self.fingerprints.nbytes + self.scratch_fingerprints.nbytes + self.directory.nbytes
        host = 0 if self.host is self.values else self.host.nbytes + self.host_fingerprints.nbytes + self.host_directory.nbytes
        return device + host


@dataclass
class _Transfer:
    """What one ``send`` copied to the host, and who waits for it."""

    tables: list[_Table] = field(default_factory=list)
    staged: list[tuple[torch.Tensor, list[tuple[int, int, _Sink]]]] = field(default_factory=list)
    """Host copies of the staged results (one per device and dtype) with ``(start, end, sink)``."""
    events: list[torch.cuda.Event] = field(default_factory=list)

    def ready(self) -> bool:
        return all(event.query() for event in self.events)

    def wait(self) -> None:
        for event in self.events:
            event.synchronize()


class StatsStager:
    """Per-device statistics tables and staged results, sent to the host once per flush; it never reads per tensor.

    - ``add(tensor, sink)`` reduces the tensor *now* (it may change in place later) into one row of a
      per-device table of float64 sums, one column per accumulator of :mod:`torchdebug.stats._schema`: on
      CUDA with a Triton kernel (:mod:`torchdebug.native.triton_stats`, one read of the tensor), elsewhere
      with torch ops (:func:`torchdebug.stats._torch_ops.device_sums`); ``add_all`` takes an op's tensors
      together, so that one launch reduces several. An item of ``add_all`` may also ask for the tensor's
      fingerprint (:mod:`torchdebug.checksum`): the same pass takes it, into an int64 column beside the row
      (the torch-op :func:`~torchdebug.checksum.fingerprint` where the kernel does not apply), and its sink
      gets it as an unsigned 64-bit int;
    - ``stage(result, sink)`` keeps any other small device result (a compiled graph's statistics vector)
      for the same transfer;
    - ``send()`` starts the transfer: one non-blocking copy of the used rows into pinned host memory per
      device (ordered, on the device, after the work of any other stream that wrote rows), plus the staged
      results, then records an event; ``deliver()`` hands rows to their sinks once that event has
      completed (``block=True`` waits for it: the one synchronisation of a step). ``flush()`` is both.

    CPU tensors are reduced at once (the native kernel, :mod:`torchdebug.native.fused_stats`, the
    fingerprint in the same pass) and delivered immediately: there is no device to wait for.

    Memory is bounded: at most two tables per device (one filling while the other is in flight), each
    :data:`TABLE_ROWS` rows (``schema.WIDTH`` float64 columns and an int64 fingerprint, 0.5 MiB a column,
    as much pinned on the host) with :data:`SCRATCH_ROWS` rows of scratch as wide, a counter per row
    (0.25 MiB) and a directory of :data:`DIRECTORY_ENTRIES` int64 (0.5 MiB, as much pinned): with the
    schema's 8 columns, 9.75 MiB on the device and 5 MiB pinned on the host. A full table is sent and a
    new one filled; when both are taken the older one is delivered first (a synchronisation per
    ``TABLE_ROWS`` captured tensors at worst). :meth:`memory_bytes` reports the total.
    """

    def __init__(self, finish: bool = True) -> None:
        """``finish``: sinks get a record's statistics (``schema.stats_from_sums``); else the sums
        vector itself (``schema.COLUMNS``), for a caller that finishes many at once (the flight
        recorder's ring)."""
        self._finish = finish
        self._filling: dict[torch.device, _Table] = {}
        self._free: dict[torch.device, list[_Table]] = {}
        self._tables_made: dict[torch.device, int] = {}
        self._staged: list[tuple[torch.Tensor, _Sink]] = []
        self._in_flight: list[_Transfer] = []

    def __len__(self) -> int:
        """Results not yet delivered."""
        waiting = sum(table.used for table in self._filling.values())
        in_flight = sum(t.used for transfer in self._in_flight for t in transfer.tables)
        in_flight += sum(len(sinks) for transfer in self._in_flight for _, sinks in transfer.staged)
        return waiting + in_flight + len(self._staged)

    def memory_bytes(self) -> int:
        """Bytes held by the tables, on devices and pinned on the host."""
        tables = list(self._filling.values()) + [t for free in self._free.values() for t in free]
        tables += [t for transfer in self._in_flight for t in transfer.tables]
        return sum(table.nbytes for table in tables)

    # -- capturing ---------------------------------------------------------------------------------
    def add(self, tensor: torch.Tensor, sink: StatsSink) -> None:
        """Reduce ``tensor`` now and deliver its statistics to ``sink`` by the next delivery."""
        self.add_all([(tensor, sink)])

    def add_all(self, items: list[tuple]) -> None:
        """:meth:`add` for each ``(tensor, sink)``, or ``(tensor, sink, checksum_sink)`` to also take
        the tensor's fingerprint (either sink may be ``None``; ``sink`` a :data:`StatsSink`;
        ``checksum_sink`` a :data:`FingerprintSink`, which gets an unsigned 64-bit int; a meta tensor
        has none). The tensors the Triton kernel reads are reduced together, up to
        :data:`~torchdebug.native.triton_stats.TENSORS_PER_LAUNCH` of one device and dtype per
        launch (pass an op's inputs, or its outputs, or a step's gradients, together), statistics
        and fingerprint in the same pass."""
        # (device, dtype, statistics, fingerprint, aligned) -> the tensors one launch takes together
        launches: dict[tuple[torch.device, torch.dtype, bool, bool, bool], list[tuple[torch.Tensor, bool, Any, Any]]] = {}
        landing: dict[int, tuple[LandedSums, list[torch.Tensor], list[int]]] = {}  # CPU tensors whose sums land
        for item in items:
            tensor, sink = item[0], item[1]
            checksum_sink = item[2] if len(item) > 2 else None
            if tensor.numel() == 0 or tensor.is_meta:
                if type(sink) is tuple:
                    sink[0].land(sink[1], IDENTITY, 0)
                elif sink is not None:
                    _give_stats(sink, empty_stats() if self._finish else list(IDENTITY))
                if checksum_sink is not None and not tensor.is_meta:
                    _give_fingerprint(checksum_sink, 0)  # the fingerprint of no elements
                continue
            if _resolves_now(tensor):
                if type(sink) is tuple and checksum_sink is None:
                    landed, key = sink
                    group = landing.get(id(landed))
                    if group is None:
                        group = landing[id(landed)] = (landed, [], [])
                    group[1].append(tensor)
                    group[2].append(key)
                else:
                    self._resolve_now(tensor, sink, checksum_sink)
                continue
            x = tensor.detach()
            integral = not (x.is_floating_point() or x.is_complex())
            kernel = _kernel_on(x)
            if kernel is not None and sink is not None and checksum_sink is not None and x.dtype in kernel.DTYPES:
                x = x.contiguous()  # the fingerprint's positions are the kernel's memory positions
                key = (x.device, x.dtype, True, True, kernel.aligned(x))
                launches.setdefault(key, []).append((x, integral, sink, checksum_sink))
                continue
            if sink is not None:
                values = x.abs() if x.is_complex() else x  # statistics of the magnitudes
                if kernel is not None and values.dtype in kernel.DTYPES and kernel.is_dense(values):
                    key = (x.device, values.dtype, True, False, kernel.aligned(values))
                    launches.setdefault(key, []).append((values, integral, sink, None))
                    sink = None
            if checksum_sink is not None and kernel is not None:
                words = _words(x, kernel.WORDS)
                key = (x.device, words.dtype, False, True, kernel.aligned(words))
                launches.setdefault(key, []).append((words, integral, None, checksum_sink))
                checksum_sink = None
            if sink is None and checksum_sink is None:
                continue
            stream = _current_stream(x.device)
            table = self._table(x.device, rows=1, scratch_rows=0, entries=0, stream=stream)
            table.written_on(stream)
            if sink is not None:
                table.values[table.used].copy_(device_sums(x))
            if checksum_sink is not None:
                table.fingerprints[table.used].copy_(fingerprint(x))  # torch ops: no Triton here
            table.add_row(x.numel(), integral, sink, checksum_sink)
        for (device, _, stats, hashed, _), members in launches.items():
            kernel = _triton()
            for group in _launch_groups(kernel, members):
                tensors = [x for x, _, _, _ in group]
                scratch_rows, entries = kernel.scratch_rows(tensors), kernel.directory_entries(tensors)
                stream = _current_stream(device)
                table = self._table(device, rows=len(group), scratch_rows=scratch_rows, entries=entries, stream=stream)
                rows = (table.values, table.used, table.scratch, table.take_scratch(scratch_rows, stream), table.counters)
                fingerprints = (table.fingerprints, table.scratch_fingerprints) if hashed else ()
                kernel.launch(tensors, *rows, *fingerprints, stats=stats, directory=table.take_directory(entries))
                for x, integral, sink, checksum_sink in group:
                    table.add_row(x.numel(), integral, sink, checksum_sink)
        for landed, tensors, keys in landing.values():
            landed.land_in_place(keys, tensors)

    def add_landed(
        self, tensors: list[torch.Tensor], landed: LandedSums, keys: np.ndarray, memory: np.ndarray, hashed: bool = False
    ) -> None:
        """:meth:`add_all` of ``(tensors[k], (landed, keys[k]))`` (with ``hashed``, ``(tensors[k],
        (landed, keys[k]), (landed, keys[k]))``): each tensor's statistics, its sums (and fingerprint)
        landed at its key, with no Python a tensor where ``memory`` (a row a tensor: its data's
        address, element count, ``c10::ScalarType`` code, device code and :data:`DENSE` /
        :data:`CONTIGUOUS` flags, as ``observer.StagedFacts`` ends) says the Triton kernel reads it:
        those of one device, dtype and alignment take launches of up to ``TENSORS_PER_LAUNCH``,
        listed by array, and land as one run of rows; a device's tensors the host reads at no cost
        land by one native call (statistics alone). The rest (a tensor the kernel does not read:
        empty, not dense, not contiguous for a fingerprint, another dtype) take :meth:`add_all`."""
        address, numel, dtype, device, flags = memory.T
        kinds = device << 16 | dtype
        if (kinds == kinds[0]).all():  # (most often: one device's and dtype's, in one group)
            groups = [np.arange(len(kinds))]
        else:
            order = np.argsort(kinds, kind="stable")
            groups = np.split(order, np.flatnonzero(np.diff(kinds[order])) + 1)
        read = (address != 0) & (flags & (CONTIGUOUS if hashed else DENSE) != 0) & (numel > 0)
        aligned = address % 16 == 0
        rest: list[np.ndarray] = []
        for members in groups:
            example = tensors[members[0]]
            if _resolves_now(example) and not hashed:
                filled = numel[members] > 0
                rest.append(members[~filled])
                members = members[filled]
                if len(members):
                    landed.land_in_place(keys[members].tolist(), [tensors[k] for k in members.tolist()], numel[members])
                continue
            kernel = None if _resolves_now(example) else _kernel_for(example)
            taken = read[members]
            if kernel is None or not taken.any():
                rest.append(members)
                continue
            if not taken.all():
                rest.append(members[~taken])
                members = members[taken]
            on_16 = aligned[members]
            parts = ((members, True),) if on_16.all() else ((members[on_16], True), (members[~on_16], False))
            for group, group_aligned in parts:
                if len(group):
                    self._launch_landed(kernel, tensors, group, memory, landed, keys, group_aligned, hashed)
        left = np.concatenate(rest).tolist() if rest else []
        if left:
            landing = [(landed, key) for key in keys[left].tolist()]
            self.add_all([(tensors[k], at, at if hashed else None) for k, at in zip(left, landing)])

    def _launch_landed(
        self,
        kernel: Any,
        tensors: list[torch.Tensor],
        members: np.ndarray,
        memory: np.ndarray,
        landed: LandedSums,
        keys: np.ndarray,
        aligned: bool,
        hashed: bool,
    ) -> None:
        """:meth:`add_landed`'s launches over ``tensors[members]`` (one device's and dtype's, each read
        by the kernel; ``aligned``: all or none; ``hashed``: their fingerprints too): each of up to
        ``TENSORS_PER_LAUNCH`` whose programs fit one table's scratch (as :func:`_launch_groups` cuts
        them), its rows one run."""
        address, numel = memory[members, 0], memory[members, 1]
        programs = kernel.programs_of(numel)
        device = tensors[members[0]].device
        stream = _current_stream(device)
        start = 0
        while start < len(members):
            total = np.cumsum(programs[start : start + kernel.TENSORS_PER_LAUNCH])
            count = max(1, int(np.searchsorted(total, SCRATCH_ROWS, side="right")))
            end = start + count
            scratch_rows = int(total[count - 1]) if programs[start:end].max() > 1 else 0
            entries = 3 * count if count > kernel.SLOTS else 0
            table = self._table(device, rows=count, scratch_rows=scratch_rows, entries=entries, stream=stream)
            rows = (table.values, table.used, table.scratch, table.take_scratch(scratch_rows, stream), table.counters)
            template = tensors[members[start]]
            fingerprints = (table.fingerprints, table.scratch_fingerprints) if hashed else ()
            if entries:
                directory = table.take_directory(entries)
                listed = (address[start:end], numel[start:end], template)
                kernel.launch_listed(*listed, *rows, *fingerprints, directory=directory, aligned=aligned)
            else:
                kernel.launch([tensors[k] for k in members[start:end].tolist()], *rows, *fingerprints)
            table.add_run(landed, keys[members[start:end]], numel[start:end], hashed)
            start = end

    def _resolve_now(self, tensor: torch.Tensor, sink: StatsSink | None, checksum_sink: FingerprintSink | None) -> None:
        """Statistics (or sums) and/or fingerprint of a tensor the host reads at no cost, delivered at once."""
        if type(sink) is tuple:  # its sums land (with its fingerprint, from the fused pass of both)
            x = tensor.detach()
            both = stats_and_fingerprint(x) if checksum_sink is not None else None
            sink[0].land(sink[1], cpu_sums(as_real(x)) if both is None else both[0], x.numel())
            if both is not None:
                _give_fingerprint(checksum_sink, both[1])  # type: ignore[arg-type]
                return
            sink = None
        if sink is not None and not self._finish:
            _give_stats(sink, cpu_sums(as_real(tensor.detach())))
            sink = None
        if sink is not None and checksum_sink is not None:
            stats, value = cpu_stats_and_fingerprint(tensor)
            _give_stats(sink, stats)
            _give_fingerprint(checksum_sink, value)
        elif sink is not None:
            _give_stats(sink, cpu_stats(tensor))
        elif checksum_sink is not None:
            _give_fingerprint(checksum_sink, cpu_fingerprint(tensor))

    def stage(self, result: torch.Tensor, sink: Callable[[list], None]) -> None:
        """Deliver ``result`` (a small tensor) to ``sink`` as a list of Python numbers by the next
        delivery; at once when it is on the CPU."""
        vector = result.reshape(-1)
        if _resolves_now(vector):
            sink(vector.tolist())
        else:
            self._staged.append((vector, sink))

    def _table(self, device: torch.device, rows: int, scratch_rows: int, entries: int, stream: Any) -> _Table:
        """The table of ``device`` being filled, with room for ``rows`` more rows, ``scratch_rows``
        more scratch rows for a launch on ``stream`` and ``entries`` more directory entries."""
        table = self._filling.get(device)
        if table is not None and table.fits(rows, scratch_rows, entries, stream):
            return table
        if table is not None:  # full: send it and fill another
            self.send()
        free = self._free.setdefault(device, [])
        while not free and self._tables_made.get(device, 0) >= 2:  # both in flight: wait for the older
            self.deliver(block=True, oldest_only=True)
        if free:
            table = free.pop()
        else:
            self._tables_made[device] = self._tables_made.get(device, 0) + 1
            table = _Table(device)
        self._filling[device] = table
        return table

    # -- reading -----------------------------------------------------------------------------------
    def send(self) -> None:
        """Start copying everything added and staged so far to the host, without waiting."""
        if not self._filling and not self._staged:
            return
        transfer = _Transfer()
        devices: set[torch.device] = set()
        for device, table in self._filling.items():
            if table.used:
                if table.host is not table.values:
                    _after_writers(table.streams, device)
                    pinned = table.host.is_pinned()
                    table.host[: table.used].copy_(table.values[: table.used], non_blocking=pinned)
                    if table.fingerprinted:
                        table.host_fingerprints[: table.used].copy_(table.fingerprints[: table.used], non_blocking=pinned)
                transfer.tables.append(table)
                devices.add(device)
            else:
                self._free.setdefault(device, []).append(table)
        self._filling = {}
        groups: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, _Sink]]] = {}
        for vector, sink in self._staged:
            groups.setdefault((vector.device, vector.dtype), []).append((vector, sink))
        self._staged = []
        for (device, _), members in groups.items():
            flat = torch.cat([vector for vector, _ in members])
            host = flat.to("cpu", non_blocking=device.type == "cuda")  # pinned by torch when non-blocking
            sinks, start = [], 0
            for vector, sink in members:
                sinks.append((start, start + vector.shape[0], sink))
                start += vector.shape[0]
            transfer.staged.append((host, sinks))
            devices.add(device)
        for device in devices:
            if device.type == "cuda":
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                transfer.events.append(event)
        self._in_flight.append(transfer)

    def deliver(self, block: bool = True, oldest_only: bool = False) -> bool:
        """Hand sent results to their sinks, oldest transfer first; ``block``: wait for the copies
        (else stop at the first one still running). Returns whether nothing sent is left."""
        while self._in_flight:
            transfer = self._in_flight[0]
            if block:
                transfer.wait()
            elif not transfer.ready():
                return False
            self._in_flight.pop(0)
            for table in transfer.tables:
                values = table.host[: table.used].numpy().copy()  # (a sink may fill the table again)
                rows = None  # the values as lists, where a sink takes them so
                printed = table.host_fingerprints[: table.used].numpy().view(np.uint64).copy() if table.fingerprinted else None
                prints = printed.tolist() if printed is not None and table.fingerprint_sinks else []
                numels, integral, sinks, runs = table.numels, table.integral, table.sinks, table.runs
                fingerprint_sinks, fingerprint_keys, keys = table.fingerprint_sinks, table.fingerprint_keys, table.keys
                table_rows = table.rows
                self._free.setdefault(table.device, []).append(table)
                table.reset()
                landing: dict[int, tuple[LandedSums, list[int], list[int], list[int]]] = {}  # by table: rows, keys, sizes
                for entry, (row, sink) in enumerate(zip(table_rows, sinks)):
                    if type(sink) is LandedSums:
                        group = landing.get(id(sink))
                        if group is None:
                            group = landing[id(sink)] = (sink, [], [], [])
                        group[1].append(row)
                        group[2].append(keys[entry])  # type: ignore[arg-type]
                        group[3].append(numels[entry])
                    elif sink is not None:
                        rows = values.tolist() if rows is None else rows
                        sums = rows[row]
                        _give_stats(sink, stats_from_sums(sums, numels[entry], integral[entry]) if self._finish else sums)
                    if (fingerprint_sink := fingerprint_sinks[entry]) is not None:
                        _give_fingerprint_at(fingerprint_sink, fingerprint_keys[entry], prints[row])
                for landed, at, into, sizes in landing.values():
                    landed.land_many(into, values[at], np.asarray(sizes))
                for start, landed, into, sizes, hashed in runs:
                    landed.land_many(into, values[start : start + len(into)], sizes)
                    if hashed:
                        landed.land_fingerprints(into, printed[start : start + len(into)])  # type: ignore[index]
            for host, sinks in transfer.staged:
                values = host.tolist()
                for start, end, sink in sinks:
                    sink(values[start:end])
            if oldest_only:
                break
        return not self._in_flight

    def abandon(self) -> int:
        """Drop every result not delivered (a transfer or a kernel failed: the device is lost, or
        memory): their sinks are never called, and the tables that held them are let go (a failed
        kernel may have left their counters set), new ones made as needed. Returns how many were dropped."""
        dropped = len(self)
        for table in list(self._filling.values()) + [table for transfer in self._in_flight for table in transfer.tables]:
            self._tables_made[table.device] -= 1
        self._filling, self._staged, self._in_flight = {}, [], []
        return dropped

    def flush(self) -> None:
        """Send and deliver everything, waiting once per device; sinks may stage more, delivered in
        the same flush."""
        while self._filling or self._staged or self._in_flight:
            self.send()
            self.deliver(block=True)
