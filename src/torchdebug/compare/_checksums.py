"""Bit-exact verdicts for slots whose records carry a checksum on both sides.

Dumps taken with ``task="checksum"`` (or ``checksum=True``) hold a 64-bit fingerprint of every
tensor's bits (:mod:`torchdebug.checksum`); such slots pass only when dtype and fingerprint agree,
tolerances do not apply. :func:`judge_checksums` runs after the tolerance verdicts and replaces them
for those slots. Dumps of other dtypes or of two fingerprint definitions: docs/compare.md,
"Checksum dumps of different dtypes".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torchdebug.checksum import FINGERPRINT_VERSION, dump_fingerprint_version
from torchdebug.compare._flow import OUTPUT_IO
from torchdebug.compare._judgement import Judgement
from torchdebug.compare._rows import Row
from torchdebug.records import call_name

__all__ = ["judge_checksums", "dtype_note", "fingerprint_versions", "DTYPE_NOTE", "DEFINITIONS_NOTE"]

DTYPE_NOTE = "checksums compare bits"
"""How :func:`dtype_note`'s line starts (the summary puts it first)."""

DEFINITIONS_NOTE = f"{DTYPE_NOTE} only under one definition"
"""How the line starts that :func:`dtype_note` gives when the two dumps' fingerprints differ in
definition (it starts as :data:`DTYPE_NOTE` does, so the summary puts it first too)."""


def fingerprint_versions(dump_a: object, dump_b: object) -> tuple[int, int]:
    """The fingerprint each side's checksums follow, from its rank's manifest (a dump read another way,
    an msprobe dump, has no checksums: it counts as today's)."""
    versions = []
    for dump in (dump_a, dump_b):
        manifest = getattr(dump, "manifest", None)
        versions.append(dump_fingerprint_version(manifest) if isinstance(manifest, dict) else FINGERPRINT_VERSION)
    return versions[0], versions[1]


_DEFINITIONS_MARK = "A's checksums are fingerprint "
"""The start of :func:`_definitions`' text, by which :func:`dtype_note` finds the rows it marked."""


def _definitions(versions: tuple[int, int]) -> str:
    a, b = versions
    return (
        f"A's checksums are fingerprint {a}, B's fingerprint {b}: two definitions give different numbers for the "
        "same bits (dump both with one torchdebug version to compare them bit for bit)"
    )


def _exact(row: Row) -> bool:
    """Whether a row is compared bit for bit: a tensor slot of one shape with a checksum on both sides
    (asked first: a statistics dump has none)."""
    a, b = row.record_a, row.record_b
    return (
        a is not None
        and a.checksum is not None
        and b is not None
        and b.checksum is not None
        and row.kind == "tensor"
        and row.shape_a == row.shape_b
    )


def _fingerprints(row: Row) -> tuple[str, str]:
    """Each side's dtype and checksum (of a slot compared bit for bit)."""
    a, b = row.record_a, row.record_b
    return f"{row.dtype_a}:{a.checksum if a else None}", f"{row.dtype_b}:{b.checksum if b else None}"


def _one_sided(rows: Sequence[Row]) -> set[str]:
    """``a:`` / ``b:`` fingerprints of the values calls only one side runs made (an autocast run's casts)."""
    made = set()
    for row in rows:
        record = row.record_a or row.record_b
        if not row.matched and record is not None and record.checksum and row.io in OUTPUT_IO:
            made.add(f"{'a' if row.record_a is not None else 'b'}:{record.dtype}:{record.checksum}")
    return made


def _with_statistics(row: Row) -> bool:
    return bool(row.record_a and row.record_a.stats and row.record_b and row.record_b.stats)


def _other_dtype(row: Row, why: str) -> Judgement | None:
    """A slot whose bits cannot agree because of the dtypes: its statistics verdict (``None``: the
    tolerance rules compared them), else incomparable."""
    if _with_statistics(row):
        return None
    return Judgement("incomparable", "", f"not comparable: {why}; checksums compare bits")


def _bits(row: Row, verdict: str, attribution: str = "", message: str = "") -> Judgement:
    """A bit-for-bit judgement; an error without a number gets an infinite one (bits differ by an
    amount checksums cannot measure; the message says what differs)."""
    unmeasured = verdict == "error" and row.difference is None
    return Judgement(verdict, attribution, message, difference=math.inf if unmeasured else None)


def _input(row: Row, known: set[tuple[str, str]], from_other_dtype: Callable[[tuple[str, str]], bool]) -> Judgement | None:
    """An input slot's judgement (``None``: its statistics verdict stands)."""
    pair = _fingerprints(row)
    if pair[0] == pair[1]:
        return _bits(row, "pass")
    if row.dtype_a != row.dtype_b:
        return _other_dtype(row, f"dtypes differ ({row.dtype_a} vs {row.dtype_b})")
    if pair in known:
        return _bits(row, "warning", "inherited", "input bits differ: an earlier op's output already did")
    if from_other_dtype(pair):
        return _other_dtype(row, "one side computed this value from another dtype")
    return _bits(row, "error", "blamed", "input bits already differ before this op, and no earlier captured op made them")


def _output(row: Row, differing_inputs: bool, dtype_inputs: bool) -> Judgement | None:
    """An output slot's judgement (``None``: its statistics verdict stands)."""
    pair = _fingerprints(row)
    if pair[0] == pair[1]:
        return _bits(row, "pass")
    if row.dtype_a != row.dtype_b:
        return _other_dtype(row, f"dtypes differ ({row.dtype_a} vs {row.dtype_b})")
    if differing_inputs:
        return _bits(row, "warning", "inherited", "output bits differ, as its inputs' do")
    if dtype_inputs:
        return _other_dtype(row, "computed from inputs of another dtype")
    return _bits(row, "error", "blamed", "output bits differ while all its inputs' bits agree: this op makes the difference")


