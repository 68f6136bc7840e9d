"""The record model: one record per tensor slot.

A *slot* is one input or output of one op call (or of one module call), in one phase of one step on
one rank. Eager capture and compiled-graph capture both write records; the store persists them as
Arrow columns (``torchdebug.store._record_columns``); compare aligns two sets of them by ``name``.
The fields are documented for users in ``docs/format.md``; bump ``SCHEMA_VERSION`` when their
meaning or the records file's encoding changes (an older torchdebug then refuses the dump by name).

The stable name is built from the fields that do not depend on timing or memory addresses::

    {phase}/{module}/{op}#{call}/{io}[.{arg}]
    forward/layers.0.attn.q_proj/aten.addmm.default#0/output.0
    backward/layers.0.mlp/aten.mm.default#3/input.1
    forward/layers.0.attn/module#0/parameter.q_proj.weight

``module`` is the module path relative to the model given to the debugger (``-`` outside any module
or when no model is given), ``call`` counts calls of that op in that module and phase within the
step, so two runs of the same program produce the same names.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from torchdebug.stats import STAT_KEYS

__all__ = [
    "ALLOCATIONS",
    "COLLECTIVES",
    "LOSS_OP",
    "LOSS_SCALE_OP",
    "MODULE_OP",
    "NEVER_MATERIALISED",
    "NO_MODULE",
    "PHASES",
    "READ_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "STAT_KEYS",
    "UNINITIALISED",
    "UNREAD",
    "Record",
    "allocates",
    "call_name",
    "make_call_name",
    "make_name",
    "module_of",
    "split_call_name",
]

SCHEMA_VERSION = 2
"""The schema version of the dumps this torchdebug writes: 2 stores repeating strings dictionary-encoded
and LZ4-compressed, 1 plain and zstd-compressed (the same fields)."""
READ_SCHEMA_VERSIONS = (1, 2)
"""The schema versions this torchdebug reads."""

PHASES = ("forward", "backward", "optimizer")
"""Where in a training step the slot was seen. ``optimizer`` covers ops run by ``optimizer.step()``."""

MODULE_OP = "module"
"""The ``op`` of module-level records (nn.Module inputs, outputs, parameters, parameter grads)."""

LOSS_OP = "monitor.loss"
"""The ``op`` of the loss the flight recorder keeps per step (``forward/-/monitor.loss#0/output``)."""

LOSS_SCALE_OP = "monitor.loss_scale"
"""The ``op`` of the loss scale the flight recorder keeps per step under a ``GradScaler``
(``backward/-/monitor.loss_scale#0/output``): the scale the step's gradients were made with."""

NO_MODULE = "-"
"""The module path shown in names for ops outside every tracked module."""

UNINITIALISED = "uninitialised"
"""The :data:`UNREAD` reason of an allocation's output, of a kernel's workspace for its backward (an
RNN's reserve: partly never written), and of the views and reads of either before anything wrote it."""

NEVER_MATERIALISED = "never materialised"
"""The :data:`UNREAD` reason of a graph dump's output slot that the graph never uses (one output
of a multi-output op, a ``split`` chunk another rank holds): the compiled code never computes it."""

UNREAD = "unread"
"""The ``extra`` key of a tensor record whose values were not read, and why: ``uninitialised`` (an
allocation's output, :data:`ALLOCATIONS`), ``overwritten`` (an argument the op writes without
reading: an ``out=`` buffer, a collective's output tensor, ``copy_``'s destination), ``partly
written`` (FSDP2's all-gather buffer after its copy-in, which the all-gather fills) or ``never
materialised`` (:data:`NEVER_MATERIALISED`)."""


def layout_not_captured(layout: object) -> str:
    """The ``capture_error`` of a tensor whose layout has no strides (``torch.sparse_coo``, ...):
    its dtype, shape and device are recorded, its values are not read."""
    return f"layout {layout} is not captured"


STATS_NOT_TAKEN = "statistics not taken: reading the tensor failed (the log says why)"
"""The ``capture_error`` of a tensor whose statistics a fault of the capture's own left untaken
(device memory, a kernel that does not build): the step went on."""


COLLECTIVES = ("c10d.", "_c10d_functional.")
"""Op name prefixes of torch.distributed's collectives (``c10d.allreduce_.default``, functional
``_c10d_functional.all_reduce.default``): their outputs hold other ranks' values."""

ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"})
"""Ops (by name, without namespace and overload) whose output holds whatever the memory held until
the next op writes it (FSDP2's all-gather buffers, a traced dropout's mask): no value of it was
computed, so none is read. Read, it held garbage: NaN after a NaN step had freed that memory, so it
was named the origin of the NaN, and two identical runs differed there."""


@functools.cache  # one answer per op name: capture asks once per call
def allocates(op: str) -> bool:
    """Whether ``op`` (``aten.empty.memory_format``, or a bare name such as ``empty_like``) is one of
    :data:`ALLOCATIONS`."""
    namespace, _, rest = op.partition(".")
    return (rest.partition(".")[0] if rest else namespace) in ALLOCATIONS


def make_name(phase: str, module: str, op: str, call: int, io: str, arg: str) -> str:
    """The stable name of a slot (see the module docstring)."""
    if arg:  # one f-string per name: this runs for every captured slot
        return f"{phase}/{module or NO_MODULE}/{op}#{call}/{io}.{arg}"
    return f"{phase}/{module or NO_MODULE}/{op}#{call}/{io}"


def make_call_name(phase: str, module: str, op: str, call: int) -> str:
    """The name of one op or module call: a slot's stable name without its ``/io.arg`` part."""
    return f"{phase}/{module or NO_MODULE}/{op}#{call}"


def split_call_name(name: str) -> tuple[str, str]:
    """A stable name cut into its call name and its slot: ``(forward/m/aten.mm.default#0, output.0)``."""
    cut = name.rfind("/")
    return (name[:cut], name[cut + 1 :]) if cut >= 0 else (name, name)


def module_of(name: str) -> str:
    """The module path of a stable name (``layers.1.mlp`` of ``forward/layers.1.mlp/module#0/output``)."""
    return name.split("/", 2)[1]


def call_name(name: str) -> str:
    """The name of the op call a slot belongs to: the stable name without its ``/io.arg`` part."""
    cut = name.rfind("/")
    return name[:cut] if cut >= 0 else name


@dataclass(slots=True)
class Record:
    """One tensor slot (or one non-tensor argument) of one op or module call.

    Non-tensor arguments (ints, floats, dtypes, strings, ``None``) are recorded as ``value`` with
    ``kind == "value"``; tensors carry dtype, shape, device and, depending on the task, ``stats``
    and a ``tensor`` reference ``{"file": ..., "key": ...}`` into a safetensors file of the rank
    folder.
    """

    name: str
    step: int
    rank: int
    phase: str
    module: str
    op: str
    call: int
    seq: int
    """Execution order of the op call within the step (shared by all slots of one call)."""
    io: str
    arg: str
    """Argument path: ``0`` for the first positional argument, ``1.2`` for the third element of a
    list in the second, ``alpha`` for a keyword argument; output index for outputs."""
    kind: str = "tensor"
    """``tensor`` or ``value``."""
    dtype: str | None = None
    shape: list[int] | None = None
    stride: list[int] | None = None
    device: str | None = None
    requires_grad: bool | None = None
    stats: dict[str, float | int | None] | None = None
    """Keyed by ``STAT_KEYS`` (declared in ``torchdebug.stats._schema``); a statistic added after the
    record was written is missing from it, and reads as unknown (``stats.get(key)`` is ``None``)."""
    checksum: str | None = None
    """64-bit fingerprint of the tensor's bytes as 16 hex digits (``task="checksum"`` or ``checksum=True``,
    see ``torchdebug.checksum``): equal bits give equal checksums on every device."""
    tensor: dict[str, str] | None = None
    sampled: int | None = None
    """When tensor sampling is on: the sampling stride used (the saved tensor is a 1-D sample)."""
    value: Any = None
    stack: str | None = None
    """Key into the rank folder's ``stacks.json`` (deduplicated call stacks)."""
    source: str | None = None
    """The innermost user source line, ``file:line in function``, for quick display."""
    fwd: str | None = None
    """For backward records: the call name of the forward op whose gradient this op computes."""
    node: str | None = None
    """FX node name, for records captured inside compiled graphs."""
    capture: str = "eager"
    """Who wrote the record: ``eager`` (dispatch mode) or ``graph`` (compiled-graph capture)."""
    capture_error: str | None = None
    """Why this slot could not be captured, when it could not (``error`` in dumps of torchdebug 0.1)."""
    value_id: int | None = None
    """Which tensor the slot holds: the same id in every slot holding the same tensor object, unique
    within the rank's run (eager capture, ``torchdebug.capture.value_ids`` or the native path's walk;
    graph dumps, from the compiled graph's nodes and across graphs; ``None`` in msprobe dumps and
    dumps written before). An op's output gets a new id, an in-place op's output
    keeps the id of the tensor it wrote, a view gets its own (``view_of`` names its memory)."""
    version: int | None = None
    """The tensor's in-place version when captured (an in-place op's output: the version it leaves).
    ``(value_id, version)`` is one value: the op that made it is the first output slot holding it."""
    view_of: int | None = None
    """For a view, the ``value_id`` of the tensor whose memory it shares (the first one, for views of
    views); ``None`` for a tensor that is no view. A write through any view moves all their versions."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of other tools or of later versions. Records read from a dump share their containers
    (equal ``stats``, ``shape`` and ``stride``, and one empty ``extra``, as a capture shares them
    between the records of one tensor): give a record other ones by replacing them
    (:func:`dataclasses.replace`), never by updating them in place."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict without the fields that hold their default empty value."""
        out = {}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if not self.extra:
            del out["extra"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """Build a record from a dict written by :meth:`to_json`; unknown keys go to ``extra``."""
        if "error" in data and "capture_error" not in data:  # the field's name in torchdebug 0.1 dumps
            data = {**data, "capture_error": data["error"]}
            del data["error"]
        if data.keys() <= _FIELD_SET:
            return cls(**data)
        kwargs = {k: v for k, v in data.items() if k in _FIELD_SET}
        unknown = {k: v for k, v in data.items() if k not in _FIELD_SET}
        if unknown:
            kwargs.setdefault("extra", {})
            kwargs["extra"] = {**kwargs["extra"], **unknown}
        return cls(**kwargs)

    @property
    def call_name(self) -> str:
        """The name of the op call this slot belongs to."""
        return call_name(self.name)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Record))
_FIELD_SET = frozenset(_FIELD_NAMES)
