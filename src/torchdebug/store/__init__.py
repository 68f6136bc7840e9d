"""Persisting records: folder layout, crash-safe writer, pickle-free reader.

Typical use::

    run = torchdebug.load("dump")            # latest run under a dump path
    for rank, rank_dump in run.ranks.items():
        for record in rank_dump.records():
            print(record.name, record.stats)

Users meet ``load`` (also ``torchdebug.load``), ``Run`` and ``RankDump``; the other names are the
doors the capture, compare, monitor and command line go through (docs/api.md lists them all).
"""

from torchdebug.store._arrow_buffers import array as arrow_array
from torchdebug.store._arrow_buffers import booleans as arrow_booleans
from torchdebug.store._arrow_buffers import column as arrow_column
from torchdebug.store._arrow_buffers import numbers as arrow_numbers
from torchdebug.store._arrow_buffers import strings as arrow_strings
from torchdebug.store._arrow_buffers import text as arrow_text
from torchdebug.store._faults import WriteFault
from torchdebug.store._layout import RECORDS, rank_dir_name
from torchdebug.store._live import register as register_live
from torchdebug.store._msprobe import MsprobeRankDump, is_msprobe_dump
from torchdebug.store._msprobe import load as load_msprobe
from torchdebug.store._reader import RankDump, RankRecords, Run, is_dump, load, write_fault_note
from torchdebug.store._record_columns import SCHEMA, plain_values, records_batch, records_from_table
from torchdebug.store._record_json import encode_records
from torchdebug.store._shared_keys import shared_keys_dict
from torchdebug.store._slot_columns import FixedColumns, SavedTensors, SlotColumns, SlotOverrides, extra_text, unread_text
from torchdebug.store._tables import pandas, records_frame, require_parquet, write_parquet
from torchdebug.store._template_columns import TemplateColumns
from torchdebug.store._tensor_batch import TensorBatch, storable
from torchdebug.store._writer import (
    RankWriter,
    check_writable,
    check_writable_on_every_rank,
    join_run,
    new_run_name,
    run_manifest,
    unwritable,
)

__all__ = [
    "FixedColumns",
    "RECORDS",
    "SCHEMA",
    "MsprobeRankDump",
    "RankDump",
    "RankRecords",
    "RankWriter",
    "Run",
    "SavedTensors",
    "SlotOverrides",
    "SlotColumns",
    "TemplateColumns",
    "TensorBatch",
    "WriteFault",
    "arrow_array",
    "arrow_booleans",
    "arrow_column",
    "arrow_numbers",
    "arrow_strings",
    "arrow_text",
    "check_writable",
    "check_writable_on_every_rank",
    "encode_records",
    "extra_text",
    "is_dump",
    "is_msprobe_dump",
    "join_run",
    "load",
    "load_msprobe",
    "new_run_name",
    "pandas",
    "plain_values",
    "rank_dir_name",
    "records_batch",
    "records_frame",
    "records_from_table",
    "register_live",
    "require_parquet",
    "run_manifest",
    "shared_keys_dict",
    "storable",
    "unread_text",
    "unwritable",
    "write_fault_note",
    "write_parquet",
]
