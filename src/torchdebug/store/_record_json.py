"""Records as JSON lines: ``torchdebug convert DUMP out.jsonl``, for people who grep, and the JSON
text of the fields a dump's Arrow columns hold as JSON (``value``, ``extra``, ``json_fields``).

About twice as fast as ``json.dumps(record.to_json())``, whose output it equals up to whitespace
(``tests/store`` checks it for every field): the fields are written directly by type. Dumps written
before torchdebug stored records as Arrow columns hold these lines (``records.jsonl``).
"""

from __future__ import annotations

import json
import math
import numbers
import operator
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from torchdebug.records import STAT_KEYS, Record

_STAT_KEYS = set(STAT_KEYS)
_STAT_LABELS = tuple((('{"' if i == 0 else ',"') + key + '":', key) for i, key in enumerate(STAT_KEYS))
"""``(text written before the value, key)`` of each statistic, in ``STAT_KEYS`` order (``{"min":``, ``,"max":``, ...)."""


def _plain(value: Any) -> Any:
    """What ``json`` writes for a value it has no rule for: other integer and real types as numbers
    (numpy scalars), anything else as its string."""
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return str(value)


_FALLBACK = json.JSONEncoder(check_circular=False, separators=(",", ":"), default=_plain)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text: numpy scalars as the numbers they are, any other object
    ``json`` has no rule for as its string."""
    return _FALLBACK.encode(value)


ENCODED_FIELDS = (
    "name",
    "step",
    "rank",
    "phase",
    "module",
    "op",
    "call",
    "seq",
    "io",
    "arg",
    "kind",
    "dtype",
    "shape",
    "stride",
    "device",
    "requires_grad",
    "stats",
    "checksum",
    "tensor",
    "sampled",
    "value",
    "stack",
    "source",
    "fwd",
    "node",
    "capture",
    "capture_error",
    "value_id",
    "version",
    "view_of",
    "extra",
)
"""Every Record field, in the order written (a test checks this matches ``Record``)."""


def _float(value: float) -> str:
    if math.isfinite(value):
        return repr(value)
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _number(value: Any) -> str:
    """A numeric field as JSON: ``null``, an int, a float (non-finite as ``NaN``/``Infinity``),
    ``true``/``false``; another integer or real type (numpy's) as the int or float it is; anything
    else as a JSON string, never as bare text: a shape of ``[2, "s27"]`` (a symbolic size) still
    parses, and says what went wrong. Non-finite floats as Python's ``json`` reads them back."""
    cls = value.__class__
    if cls is int:
        return str(value)
    if cls is float:
        return _float(value)
    if value is None:
        return "null"
    if cls is bool:
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(operator.index(value))
    if isinstance(value, numbers.Real):
        return _float(float(value))
    return _quote(str(value))


def _ints(values: list[int]) -> str:
    for value in values:
        if value.__class__ is not int:
            return "[" + ",".join(map(_number, values)) + "]"
    return "[" + ",".join(map(str, values)) + "]"


def _flat_dict(data: dict[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        text = (
            _quote(value)
            if value.__class__ is str
            else _FALLBACK.encode(value)
            if isinstance(value, (dict, list))
            else _number(value)
        )
        parts.append(_quote(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


def encode_records(records: list[Record]) -> str:
    """The records as JSON lines, one ``\\n``-terminated line each. The description and statistics
    of a tensor are encoded once: records of the same tensor (an op's output, then the next op's
    input) share those objects, looked up by identity (all records of the batch are alive)."""
    memo: dict[int, str] = {}
    return "".join([encode_record(r, memo) + "\n" for r in records])


def encode_record(r: Record, memo: dict[int, str] | None = None) -> str:
    """The record's JSON object on one line (fields holding ``None`` or an empty ``extra`` left out).

    ``memo``: encoded shape, stride and statistics by the identity of their objects, for records of
    one batch that share them (see :func:`encode_records`).
    """
    parts = [
        '{"name":',
        _quote(r.name),
        ',"step":',
        _number(r.step),
        ',"rank":',
        _number(r.rank),
        ',"phase":',
        _quote(r.phase),
        ',"module":',
        _quote(r.module),
        ',"op":',
        _quote(r.op),
        ',"call":',
        _number(r.call),
        ',"seq":',
        _number(r.seq),
        ',"io":',
        _quote(r.io),
        ',"arg":',
        _quote(r.arg),
        ',"kind":',
        _quote(r.kind),
    ]
    if r.dtype is not None:
        parts += (',"dtype":', _quote(r.dtype))
    if r.shape is not None:
        parts += (',"shape":', _ints(r.shape) if memo is None else _memo(memo, r.shape, _ints))
    if r.stride is not None:
        parts += (',"stride":', _ints(r.stride) if memo is None else _memo(memo, r.stride, _ints))
    if r.device is not None:
        parts += (',"device":', _quote(r.device))
    if r.requires_grad is not None:
        parts += (',"requires_grad":', "true" if r.requires_grad else "false")
    if r.stats is not None:
        parts += (',"stats":', _stats(r.stats) if memo is None else _memo(memo, r.stats, _stats))
    if r.checksum is not None:
        parts += (',"checksum":', _quote(r.checksum))
    if r.tensor is not None:
        parts += (',"tensor":', _flat_dict(r.tensor))
    if r.sampled is not None:
        parts += (',"sampled":', _number(r.sampled))
    if r.value is not None:
        parts += (',"value":', _FALLBACK.encode(r.value))
    for key, text in (("stack", r.stack), ("source", r.source), ("fwd", r.fwd), ("node", r.node)):
        if text is not None:
            parts += (',"', key, '":', _quote(text))
    parts += (',"capture":', _quote(r.capture))
    if r.capture_error is not None:
        parts += (',"capture_error":', _quote(r.capture_error))
    for key, number in (("value_id", r.value_id), ("version", r.version), ("view_of", r.view_of)):
        if number is not None:
            parts += (',"', key, '":', _number(number))
    if r.extra:
        parts += (',"extra":', _FALLBACK.encode(r.extra))
    parts.append("}")
    return "".join(parts)


def _memo(memo: dict[int, str], value: Any, encode: Any) -> str:
    text = memo.get(id(value))
    if text is None:
        text = memo[id(value)] = encode(value)
    return text


def _stats(stats: dict[str, Any]) -> str:
    if stats.keys() == _STAT_KEYS:
        return "".join([label + _number(stats[key]) for label, key in _STAT_LABELS]) + "}"
    return _flat_dict(stats)  # not yet filled (an error), written before a statistic existed, or by another tool
