"""Bit-exact verdicts for slots whose records carry a checksum on both sides.

Dumps taken with ``task="checksum"`` (or ``checksum=True``) hold a 64-bit fingerprint of every
tensor's bits (:mod:`torchdebug.checksum`). Two such dumps are compared bit for bit: tolerances do
not apply, a slot passes only when its dtype and fingerprint agree. :func:`judge_checksums` runs
after the tolerance verdicts (:func:`torchdebug.compare.verdicts.judge`) and replaces them for those
slots, per op call in execution order:

* an output whose bits differ while every input's bits agree is **blamed**: this op makes the
  difference (nondeterministic kernel, another algorithm, another library version);
* an input whose bits differ although no earlier output (or input) had that pair of fingerprints is
  **blamed** too: the value comes from outside the captured ops (a parameter, a batch or a state that
  already differs, or an op the dump's filters left out), so the op reading it is named with a
  message that its inputs already differ;
* other differing slots are **inherited** (``warning``): an earlier difference flows into them.

Identical runs therefore give no verdict but ``pass``, and the first divergence
(:func:`~torchdebug.compare.verdicts.first_divergence`) is the first op whose output bits differ
with agreeing inputs, or the first op that reads a value that differs from outside the step.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchdebug.compare.rows import Row
from torchdebug.records import call_name

__all__ = ["judge_checksums"]

_OUTPUT_IO = ("output", "parameter_grad")


def _exact(row: Row) -> bool:
    return (
        row.kind == "tensor"
        and row.record_a is not None
        and row.record_b is not None
        and row.record_a.checksum is not None
        and row.record_b.checksum is not None
        and row.shape_a == row.shape_b
    )


def _fingerprints(row: Row) -> tuple[str, str]:
    return f"{row.dtype_a}:{row.record_a.checksum}", f"{row.dtype_b}:{row.record_b.checksum}"  # type: ignore[union-attr]


def judge_checksums(rows: Sequence[Row]) -> None:
    """Judge bit for bit the rows (of one rank, in execution order) with checksums on both sides."""
    calls: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        if _exact(row):
            calls.setdefault((row.step, call_name(row.name)), []).append(row)
    known: set[tuple[str, str]] = set()  # pairs of differing fingerprints seen so far
    for call_rows in calls.values():
        differing_inputs = False
        for row in call_rows:
            if row.io in _OUTPUT_IO:
                continue
            pair = _fingerprints(row)
            if pair[0] == pair[1]:
                _set(row, "pass", "", "")
                continue
            differing_inputs = True
            if pair in known:
                _set(row, "warning", "inherited", "input bits differ: an earlier op's output already did")
            else:
                known.add(pair)
                _set(row, "error", "blamed", "input bits already differ before this op, and no earlier captured op made them")
        for row in call_rows:
            if row.io not in _OUTPUT_IO:
                continue
            pair = _fingerprints(row)
            if pair[0] == pair[1]:
                _set(row, "pass", "", "")
            elif differing_inputs:
                known.add(pair)
                _set(row, "warning", "inherited", "output bits differ, as its inputs' do")
            else:
                known.add(pair)
                _set(row, "error", "blamed", "output bits differ while all its inputs' bits agree: this op makes the difference")


def _set(row: Row, verdict: str, attribution: str, message: str) -> None:
    row.verdict, row.attribution, row.message = verdict, attribution, message
