"""Which differences say nothing about either run: the data differs, or a constant follows the dtype.

Two cases make a matched pair of slots differ by design, and compare must not call them errors: the
runs' inputs differ (micro-batches against one batch, another sequence length, another world size:
:class:`DataShapes`), or a constant was made for the dtype (``torch.finfo(dtype).min`` as an
attention bias: :func:`dtype_constants`). The rules: docs/compare.md, "Runs whose inputs differ".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction

from torchdebug.compare._rows import Row
from torchdebug.compare._value_graph import identity
from torchdebug.records import Record

__all__ = ["DataShapes", "data_records", "dtype_constants", "dtype_argument", "parameter_values"]

_INTEGRAL = ("int", "uint", "bool")
_OUTPUTS = ("output", "parameter_grad")


def parameter_values(records: Iterable[Record]) -> set[tuple]:
    """Identities (:func:`~torchdebug.compare._matching.identity`) of the values a dump shows to be
    parameters or optimizer state: the optimizer step's inputs, module ``parameter`` records and
    slots recorded with ``requires_grad``."""
    found = set()
    for record in records:
        if record.phase == "optimizer" and record.io == "input" or record.io == "parameter" or record.requires_grad:
            value = identity(record)
            if value is not None:
                found.add(value)
    return found


def _integral(record: Record) -> bool:
    return (record.dtype or "").startswith(_INTEGRAL)


def data_records(ordered: Sequence[Record], made_by: Mapping[int, tuple[str, str]]) -> tuple[set[int], set[int]]:
    """``id``\\ s of one side's records (in execution order) that hold its data — forward inputs no
    captured op made that are not parameters, and values computed from them alone — and of those that
    hold a parameter (or optimizer state)."""
    parameters = parameter_values(ordered)
    held = {id(record) for record in ordered if identity(record) in parameters} if parameters else set()
    data_outputs: set[tuple[int, str, str]] = set()  # (step, call, slot) of outputs holding data
    found: set[int] = set()
    calls: dict[tuple[int, str], list[Record]] = {}
    for record in ordered:
        if record.kind == "tensor":
            calls.setdefault((record.step, record.call_name), []).append(record)
    for (step, call), records in calls.items():
        inputs = [r for r in records if r.io == "input"]
        for record in inputs:
            link = made_by.get(id(record))
            if link is None:
                leaf = (
                    record.phase == "forward"
                    and not record.requires_grad
                    and identity(record) not in parameters
                    and (bool(parameters) or _integral(record))
                )
                if leaf:
                    found.add(id(record))
            elif (step, *link) in data_outputs:
                found.add(id(record))
        if inputs and all(id(r) in found for r in inputs):
            for record in records:
                if record.io in _OUTPUTS:
                    found.add(id(record))
                    data_outputs.add((step, call, record.name[len(call) + 1 :]))
    return found, held


def _ratios(shape_a: Sequence[int], shape_b: Sequence[int]) -> list[Fraction] | None:
    """How each differing dimension changes from A to B (``None``: other ranks, or an empty size)."""
    if len(shape_a) != len(shape_b):
        return None
    out = []
    for size_a, size_b in zip(shape_a, shape_b):
        if size_a != size_b:
            if size_a <= 0 or size_b <= 0:
                return None
            out.append(Fraction(size_b, size_a))
    return out


class DataShapes:
    """Where one rank's shapes differ because the runs' inputs do.

    A shape difference is put down to the inputs when it starts at the data: a **data input** (a
    forward input slot no captured op made that is not a parameter: not read by the optimizer step,
    not a module's ``parameter`` record, not ``requires_grad``) whose shape differs, or a value
    computed from data inputs alone cut to other shapes (a micro-batch's ``split``, ``slice``,
    ``chunk``). The sizes that change there (2 → 8, ratio 4) also explain a shape elsewhere that
    differs by the same ratios only (``ones(batch, seq)``, a class token expanded to the batch),
    unless it holds a parameter. Without parameter evidence in the dump (no optimizer step, no
    module records) only integer and bool inputs count as data. Another world size splits the data
    between ranks: sizes that change by the ratio of the world sizes follow the data too
    (``split``)."""

    def __init__(
        self,
        rows: Sequence,
        data: Mapping[str, set[int]],
        made_by: Mapping[int, tuple[str, str]],
        parameters: Collection[int] = (),
        split: Fraction | None = None,
    ) -> None:
        self.split = split
        """World size of A over B when they differ (data parallelism: each rank holds its share of
        the batch, so sizes change by that ratio even where no data input shows it: a graph dump
        of compiled blocks holds no tokens)."""
        self.parameters = set(parameters)
        """``id``\\ s of records holding a parameter or optimizer state: their shapes never follow the data."""
        self.origins: dict[int, str] = {}
        """``id(row)`` → why its shape differs, for the rows where a data difference starts."""
        ratios: set[Fraction] = set()
        for row in rows:
            a, b = row.record_a, row.record_b
            if a is None or b is None or row.kind != "tensor" or row.shape_a == row.shape_b:
                continue
            if id(a) not in data["a"] or id(b) not in data["b"]:
                continue
            changes = _ratios(row.shape_a or (), row.shape_b or ())
            if row.io == "input" and id(a) not in made_by and id(b) not in made_by:
                self.origins[id(row)] = "the runs' data inputs differ in shape"
            elif row.io in _OUTPUTS:
                self.origins[id(row)] = "made from the runs' data alone, cut to other shapes: the runs' inputs differ"
            else:
                continue
            ratios.update(changes or ())
        if split is not None:
            ratios.add(split)
        self.ratios = ratios | {r * s for r in ratios for s in ratios}
        """How sizes change where the data differs, and products of two (batch and sequence flattened)."""

    def origin(self, row: object) -> str | None:
        """Why ``row``'s shape differs, when a data difference starts there."""
        return self.origins.get(id(row))

    def follows_data(self, row: Row) -> str | None:
        """Why ``row``'s shape differs when every size that differs changes as the data's do."""
        if not self.ratios or id(row.record_a) in self.parameters or id(row.record_b) in self.parameters:
            return None
        changes = _ratios(row.shape_a or (), row.shape_b or ())
        if not changes or any(change not in self.ratios for change in changes):
            return None
        if self.split is not None and all(change == self.split for change in changes):
            ratio = f"{self.split.numerator}:{self.split.denominator}"
            return f"its sizes differ as the runs' world sizes do ({ratio}): each rank holds its share of the data"
        return "its sizes change as the runs' data inputs do"


@functools.cache
def _finfo_values() -> dict[float, list[tuple[str, str]]]:
    """Every floating dtype's ``finfo`` constants: value → ``[(dtype, attribute)]``."""
    import torch

    table: dict[float, list[tuple[str, str]]] = {}
    for name in ("float16", "bfloat16", "float32", "float64"):
        info = torch.finfo(getattr(torch, name))
        for attribute in ("min", "max", "eps", "tiny"):
            table.setdefault(float(getattr(info, attribute)), []).append((name, attribute))
    return table


def _constant_pair(value_a: object, value_b: object) -> str | None:
    """``torch.finfo(torch.bfloat16).min vs torch.finfo(torch.float32).min`` when two numbers are one
    ``finfo`` attribute of two different dtypes."""
    if isinstance(value_a, bool) or isinstance(value_b, bool):
        return None
    if not isinstance(value_a, (int, float)) or not isinstance(value_b, (int, float)) or value_a == value_b:
        return None
    table = _finfo_values()
    for dtype_a, attribute_a in table.get(float(value_a), ()):
        for dtype_b, attribute_b in table.get(float(value_b), ()):
            if attribute_a == attribute_b and dtype_a != dtype_b:
                return f"torch.finfo(torch.{dtype_a}).{attribute_a} vs torch.finfo(torch.{dtype_b}).{attribute_b}"
    return None


_DTYPE_NAMES = frozenset(
    f"{prefix}{name}"
    for prefix in ("", "torch.")
    for name in ("float16", "bfloat16", "float32", "float64", "half", "float", "double")
)


def dtype_argument(value_a: object, value_b: object) -> str | None:
    """What differs, when two argument values differ only because the runs' dtypes do: two floating
    dtype names, or one ``finfo`` constant of two dtypes (``None`` otherwise)."""
    if isinstance(value_a, str) and isinstance(value_b, str):
        if value_a != value_b and value_a in _DTYPE_NAMES and value_b in _DTYPE_NAMES:
            return f"dtype {value_a} vs {value_b}"
        return None
    return _constant_pair(value_a, value_b)


def _single_value(record: Record | None) -> float | None:
    """The one value a slot holds, from its statistics (``min == max``)."""
    stats = (record.stats if record is not None else None) or {}
    low, high = stats.get("min"), stats.get("max")
    if isinstance(low, (int, float)) and low == high and math.isfinite(low):
        return float(low)
    return None


def dtype_constants(row: Row) -> str | None:
    """What differs, when both sides of a tensor row hold one value each and the two are one
    ``finfo`` constant of two dtypes (``torch.finfo(torch.bfloat16).min vs ...``)."""
    return _constant_pair(_single_value(row.record_a), _single_value(row.record_b))
