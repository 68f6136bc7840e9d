"""The rows of a cross-rank check, kept per slot: the reference, and only the ranks that differ or lack it.

::

    rows = RankRows(ranks=[0, 1, 2, 3], slots=[SlotRows(reference, 0, 0.0, {2: row_of_rank_2}, frozenset())])
    len(rows)          # 4: a row per slot and rank
    rows[1]            # rank 1's row: made now, its records the reference's
    rows.counts(2)     # verdicts of rank 2's rows, without making them

A cross-rank check has a row per slot and rank, but every rank holding the reference value has the
same row but for its rank (its records are the reference's, its verdict ``pass``). Those rows are
made when they are read, not kept: per slot :class:`SlotRows` keeps the reference record, the rows
of the ranks that differ (their metrics and verdicts are their own) and the ranks that lack the
slot. The memory of a result grows with the slots and the ranks that differ, not with the ranks
that agree; its counts, phases and first divergence come from what is kept. A report that passes
over the rows many times makes them once, inside :meth:`RankRows.made`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, overload

from torchdebug.compare._judgement import Judgement
from torchdebug.compare._rows import VERDICTS, Row
from torchdebug.records import Record

__all__ = ["SlotRows", "RankRows"]

_REFERENCE = Judgement("pass", "", "reference", difference=0.0)
_AGREES = Judgement("pass", "", "", difference=0.0)
"""The judgements of the rows of ranks holding the reference value (made once: these rows are made on every read)."""
_NOT_JUDGED = ("incomparable", "unmatched")
"""Verdicts of rows that are counted apart from the compared ones."""


@dataclass(frozen=True, slots=True)
class SlotRows:
    """One slot of the check: its reference record (held by the ranks of the reference value, the
    lowest of them ``reference_rank``), its place in execution order, the rows of the ranks holding
    another value, and the ranks without the slot."""

    reference: Record
    reference_rank: int
    order: float
    differing: dict[int, Row]
    missing: frozenset[int]

    def row(self, rank: int) -> Row:
        """The row of ``rank``: its kept row where it differs, else made now."""
        row = self.differing.get(rank)
        if row is not None:
            return row
        if rank in self.missing:
            row = Row.from_records(rank, None, self.reference, "only_b", self.order)
            Judgement("unmatched", "", f"not on rank {rank}").apply(row)
            return row
        row = Row.from_records(rank, self.reference, self.reference, "exact", self.order)
        (_REFERENCE if rank == self.reference_rank else _AGREES).apply(row)
        return row


class RankRows(Sequence[Row]):
    """Every row of a cross-rank check, slot by slot in execution order and, within a slot, rank by
    rank (the order of ``ranks``)."""

    def __init__(self, ranks: Sequence[int], slots: Sequence[SlotRows]) -> None:
        self.ranks = list(ranks)
        self.slots = list(slots)
        self._made: list[Row] | None = None

    def __len__(self) -> int:
        return len(self.slots) * len(self.ranks)

    @overload
    def __getitem__(self, index: int) -> Row: ...
    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...
    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if self._made is not None:
            return self._made[index]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("row index out of range")
        slot, rank = divmod(index, len(self.ranks))
        return self.slots[slot].row(self.ranks[rank])

    def __iter__(self) -> Iterator[Row]:
        if self._made is not None:
            yield from self._made
            return
        for slot in self.slots:
            for rank in self.ranks:
                yield slot.row(rank)

    def __repr__(self) -> str:
        return f"RankRows({len(self.slots)} slots x {len(self.ranks)} ranks, {len(self.differing)} rows that differ)"

    @contextmanager
    def made(self) -> Iterator[None]:
        """Inside the block, every row is made once and kept (for a report that passes over them many times)."""
        if self._made is not None:
            yield
            return
        self._made = list(self)
        try:
            yield
        finally:
            self._made = None

    def of_rank(self, rank: int) -> Sequence[Row]:
        """The rows of one rank, slot by slot (made when read)."""
        return _OneRank(self.slots, rank)

    @cached_property
    def differing(self) -> list[Row]:
        """The kept rows (ranks holding another value than the reference), by execution order, then rank."""
        return sorted((row for slot in self.slots for row in slot.differing.values()), key=lambda row: (row.order, row.rank))

    def distinct(self) -> list[Row]:
        """A row for every record the rows hold: each slot's reference rank's, then the kept ones."""
        return [slot.row(slot.reference_rank) for slot in self.slots] + self.differing

    @cached_property
    def _set_apart(self) -> dict[int, Counter[str]]:
        """Per rank, the verdicts of its rows that are not the reference's: kept, and ``unmatched``."""
        found: dict[int, Counter[str]] = {rank: Counter() for rank in self.ranks}
        for slot in self.slots:
            for rank in slot.missing:
                found[rank]["unmatched"] += 1
            for rank, row in slot.differing.items():
                found[rank][row.verdict] += 1
        return found

    def counts(self, rank: int | None = None) -> Counter[str]:
        """Rows per verdict, of every rank or of one, counted without making the rows."""
        counts: Counter[str] = Counter()
        for each in self.ranks if rank is None else [rank] if rank in self._set_apart else []:
            apart = self._set_apart[each]
            counts.update(apart)
            counts["pass"] += len(self.slots) - sum(apart.values())
        return counts

    def phases(self) -> dict[str, dict[str, Any]]:
        """:meth:`~torchdebug.compare._result.CompareResult.phases`, counted without making the rows."""
        found: dict[str, Counter[str]] = {}
        for slot in self.slots:
            verdicts = found.setdefault(slot.reference.phase, Counter())
            verdicts["pass"] += len(self.ranks) - len(slot.differing) - len(slot.missing)
            verdicts["unmatched"] += len(slot.missing)
            verdicts.update(row.verdict for row in slot.differing.values())
        out = {}
        for phase, verdicts in found.items():
            judged = [verdict for verdict in VERDICTS if verdict not in _NOT_JUDGED and verdicts[verdict]]
            out[phase] = {
                "compared": sum(verdicts[verdict] for verdict in judged),
                "incomparable": verdicts["incomparable"],
                "unmatched": verdicts["unmatched"],
                "verdicts": {verdict: verdicts[verdict] for verdict in judged},
            }
        return out


class _OneRank(Sequence[Row]):
    """One rank's rows of a :class:`RankRows`, made when read."""

    def __init__(self, slots: Sequence[SlotRows], rank: int) -> None:
        self._slots, self._rank = slots, rank

    def __len__(self) -> int:
        return len(self._slots)

    @overload
    def __getitem__(self, index: int) -> Row: ...
    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...
    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return [slot.row(self._rank) for slot in self._slots[index]]
        return self._slots[index].row(self._rank)

    def __iter__(self) -> Iterator[Row]:
        return (slot.row(self._rank) for slot in self._slots)
