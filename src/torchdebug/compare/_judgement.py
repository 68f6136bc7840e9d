"""A row's judgement: the verdict, attribution and message one rule gives it, and what it passes on.

Every way of judging rows — within tolerance (:mod:`torchdebug.compare._rules`), bit for bit
(:mod:`torchdebug.compare._checksums`) and across ranks (:mod:`torchdebug.compare._across_ranks`) —
decides a :class:`Judgement` and sets it on the row with :meth:`Judgement.apply`, the one place a
row's verdict, attribution and message are written.
"""

from __future__ import annotations

from typing import NamedTuple

from torchdebug.compare._rows import Row

__all__ = ["Judgement"]


class Judgement(NamedTuple):
    """What a rule decided about one row (immutable; a named tuple, cheap to make per row)."""

    verdict: str
    attribution: str = ""
    message: str = ""
    difference: float | None = None
    """Replaces the row's ``difference`` when set: infinite where no number measures what differs."""
    origin: str | None = None
    """The blamed row whose difference this row is (blamed) or carries (inherited, undecided)."""
    constant: str | None = None
    """The constant made for the dtype that this row is or carries."""
    upstream: float | None = None
    """The difference this row adds to what later calls count as seen upstream (``None``: none)."""
    stand_ins: tuple[Row, ...] = ()
    """Rows that take this input's place when its call's outputs are judged (each side made it from
    other rows)."""
    blames: tuple[tuple[Row, Judgement], ...] = ()
    """Earlier rows judged again with this row: the op only one side runs that made this input's
    difference (:mod:`torchdebug.compare._structure`), blamed when the input that reads it is judged."""

    def apply(self, row: Row) -> None:
        """Set the verdict, attribution and message (and ``difference``, when given) on ``row``."""
        row.verdict, row.attribution, row.message = self.verdict, self.attribution, self.message
        if self.difference is not None:
            row.difference = self.difference
