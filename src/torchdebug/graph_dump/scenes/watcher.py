"""The watcher scene: find outputs that changed after they were produced (memory stomping).

After each node in ``layer`` runs, the compiled graph hands over the outputs of the
``watcher_nodes`` (``torchdebug::dump_point``); each becomes a record of the watched call with
``extra["after"]`` naming the node that had just run. An output's first record is taken right after
the watched node itself; a later record whose statistics differ shows that the node named in its
``after`` (or one run since the previous record) wrote into memory it does not own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torchdebug.records import Record
from torchdebug.stats.schema import STAT_KEYS


@dataclass(frozen=True, slots=True)
class Overwrite:
    """A watched output whose values changed between two watcher points."""

    step: int
    name: str
    """Slot name of the watched output."""
    before: str
    """The last node after which the output still had its produced values."""
    after: str
    """The first node after which it had changed."""

    def __str__(self) -> str:
        return f"step {self.step}: {self.name} changed between after {self.before} and after {self.after}"


def find_overwrites(records: Iterable[Record]) -> list[Overwrite]:
    """The first change of each watched output in each step, in the order the records were written."""
    first: dict[tuple[int, str], Record] = {}
    unchanged_after: dict[tuple[int, str], str] = {}
    found: dict[tuple[int, str], Overwrite] = {}
    for record in records:
        after = record.extra.get("after") if record.extra else None
        if after is None or record.stats is None:
            continue
        key = (record.step, record.name)
        if key not in first:
            first[key], unchanged_after[key] = record, after
            continue
        if key in found:
            continue
        reference = first[key].stats or {}
        if any(reference.get(k) != record.stats.get(k) for k in STAT_KEYS):
            found[key] = Overwrite(record.step, record.name, unchanged_after[key], after)
        else:
            unchanged_after[key] = after
    return list(found.values())