def judge_checksums(rows: Sequence[Row], versions: tuple[int, int] = (FINGERPRINT_VERSION, FINGERPRINT_VERSION)) -> None:
    """Judge bit for bit the rows (of one rank, in execution order) with checksums on both sides, when
    both sides' checksums follow the same definition (``versions``: :func:`fingerprint_versions`);
    else leave each its statistics verdict, or make it ``incomparable`` where a side has no statistics.

    Per op call: an output whose bits differ while every input's agree is **blamed** (this op makes
    the difference: a nondeterministic kernel, another algorithm or library version); an input whose
    bits differ although no earlier slot had that pair of fingerprints is **blamed** too (the value
    comes from outside the captured ops, and the message says so); other differing slots are
    **inherited**. A slot whose dtype differs, or that one side computed from another dtype, keeps
    its statistics verdict where both records have statistics and is ``incomparable`` otherwise:
    such differences are never blamed (:func:`dtype_note` opens the summary with them)."""
    if versions[0] != versions[1]:
        _other_definitions(rows, versions)
        return
    calls: dict[tuple[int, str], list[Row]] = {}
    for row in rows:
        if _exact(row):
            calls.setdefault((row.step, call_name(row.name)), []).append(row)
    mixed = any(row.dtype_a != row.dtype_b for call_rows in calls.values() for row in call_rows)
    # fingerprints a side holds that come from a dtype the other side does not use
    other: set[str] = _one_sided(rows) if mixed else set()
    known: set[tuple[str, str]] = set()  # pairs of differing fingerprints seen so far

    def from_other_dtype(pair: tuple[str, str]) -> bool:
        return f"a:{pair[0]}" in other or f"b:{pair[1]}" in other

    def taint(pair: tuple[str, str]) -> None:
        other.update((f"a:{pair[0]}", f"b:{pair[1]}"))

    for call_rows in calls.values():
        differing_inputs = dtype_inputs = False
        for row in (row for row in call_rows if row.io not in OUTPUT_IO):
            judgement = _input(row, known, from_other_dtype)
            if _of_the_dtypes(judgement):
                dtype_inputs = True
                taint(_fingerprints(row))
            elif judgement is not None and judgement.attribution:  # bits that differ: later slots holding them inherit
                differing_inputs = True
                known.add(_fingerprints(row))
            if judgement is not None:
                judgement.apply(row)
        for row in (row for row in call_rows if row.io in OUTPUT_IO):
            judgement = _output(row, differing_inputs, dtype_inputs)
            if _of_the_dtypes(judgement):
                taint(_fingerprints(row))
            elif judgement is not None and judgement.attribution:
                known.add(_fingerprints(row))
            if judgement is not None:
                judgement.apply(row)


def _other_definitions(rows: Sequence[Row], versions: tuple[int, int]) -> None:
    """Rows whose checksums follow two definitions: none is judged by them."""
    why = _definitions(versions)
    for row in rows:
        if not _exact(row):
            continue
        if _with_statistics(row):  # the statistics verdict stands; the message says why the bits were not
            note = f"checksums not compared: {why}"
            row.message = f"{row.message}; {note}" if row.message else note
        else:
            Judgement("incomparable", "", f"not comparable: {why}").apply(row)


def _of_the_dtypes(judgement: Judgement | None) -> bool:
    """A judgement of bits that cannot agree because of the dtypes (:func:`_other_dtype`)."""
    return judgement is None or judgement.verdict == "incomparable"


def dtype_note(rows: Sequence[Row]) -> str | None:
    """One line when the rows compared bit for bit hold other dtypes on the two sides, or when the two
    dumps' checksums follow different definitions (``None`` otherwise): the summary opens with it."""
    exact = [row for row in rows if _exact(row)]  # one pass over every row; none in a statistics compare
    definitions = next((row for row in exact if _DEFINITIONS_MARK in (row.message or "")), None)
    if definitions is not None:
        count = len(exact)
        statistics = sum(1 for row in exact if _with_statistics(row))
        reason = definitions.message[definitions.message.index(_DEFINITIONS_MARK) :]
        if statistics == count:
            instead = f"all {count} slots with checksums keep their statistics verdicts"
        elif statistics == 0:
            instead = (
                f"all {count} slots with checksums are 'incomparable' (dump statistics too, checksum=True with "
                'task="statistics", to compare them within tolerance)'
            )
        else:
            instead = f"{statistics} of {count} slots with checksums keep their statistics verdicts, the others are incomparable"
        return f"{DEFINITIONS_NOTE}, and {reason}; so no slot is judged by its checksum: {instead}"
    pairs: dict[tuple[str | None, str | None], int] = {}
    for row in exact:
        if row.dtype_a != row.dtype_b:
            pairs[(row.dtype_a, row.dtype_b)] = pairs.get((row.dtype_a, row.dtype_b), 0) + 1
    if not pairs:
        return None
    (dtype_a, dtype_b), _ = max(pairs.items(), key=lambda item: item[1])
    statistics = any(_with_statistics(row) for row in exact)
    instead = (
        "those slots and the values computed from them keep their statistics verdicts"
        if statistics
        else "those slots and the values computed from them are 'incomparable' (dump statistics too, checksum=True "
        'with task="statistics", to compare them within tolerance)'
    )
    return (
        f"{DTYPE_NOTE}, and A and B hold different dtypes in {sum(pairs.values())} slots (mostly {dtype_a} in A where "
        f"B has {dtype_b}): bits cannot agree across dtypes, so {instead}; nothing is blamed for it"
    )
