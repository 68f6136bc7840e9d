"""Dicts that share one table of keys, for the many small dicts a dump's records and a compare's rows hold.

CPython keeps the attribute dicts of a class's instances, filled with the same keys in the same
order, as values beside one shared table of keys: 136 bytes for a record's 8 statistics where a
dict of its own takes 272 (once a few dozen of a kind are made: CPython 3.11 to 3.13 size the
first ones' values by the room left in the table, more than a dict of its own). A 256-layer compare
holds about 100k distinct statistics and 50k distinct statistics metrics. Each kind of dict gets a
class of its own (its keys); the dicts are plain ``dict`` objects, and one filled in another order
simply keeps a table of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["shared_keys_dict"]


def shared_keys_dict(kind: type, items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A dict of ``items`` sharing its keys with the others made for ``kind`` (an empty class)."""
    values = vars(kind())
    values.update(items)
    return values
