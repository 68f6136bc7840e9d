"""Rerun one recorded op call in float64 on the CPU, from the records of its inputs.

With ``task="tensor"`` the input records of a call hold every argument; :func:`run_op` rebuilds and
runs it, :func:`own_errors` measures what the op made of its own inputs (``own_err``) against how
much a healthy CPU kernel of its dtype rounds on them (``kernel_err``), and a call that cannot be
rerun raises :class:`NotRerunnable` with the reason. What users see: docs/compare.md, "Rerun".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchdebug._torch.dispatch import op_schema
from torchdebug.compare._metrics import tensor_metrics
from torchdebug.compare._tolerances import rounding_tolerance
from torchdebug.records import MODULE_OP, Record

__all__ = ["NotRerunnable", "output_at", "own_errors", "rebuild", "resolve", "run_op"]

_RANDOM = re.compile(r"dropout|rand|bernoulli|normal|uniform|exponential|multinomial|poisson|cauchy|geometric")
"""Ops whose result is drawn from a random generator (some lack the ``nondeterministic_seeded`` tag)."""

_UNDEFINED = re.compile(r"empty|resize|as_strided|_reshape_alias|^set_$")
"""Ops whose result is uninitialised memory (``empty*``, the new part of ``resize_``) or depends on
where their inputs lie in memory (``as_strided*``, ``_reshape_alias``, whose strides the native path
records where a dispatch mode sees a ``view``; ``set_``), which the dump does not keep."""

_SCHEMA_TYPES = re.compile(r"^(?:Optional|List)\[(.*)\]$")

_ENUMS = {"ScalarType": torch.dtype, "Layout": torch.layout, "MemoryFormat": torch.memory_format}
"""Argument types recorded as text naming a torch attribute: ``float32``, ``torch.strided``."""


class NotRerunnable(Exception):
    """A call that cannot be rerun; the message says why: module records, ops outside ``aten``, ops
    with random or undefined results (schema tag ``nondeterministic_seeded``, ``dropout``, ``rand*``,
    ``bernoulli``, ``normal``, ``empty*``), ops whose result depends on their inputs' memory layout
    (``as_strided``, ``_reshape_alias``), an input not captured, not saved or saved as a sample, a value cut short by
    capture (text ending in ``...``) or not rebuildable from its text, and ops that raise on the
    rebuilt arguments."""


def resolve(op: str) -> Any:
    """The aten op overload named ``aten.<name>.<overload>``, if its result can be reproduced."""
    parts = op.split(".")
    if op == MODULE_OP or len(parts) != 3 or parts[0] != "aten":
        raise NotRerunnable(f"{op}: not an aten op")
    name, overload = parts[1], parts[2]
    found = getattr(getattr(torch.ops.aten, name, None), overload, None)
    if found is None or getattr(found, "_schema", None) is None:
        raise NotRerunnable(f"{op}: no such aten op in this torch")
    if torch.Tag.nondeterministic_seeded in found.tags or _RANDOM.search(name):
        raise NotRerunnable(f"{op}: random results")
    if _UNDEFINED.search(name):
        raise NotRerunnable(f"{op}: result depends on memory, not on values")
    return found


def _base_type(arg: torch.Argument) -> str:
    """``ScalarType`` for ``ScalarType?``, ``int`` for ``int[]``, ``Tensor`` for ``Tensor?[]``."""
    text = str(getattr(arg, "real_type", arg.type))
    while (inner := _SCHEMA_TYPES.match(text)) is not None:
        text = inner.group(1)
    return text


def _from_json(value: Any, kind: str, where: str) -> Any:
    """A recorded non-tensor value as the op expects it (lists element by element)."""
    if isinstance(value, list):
        return [_from_json(item, kind, where) for item in value]
    if not isinstance(value, str):
        return value
    if value.endswith("..."):
        raise NotRerunnable(f"{where}: value cut short by capture")
    if kind == "str":
        return value
    if kind == "Device":
        return torch.device("cpu")
    enum = _ENUMS.get(kind)
    converted = getattr(torch, value.removeprefix("torch."), None) if enum is not None else None
    if enum is None or converted is None or not isinstance(converted, enum):
        raise NotRerunnable(f"{where}: cannot rebuild {kind} from {value!r}")
    return converted


def _upcast(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy, floating in float64 and complex in complex128."""
    if tensor.is_complex():
        dtype = torch.complex128
    elif tensor.is_floating_point():
        dtype = torch.float64
    else:
        dtype = tensor.dtype
    return tensor.to("cpu", dtype, memory_format=torch.contiguous_format, copy=True)


