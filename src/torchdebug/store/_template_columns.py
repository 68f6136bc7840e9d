"""Records that repeat from run to run but for their statistics and value ids, as columns.

A compiled graph runs every step with the same call indices, seq numbers and sizes (a template:
``graph_dump/_capture.py``), so its records differ from one step to the next only in ``step``,
statistics and value ids. :class:`TemplateColumns` holds the other columns, made once from the
template's records, and gives each run's batch from the run's statistics rows and value ids: no
record object per slot and run. The batch equals ``records_batch`` of the records the run would
otherwise make (``tests/store/test_template_columns.py``; a whole dump:
``tests/capture/test_graph_dynamic_shapes.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from torchdebug.records import Record
from torchdebug.store._arrow_buffers import array
from torchdebug.store._record_columns import columns_batch, int_column, records_batch, stats_array

__all__ = ["TemplateColumns", "ValueId"]

_IDS = ("value_id", "version", "view_of")
_PER_RUN = ("step", "stats", *_IDS, "json_fields")
"""The columns each run gives; the others come from the template."""

ValueId = tuple[int, int | None, int | None]
"""A record's ``(value_id, version, view_of)`` in one run."""


class TemplateColumns:
    """The records of a template's runs as columns.

    ``records``: the template's records (no statistics, no value ids); ``stat_rows``: per record,
    the run's statistics row it holds, ``-1`` none; ``held``: the records that carry a value id."""

    def __init__(self, records: Sequence[Record], stat_rows: Sequence[int], held: Sequence[int]) -> None:
        template = records_batch(records)
        self.count = len(records)
        self.fixed = {name: template.column(name) for name in template.schema.names if name not in _PER_RUN}
        self.odd: dict[int, dict[str, Any]] = {
            record: json.loads(text) for record, text in enumerate(template.column("json_fields").to_pylist()) if text is not None
        }
        """The template's fields its columns cannot hold (a symbolic size), by record."""
        self.stat_rows = np.asarray(stat_rows, np.int64)
        self.held = np.asarray(held, np.int64)

    def batch(self, step: int, rows: list[dict[str, Any]], ids: Sequence[ValueId | None]) -> pa.RecordBatch:
        """One run's records: ``rows`` its statistics rows (filled by now), ``ids`` the value id of
        each held record (``None``: none known)."""
        count = self.count
        odd_rows: dict[int, dict[str, Any]] = {}
        stats = stats_array([*rows, None], odd_rows)
        at = np.where(self.stat_rows >= 0, self.stat_rows, len(rows))
        odd = dict(self.odd)
        if odd_rows:  # rare: statistics the columns cannot hold (huge ints), kept whole as records_batch keeps them
            for record, row in enumerate(at.tolist()):
                if row in odd_rows:
                    odd[record] = {**odd.get(record, {}), **odd_rows[row]}
        columns = {**self.fixed, "step": int_column(step, count)}
        known = [value for value in ids if value is not None]
        records = self.held[[value is not None for value in ids]] if known else self.held[:0]
        for position, name in enumerate(_IDS):
            values = np.full(count, -1, np.int64)
            values[records] = [-1 if (given := value[position]) is None else given for value in known]
            columns[name] = array(values, missing=values < 0)
        return columns_batch(count, columns, stats.take(array(at)), odd)
