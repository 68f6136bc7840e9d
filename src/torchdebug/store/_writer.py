"""Crash-safe writing of one rank's records, stacks and tensors, on two background threads.

Records are appended as one Arrow record batch per flush and stacks as JSON lines, so a process killed
mid-step keeps every batch written before the kill; tensor files are written under a temporary name
and renamed, so a file is complete or absent. Tensor files are written while the next step runs,
within ``tensor_bytes_in_flight`` of batch buffers. A failed write stops capture, never training
(unless ``on_write_error="raise"``). Why, and how a fault is handled: docs/architecture.md, "Eager
capture, step by step" and "Decisions and their reasons"; what a partial dump holds: docs/format.md.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import logging
import os
import platform
import queue
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from torchdebug import progress
from torchdebug.config import TENSOR_BYTES_IN_FLIGHT
from torchdebug.dist import broadcast_from_rank0, dist_initialized, first_failure
from torchdebug.errors import DumpError
from torchdebug.records import SCHEMA_VERSION, Record
from torchdebug.store import _layout as layout
from torchdebug.store._faults import WriteFault, charge, free_bytes, freed
from torchdebug.store._record_columns import records_batch
from torchdebug.store._record_file import RecordFile
from torchdebug.store._tensor_batch import BLOCK, TensorBatch
from torchdebug.version import __version__

BATCH_BYTES = 128 * 2**20
"""Largest size of a reusable tensor batch buffer."""

RESERVE_BYTES = 64 * 2**10
"""Bytes kept on disk from the start (``layout.RESERVE``) and freed at ``close``, so that the
completion marker of a dump that filled its disk can still be written; the free space
:func:`check_writable` asks for too."""


logger = logging.getLogger("torchdebug.store._writer")


def batch_bytes_for(bytes_in_flight: int) -> int:
    """Size of a reusable batch buffer under the bound: two fit (one filled while the other is
    written), at most :data:`BATCH_BYTES`, a power of two (the size torch's pinned-memory allocator
    rounds every block up to, so no pinned memory is hidden in rounding)."""
    return 1 << max(min(BATCH_BYTES, bytes_in_flight // 2), 1).bit_length() - 1


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def check_writable(path: Path) -> None:
    """Create ``path`` if needed and prove that :data:`RESERVE_BYTES` can be written there, or
    raise a one-line DumpError (a missing, read-only or full filesystem fails here, before the run).
    This process alone: :func:`check_writable_on_every_rank` where ranks meet afterwards."""
    probe = path / f".torchdebug-write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        try:
            _write_reserve(probe)
        finally:
            probe.unlink(missing_ok=True)
    except OSError as error:
        raise unwritable(path, error) from None


def check_writable_on_every_rank(path: Path) -> None:
    """:func:`check_writable` on every rank, agreed: where one rank's fails (its node's disk is
    full, say), every rank raises, naming that rank, so none is left waiting in a collective that
    follows (the run folder's broadcast). A collective itself: every rank of the group calls it."""
    try:
        check_writable(path)
        problem = ""
    except DumpError as error:
        problem = str(error)
    failed = first_failure(problem)
    if failed is not None:
        rank, message = failed
        raise DumpError(message if message == problem else f"rank {rank}: {message}") from None


def unwritable(path: Path, error: OSError) -> DumpError:
    """The one-line error of a dump folder that cannot be written: the OS's reason and the free space."""
    reason = (error.strerror or str(error)).lower()
    free = free_bytes(path)
    room = f", {free / 2**20:.1f} MiB free" if free is not None and error.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return DumpError(f"dump_path: cannot write to {path}: {reason}{room}; choose a writable folder with free space")


def _write_reserve(path: Path) -> None:
    charge(path, RESERVE_BYTES)
    with open(path, "wb") as handle:
        handle.write(bytes(RESERVE_BYTES))


def new_run_name() -> str:
    """A run folder name from the local time, e.g. ``20261122-101500``."""
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_manifest(run_id: str, rank: int, world_size: int, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``manifest.json`` of one rank's folder: tool, torch, Python, host and process, the
    rank, the definition its checksums follow (``fingerprint``: :data:`torchdebug.checksum.FINGERPRINT_VERSION`;
    a manifest without it is from before fingerprint 2) and the config that made the dump (``extra``
    adds fields, e.g. ``capture="graph"``)."""
    from torchdebug.checksum import FINGERPRINT_VERSION

    return {
        "tool": "torchdebug",
        "tool_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "run_id": run_id,
        "rank": rank,
        "world_size": world_size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cuda": torch.cuda.is_available(),
        "fingerprint": FINGERPRINT_VERSION,
        **extra,
        "config": config,
    }


def create_run_dir(dump_path: Path, name: str) -> Path:
    """Make a new run folder under ``dump_path``; never reuses an existing one (adds ``-1``, ``-2``)."""
    check_writable(dump_path)
    candidate, suffix = name, 0
    while True:
        run_dir = dump_path / candidate
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            suffix += 1
            candidate = f"{name}-{suffix}"
        except OSError as error:
            raise unwritable(dump_path, error) from None


def join_run(dump_root: Path, rank: int, world_size: int) -> Path:
    """The run folder every rank of this job writes into.

    With torch.distributed initialised, rank 0 makes a fresh folder and broadcasts its name. Under
    torchrun without a process group yet, the folder is named after the job's run id (and restart
    count), the same on every rank. A single process makes a fresh folder named by the time.
    """
    elastic_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if dist_initialized() or world_size == 1 or elastic_id == "none":
        if world_size > 1 and not dist_initialized():
            logger.warning(
                "rank %d of %d: torch.distributed is not initialised and no torchrun run id is set, so "
                "ranks may write different run folders; build the Debugger or dump backend after init_process_group",
                rank,
                world_size,
            )
        name, problem = "", ""
        if rank == 0:
            try:
                name = create_run_dir(dump_root, new_run_name()).name
            except DumpError as error:
                problem = str(error)
        failed = first_failure(problem)  # rank 0 failing to make the folder fails every rank, none waits
        if failed is not None:
            raise DumpError(failed[1] if rank == 0 else f"rank 0: {failed[1]}") from None
        name = broadcast_from_rank0(name) or new_run_name()
    else:
        name = f"torchrun-{elastic_id}-restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    run_dir = dump_root / name
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise unwritable(dump_root, error) from None
    return run_dir


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, indent=2, default=str)
    charge(tmp, len(text))
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class RankWriter:
    """Appends one rank's records, stacks and tensor batches under its rank folder.

    Records and stacks are appended in submission order by one background thread, tensor files
    written by another. :meth:`drain` waits until the records submitted so far are on disk (the
    debugger drains every step); ``drain(tensors=True)`` and :meth:`close` wait for the tensors too.
    A failed write sets :attr:`fault`; ``on_write_error`` says whether the calls after it raise
    (``raise``) or go on without writing what cannot be written (``continue``).

    A write that fails (a full disk, a quota, a read-only or broken filesystem, a writer thread that
    exited) is said in one warning; the writer then stops taking tensors (then records, when records
    cannot be written either), never waits on a writer that will not come back, and :meth:`close`
    marks the dump ``truncated`` with the first failing step, slot and error
    (:class:`~torchdebug.store._faults.WriteFault`). A small reserve file made at the start is deleted
    at ``close`` to give that marker room on a full disk. The batch buffers (pinned when CUDA is
    present) hold at most ``bytes_in_flight`` bytes together, usually two of half that (one filled
    while the other is written); once all are taken, capture waits for the writer instead of
    allocating more, so a slow disk slows the step rather than filling memory. ``close`` reports the
    peaks (``tensor_transfer`` in ``complete.json``, and a log line).
    """

    def __init__(
        self,
        rank_dir: Path,
        manifest: dict[str, Any],
        *,
        bytes_in_flight: int = TENSOR_BYTES_IN_FLIGHT,
        on_write_error: str = "continue",
    ) -> None:
        try:
            rank_dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise DumpError(f"{rank_dir} exists already; a dump never overwrites an earlier run") from None
        except OSError as error:
            raise unwritable(rank_dir.parent, error) from None
        self.rank_dir = rank_dir
        self.on_write_error = on_write_error
        self.record_count = 0
        """Records on disk (those submitted after a failed write are not)."""
        self.last_step = 0
        """The step of the last batch submitted or begun (what a failure outside a batch is filed under)."""
        self.unwritten_records = 0
        """Records submitted that were not written: in the write that failed, or after it."""
        self.fault: WriteFault | None = None
        """The first write that failed (``None`` while every write succeeded)."""
        self.takes_tensors = True
        """``False`` after any failed write: capture stops taking tensors."""
        self.takes_records = True
        """``False`` after a failed write of records: capture stops making them."""
        self.bytes_in_flight = bytes_in_flight
        self.batch_bytes = batch_bytes_for(bytes_in_flight)
        self.transfers = TransferPeaks(bytes_in_flight, pinned=torch.cuda.is_available())
        self._stack_ids: set[str] = set()
        self._pending_stacks: list[dict[str, Any]] = []
        self._tensor_files: dict[int, int] = {}
        self._tensor_bytes = [0, 0]  # submitted, written (or given up): what a wait for the tensor files shows
        self._idle_batches: list[TensorBatch] = []
        self._buffers = threading.Condition()  # guards the idle batches, the bytes in transfers and the fault
        self._record_jobs: queue.Queue[_RecordJob | None] = queue.Queue()
        self._records_submitted = 0
        """Record jobs put on ``_record_jobs`` so far (:meth:`mark`)."""
        self._tensor_jobs: queue.Queue[_TensorJob | None] = queue.Queue()
        manifest = {"schema_version": SCHEMA_VERSION, "start_time": now_iso(), **manifest}
        try:
            _write_json_atomic(rank_dir / layout.MANIFEST, manifest)
            _write_reserve(rank_dir / layout.RESERVE)
            self._records = RecordFile(rank_dir / layout.RECORDS)
            # A line-buffered text file: each write of whole lines reaches the OS at once.
            self._stacks = open(rank_dir / layout.STACKS, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as error:
            raise unwritable(rank_dir, error) from None
        self._threads = [
            threading.Thread(target=self._run, args=(jobs, write), name=f"torchdebug-{kind}-{rank_dir.name}", daemon=True)
            for kind, jobs, write in (
                ("records", self._record_jobs, self._write_records),
                ("tensors", self._tensor_jobs, self._write_tensors),
            )
        ]
        for thread in self._threads:
            thread.start()
        self.closed = False

    # -- called by the capturing thread --------------------------------------------------------
    def add_stack(self, stack_id: str, frames: list[str]) -> None:
        """Queue a stack for writing with the next batch of records (once per id)."""
        if stack_id not in self._stack_ids:
            self._stack_ids.add(stack_id)
            self._pending_stacks.append({"id": stack_id, "frames": frames})

    def begin_step(self, step: int) -> None:
        """Note that what follows belongs to ``step`` (a failed write outside a batch is filed under it)."""
        self.last_step = step

    def has_stack(self, stack_id: str) -> bool:
        return stack_id in self._stack_ids

    def tensor_batch(self, nbytes: int) -> TensorBatch:
        """An empty batch with room for ``nbytes``: the smallest idle buffer that fits, else a new one
        of ``batch_bytes`` (or, if larger, of ``nbytes`` and a block, a power of two when pinned)
        while all buffers stay within ``bytes_in_flight``; else wait for the writer to hand one back.
        A tensor larger than the bound gets a buffer of its own once every other one is freed.
        Raises DumpError once tensors are no longer taken (a failed write): never waits for a
        writer that failed or exited."""
        report = self.transfers
        needed = nbytes + BLOCK  # a batch keeps a block for the padding of direct writes
        size = max(self.batch_bytes, _ceil_power_of_two(needed) if report.pinned else needed)
        waited_since = None
        with self._buffers:
            while True:
                if not self.takes_tensors:
                    raise DumpError(f"tensors are no longer saved: {self.fault.describe() if self.fault else 'a write failed'}")
                fitting = [batch for batch in self._idle_batches if batch.capacity >= nbytes]
                if fitting:
                    batch = min(fitting, key=lambda batch: batch.size)
                    self._idle_batches.remove(batch)
                    break
                while self._idle_batches and report.host_bytes + size > self.bytes_in_flight:
                    report.host_bytes -= self._idle_batches.pop().size  # too small: make room
                if report.host_bytes + size <= self.bytes_in_flight or report.host_bytes == 0:
                    report.host_bytes += size
                    report.host_peak_bytes = max(report.host_peak_bytes, report.host_bytes)
                    batch = None
                    break
                if waited_since is None:
                    waited_since = time.perf_counter()
                    report.waits += 1
                self._buffers.wait(1.0)
                self._check_alive(self._threads[1], pending=1)  # the buffers it holds would never come back
        if waited_since is not None:
            report.wait_seconds += time.perf_counter() - waited_since
        return batch if batch is not None else TensorBatch(size, pin_memory=report.pinned)

    def submit(self, step: int, records: list[Record], batch: TensorBatch | None, refs: list[dict[str, str]]) -> None:
        """Hand a batch to the writer threads: the tensor file to one, stacks and records to the other.

        The records' columns are made here, on the calling thread: building them on the writer
        thread would hold the GIL while the training thread waits for it after every torch op (the
        writer thread compresses and writes them with the GIL released). After a failed write, what
        can no longer be written is dropped here (counted in :attr:`unwritten_records`).
        """
        self._raise_fault()
        self.last_step = step
        tensor_file = None
        if batch is not None:
            batch.seal()
        if batch is not None and batch.entries:  # named even when it cannot be written: the reader says why it is absent
            number = self._tensor_files.get(step, 0)
            self._tensor_files[step] = number + 1
            tensor_file = layout.tensor_file_name(step, number)
            for ref in refs:
                ref["file"] = tensor_file
        if batch is not None and not self.takes_tensors:
            self._release(batch, submitted=False)
            batch = None
        stacks = self._stack_lines(len(records))
        if stacks is None:
            return
        columns = records_batch(records) if records else None
        if batch is not None:
            self._tensor_bytes[0] += batch.used
            with self._buffers:
                self.transfers.device_bytes += batch.staged_bytes
                self.transfers.device_peak_bytes = max(self.transfers.device_peak_bytes, self.transfers.device_bytes)
            self._tensor_jobs.put(_TensorJob(step, tensor_file, batch))
        self._put_records(_RecordJob(step, records[0].name if records else None, stacks, columns))

    def submit_columns(self, step: int, columns: pa.RecordBatch) -> None:
        """Hand records already in columns to the writer thread, with the stacks pending, as
        :meth:`submit` hands records: ``columns`` has the schema :func:`records_batch` gives (the
        native path builds it from its drained arrays, no record object per slot)."""
        self._raise_fault()
        self.last_step = step
        stacks = self._stack_lines(columns.num_rows)
        if stacks is not None:
            first = columns.column("name")[0].as_py() if columns.num_rows else None
            self._put_records(_RecordJob(step, first, stacks, columns if columns.num_rows else None))

    def _put_records(self, job: _RecordJob) -> None:
        self._record_jobs.put(job)
        self._records_submitted += 1

    def mark(self) -> int:
        """Where the records submitted so far end: :meth:`drain` ``(until=mark)`` waits for those only."""
        return self._records_submitted

    def _stack_lines(self, records: int) -> str | None:
        """The pending stacks as JSON lines, taken from the queue; ``None`` once records are no
        longer taken (a failed write: the stacks are dropped and the ``records`` counted unwritten)."""
        lines = "".join(json.dumps(s) + "\n" for s in self._pending_stacks) if self.takes_records else None
        self._pending_stacks = []
        if lines is None:
            self._count_unwritten(records)
        return lines

    def drain(self, tensors: bool = False, until: int | None = None) -> None:
        """Wait until the records and stacks submitted so far (those before ``until``, a :meth:`mark`)
        are on disk (``tensors``: the tensor files too); with ``on_write_error="raise"``, raise if
        writing failed."""
        self._join(self._record_jobs, self._threads[0], 0 if until is None else self._records_submitted - until)
        if tensors:
            self._wait_for_tensors()
        self._raise_fault()

    def _join(self, jobs: queue.Queue, thread: threading.Thread, left: int = 0) -> None:
        """``jobs.join()`` that gives up on a writer thread that exited (recorded as a fault); with
        ``left``, until no more than the last ``left`` jobs put are unfinished (one thread takes them in order)."""
        with jobs.all_tasks_done:  # queue.Queue's condition
            while jobs.unfinished_tasks > left and self._check_alive(thread, jobs.unfinished_tasks):
                jobs.all_tasks_done.wait(0.5)

    def _check_alive(self, thread: threading.Thread, pending: int) -> bool:
        """Whether ``thread`` still runs; one that exited with work ``pending`` is a fault (no wait
        may wait for it)."""
        if thread.is_alive():
            return True
        if pending:
            self._fail(RuntimeError(f"the writer thread {thread.name} exited"), self.last_step, None, self.rank_dir, records=True)
        return False

    def _wait_for_tensors(self) -> None:
        """Wait until the tensor files submitted so far are written, with a bar of the bytes left
        when that lasts (hundreds of MB on a slow disk)."""
        jobs, thread = self._tensor_jobs, self._threads[1]
        written = self._tensor_bytes[1]
        if self._tensor_bytes[0] == written:
            self._join(jobs, thread)  # nothing left but empty batches: no bar
            return
        with progress.bar(self._tensor_bytes[0] - written, "writing tensor files", unit="B") as shown:
            while True:
                with jobs.all_tasks_done:  # queue.Queue's condition: join() with a timeout
                    if jobs.unfinished_tasks:
                        jobs.all_tasks_done.wait(0.2)
                    pending = jobs.unfinished_tasks
                shown.update(self._tensor_bytes[1] - written)
                written = self._tensor_bytes[1]
                if not pending or not self._check_alive(thread, pending):
                    return

    def _raise_fault(self) -> None:
        if self.fault is not None and self.on_write_error == "raise":
            raise DumpError(f"writing the dump under {self.rank_dir} failed: {self.fault.describe()}")

    def close(self, status: str = "complete", **info: Any) -> None:
        """Write everything pending, then the completion marker (idempotent). With a failed write,
        the marker says ``truncated`` (and, with ``on_write_error="raise"``, this raises after it)."""
        if self.closed:
            return
        self.closed = True
        raising, self.on_write_error = self.on_write_error, "continue"  # the marker is written first
        self.submit(self.last_step, [], None, [])  # the stacks still pending
        self._wait_for_tensors()
        self._join(self._record_jobs, self._threads[0])
        for jobs, thread in zip((self._record_jobs, self._tensor_jobs), self._threads):
            jobs.put(None)
            if thread.is_alive():
                thread.join()
        self._close_files()
        self._free_reserve()  # room for the marker on a full disk
        if self.transfers.host_peak_bytes:
            info["tensor_transfer"] = asdict(self.transfers)
            logger.info("%s: %s", self.rank_dir, self.transfers.summary(self._tensor_bytes[1]))
        marker = {"status": status, "end_time": now_iso(), "records": self.record_count, **info}
        if self.fault is not None:
            marker["truncated"] = {**self.fault.to_dict(), "unwritten_records": self.unwritten_records}
        try:
            _write_json_atomic(self.rank_dir / layout.COMPLETE, marker)
        except OSError as error:
            self._fail(error, self.last_step, None, self.rank_dir / layout.COMPLETE, records=True)
            logger.warning("torchdebug: %s: the completion marker could not be written (%s)", self.rank_dir, error)
        self.on_write_error = raising
        self._raise_fault()

    def _free_reserve(self) -> None:
        reserve = self.rank_dir / layout.RESERVE
        try:
            reserve.unlink()
        except OSError:
            return
        freed(reserve, RESERVE_BYTES)

    def _close_files(self) -> None:
        """Close the records and stacks files; after a failed write of records, without the stream's
        end marker (a reader takes the stream as it is, as after a crash)."""
        try:
            self._stacks.close()
        except OSError as error:
            self._fail(error, self.last_step, None, self.rank_dir / layout.STACKS, records=True)
        try:
            self._records.close(end=self.takes_records)
        except OSError as error:
            self._fail(error, self.last_step, None, self.rank_dir / layout.RECORDS, records=True)

    def _fail(self, error: BaseException, step: int, slot: str | None, path: Path, *, records: bool) -> None:
        """Note a failed write: the first is the dump's fault, said once in a warning; tensors are no
        longer taken, nor records when ``records`` (a write of records failed)."""
        with self._buffers:
            first = self.fault is None
            if first:
                self.fault = WriteFault.of(error, step, slot, path)
            self.takes_tensors = False
            self.takes_records = self.takes_records and not records
            self._buffers.notify_all()  # a capture waiting for a buffer gives up
        if first:
            then = "raises" if self.on_write_error == "raise" else "stops here, the training goes on"
            logger.warning("torchdebug: %s; capture %s and the dump is marked truncated", self.fault.describe(), then)

    # -- the writer threads ------------------------------------------------------------------------
    def _run(self, jobs: queue.Queue, write: Any) -> None:
        while True:
            job = jobs.get()
            try:
                if job is None:
                    return
                write(job)
            except BaseException as error:  # a fault of the writer itself: the dump stops, the training does not
                self._fail(error, job.step, None, self.rank_dir, records=True)
            finally:
                jobs.task_done()

    def _write_tensors(self, job: _TensorJob) -> None:
        batch = job.batch
        try:
            if job.tensor_file is not None and self.takes_tensors:
                path = self.rank_dir / job.tensor_file
                try:
                    path.parent.mkdir(exist_ok=True)
                    charge(path, batch.used)
                    batch.write(path, {"schema_version": str(SCHEMA_VERSION), "step": str(job.step)})
                except BaseException as error:
                    self._fail(error, job.step, batch.entries[0][0] if batch.entries else None, path, records=False)
        finally:
            self._tensor_bytes[1] += batch.used
            self._release(batch)

    def _release(self, batch: TensorBatch, submitted: bool = True) -> None:
        """Hand a batch's buffer back for reuse (written, or given up; ``submitted``: its device
        copies were counted in the transfers)."""
        batch.settle()  # a buffer given up unwritten may still be receiving its transfers
        with self._buffers:
            if submitted:
                self.transfers.device_bytes -= batch.staged_bytes
            batch.clear()
            self._idle_batches.append(batch)
            self._buffers.notify()

    def _write_records(self, job: _RecordJob) -> None:
        count = job.columns.num_rows if job.columns is not None else 0
        if not self.takes_records:
            self._count_unwritten(count)
            return
        path = self.rank_dir / layout.STACKS
        try:
            if job.stacks:
                charge(path, len(job.stacks))
                self._stacks.write(job.stacks)
            if job.columns is not None:
                path = self.rank_dir / layout.RECORDS
                charge(path, lambda: job.columns.nbytes)
                self._records.append(job.columns)
        except BaseException as error:
            self._count_unwritten(count)
            self._fail(error, job.step, job.first, path, records=True)
            return
        self.record_count += count

    def _count_unwritten(self, count: int) -> None:
        with self._buffers:  # counted from both threads
            self.unwritten_records += count


@dataclass
class TransferPeaks:
    """The memory that tensor snapshots took on their way to disk, as ``complete.json`` reports it
    under ``tensor_transfer`` (bytes; ``*_peak_bytes`` are the highest values seen)."""

    bytes_in_flight: int
    """The bound on the batch buffers (``tensor_bytes_in_flight``)."""
    pinned: bool
    """Whether the buffers are pinned (CUDA present): transfers from CUDA are then asynchronous."""
    host_bytes: int = 0
    """Batch buffers allocated now, in use or idle."""
    host_peak_bytes: int = 0
    """Above ``bytes_in_flight`` only while one tensor larger than it was in flight alone."""
    device_bytes: int = 0
    """Device copies of submitted batches not yet written (an upper bound: each is freed as soon
    as its transfer is done)."""
    device_peak_bytes: int = 0
    waits: int = 0
    """How many times capture waited for the writer to free a buffer."""
    wait_seconds: float = 0.0

    def summary(self, written: int) -> str:
        mib = 2**20
        return (
            f"{written / mib:.1f} MiB of tensors written; batch buffers peaked at {self.host_peak_bytes / mib:.1f} MiB "
            f"({'pinned' if self.pinned else 'not pinned'}) of {self.bytes_in_flight / mib:.1f} MiB allowed, device "
            f"copies at {self.device_peak_bytes / mib:.1f} MiB; capture waited {self.waits} times "
            f"({self.wait_seconds:.2f} s) for the disk"
        )


def _ceil_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _TensorJob:
    step: int
    tensor_file: str | None
    batch: TensorBatch


@dataclass
class _RecordJob:
    step: int
    first: str | None
    """The name of the first record (what a failed write names)."""
    stacks: str
    columns: pa.RecordBatch | None