def _as_recorded(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy in the recorded dtype."""
    return tensor.to("cpu", memory_format=torch.contiguous_format, copy=True)


def _tensor(record: Record, load: Callable[[Record], torch.Tensor], exact: bool) -> torch.Tensor:
    """A saved input tensor, upcast (see :func:`_upcast`) when ``exact``, else as recorded (on the
    CPU); not rerunnable unless saved whole."""
    if record.capture_error:
        raise NotRerunnable(f"{record.name}: not captured ({record.capture_error})")
    if not record.tensor or "file" not in record.tensor:
        raise NotRerunnable(f"{record.name}: tensor not saved")
    if record.sampled:
        raise NotRerunnable(f"{record.name}: only a sample was saved")
    return (_upcast if exact else _as_recorded)(load(record))


def _place(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """Put ``value`` at ``path`` (list indices) in nested dicts, made into lists by :func:`_lists`."""
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _lists(node: Any, where: str) -> Any:
    """Nested ``{"0": ..., "1": ...}`` dicts as lists; a missing element means a missing input."""
    if not isinstance(node, dict):
        return node
    if set(node) != {str(i) for i in range(len(node))}:
        raise NotRerunnable(f"{where}: list elements missing from the records")
    return [_lists(node[str(i)], f"{where}.{i}") for i in range(len(node))]


def rebuild(op: Any, inputs: Sequence[Record], load: Callable[[Record], torch.Tensor], exact: bool = True) -> tuple[list, dict]:
    """Positional and keyword arguments of a call from its input records (see the module docstring;
    ``exact``: floating tensors upcast, else in their recorded dtypes)."""
    schema = op_schema(op)
    arguments = schema.arguments
    positional = [arg for arg in arguments if not arg.kwarg_only]
    keywords = {arg.name: arg for arg in arguments if arg.kwarg_only}
    tops: dict[str, Any] = {}
    for record in inputs:
        path = record.arg.split(".")
        top = path[0]
        schema_arg = positional[int(top)] if top.isdigit() and int(top) < len(positional) else keywords.get(top)
        if schema_arg is None:
            raise NotRerunnable(f"{record.name}: no argument {top!r} in {schema.name}")
        if record.kind == "tensor":
            value = _tensor(record, load, exact)
        else:
            value = _from_json(record.value, _base_type(schema_arg), record.name)
        _place(tops, [top, *path[1:]], value)
    count = sum(1 for key in tops if key.isdigit())
    needed = positional[count:] + list(keywords.values())
    missing = [arg.name for arg in needed if arg.name not in tops and not arg.has_default_value()]
    if missing or any(str(index) not in tops for index in range(count)):
        raise NotRerunnable(f"{schema.name}: inputs missing from the records ({', '.join(missing) or 'a gap'})")
    args = [_lists(tops[str(index)], str(index)) for index in range(count)]
    kwargs = {key: _lists(value, key) for key, value in tops.items() if not key.isdigit()}
    return args, kwargs


def run_op(op: str, inputs: Sequence[Record], load: Callable[[Record], torch.Tensor], exact: bool = True) -> Any:
    """Run the call of ``op`` recorded in ``inputs`` in float64 on the CPU (``exact=False``: in the
    recorded dtypes, as a CPU kernel of those dtypes would); ``load`` reads a record's saved tensor.
    Returns what the op returns. Arguments come from their slot paths (``0``, ``1.2`` for the third
    element of a list in the second argument, ``alpha`` for a keyword); JSON values become torch
    types by the op's schema (every device the CPU); floating tensors are upcast (integer and bool
    keep their dtype) and run as contiguous copies, so an in-place op changes nothing it was given."""
    overload = resolve(op)
    if not inputs:
        raise NotRerunnable(f"{op}: no input records")
    args, kwargs = rebuild(overload, inputs, load, exact)
    try:
        return overload(*args, **kwargs)
    except Exception as error:  # any kernel refusal (dtype, device, shape) means: not rerunnable
        raise NotRerunnable(f"{op}: raised {type(error).__name__} on the rebuilt arguments") from None


def output_at(result: Any, arg: str) -> Any:
    """The output slot ``arg`` (``0``, ``1``, ``0.2``) of what an op returned; ``None`` if absent."""
    value = result if isinstance(result, (list, tuple)) else (result,)
    for part in arg.split("."):
        if not (isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value)):
            return None
        value = value[int(part)]
    return value


def own_errors(
    records: Sequence[Record], load: Callable[[Record], torch.Tensor], atol: Callable[[str], float]
) -> dict[str, dict[str, float]]:
    """``{output slot: {"own_err": …, "kernel_err": …}}`` for the floating outputs, saved whole, of one
    recorded call (its input and output records): each output's scale-relative ``error`` (see
    :mod:`torchdebug.compare._metrics`, ``atol(dtype)`` the floor of the scale) against the call
    rerun in float64, and that of the call re-run as recorded on the CPU against the same rerun
    (absent when that kernel refuses the inputs, say a dtype the CPU lacks, and not run when every
    own error is within one rounding unit: healthy whatever the kernel does). Raises
    :class:`NotRerunnable` when the call cannot be rerun."""

    def error(value: torch.Tensor, exact_value: torch.Tensor, record: Record) -> float:
        return tensor_metrics(value, exact_value, low_dtype=record.dtype, atol=atol(record.dtype or ""))["error"]

    inputs = [record for record in records if record.io == "input"]
    exact = run_op(records[0].op, inputs, load)
    outputs: dict[str, tuple[Record, torch.Tensor]] = {}
    errors: dict[str, dict[str, float]] = {}
    roundings: dict[str, float] = {}
    for record in records:
        saved = "file" in (record.tensor or {}) and not record.sampled
        exact_value = output_at(exact, record.arg) if record.io == "output" and saved else None
        rounding = rounding_tolerance(record.dtype)
        if rounding is None or not isinstance(exact_value, torch.Tensor) or list(exact_value.shape) != record.shape:
            continue
        outputs[record.arg] = record, exact_value
        errors[record.arg] = {"own_err": error(load(record), exact_value, record)}
        roundings[record.arg] = rounding
    if not any(errors[arg]["own_err"] > roundings[arg] for arg in outputs):
        return errors
    try:
        kernel = run_op(records[0].op, inputs, load, exact=False)
    except NotRerunnable:
        return errors
    for arg, (record, exact_value) in outputs.items():
        kernel_value = output_at(kernel, arg)
        if (
            isinstance(kernel_value, torch.Tensor)
            and list(kernel_value.shape) == record.shape
            and str(kernel_value.dtype) == f"torch.{record.dtype}"
        ):
            errors[arg]["kernel_err"] = error(kernel_value, exact_value, record)
    return errors
