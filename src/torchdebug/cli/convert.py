"""``torchdebug convert DUMP --to npy|pt OUT``: export the saved tensors of a dump;
``torchdebug convert DUMP out.parquet``: its records as one table;
``torchdebug convert DUMP out.jsonl``: its records as JSON lines, one record a line, for grep.

One file per record that has a tensor, named after the record (``/`` becomes ``__``), under
``OUT/rank{R}/step{S}/``, plus ``OUT/index.json`` mapping record names to files. NumPy has no
bfloat16 or float8: those tensors are widened to float32 in ``.npy`` files (``index.json`` says so);
``.pt`` files keep every dtype.

A ``.parquet`` OUT gets one row per record of every rank (statistics as columns, see
``torchdebug.store._tables``), for pandas, Polars, DuckDB or Spark; needs ``torchdebug[pandas]``.
A ``.jsonl`` OUT gets one JSON object per record of every rank, the fields of ``docs/format.md``
(those holding ``null`` left out), as dumps stored them before their records were Arrow columns.

A damaged tensor file (truncated, missing) is skipped with a warning naming it; the others are
converted. Exit status 2 when nothing could be converted.
"""

from __future__ import annotations

import argparse
import re

from torchdebug.cli.arguments import name_pattern
from torchdebug.errors import DumpError

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from pathlib import Path

    from torchdebug.capture.filters import NameMatcher
    from torchdebug.store import Run

_NUMPY_UNSUPPORTED = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""dtypes NumPy has no type for: widened to float32 in ``.npy`` files."""

_RECORD_FILES = (".parquet", ".jsonl")
"""Suffixes of an OUT that gets the records rather than the tensors."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument("out", help="output folder (created), or a .parquet or .jsonl file for the records")
    parser.add_argument("--to", choices=("npy", "pt"), help="tensor file format (required unless OUT ends in .parquet or .jsonl)")
    parser.add_argument(
        "--name", type=name_pattern, action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)"
    )
    parser.set_defaults(func=run)


def file_stem(name: str) -> str:
    """A file name for a record name: path separators and unusual characters replaced."""
    return re.sub(r"[^A-Za-z0-9._#<>-]", "_", name.replace("/", "__")).replace("<", "(").replace(">", ")")


def run(args: argparse.Namespace) -> int:
    # here, not at the top: the reader loads torch, and `torchdebug convert --help` imports none of it
    from pathlib import Path

    from torchdebug.capture.filters import NameMatcher
    from torchdebug.store import load

    out = Path(args.out)
    if out.suffix in _RECORD_FILES and args.to is None:
        return _records_file(load(args.dump), out, NameMatcher(args.name))
    if args.to is None:
        raise ValueError(
            f"--to: required for an output folder ({out}); give --to npy or --to pt, or an OUT ending in .parquet or .jsonl"
        )
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder; give a new or existing folder for the {args.to} files")
    return _tensor_files(load(args.dump), out, args.to, NameMatcher(args.name))


def _tensor_files(run_: Run, out: Path, to: str, matcher: NameMatcher) -> int:
    """Write the saved tensors ``matcher`` selects as ``.npy`` or ``.pt`` files, and ``index.json``."""
    import json  # here, as in run(): not for `--help`

    import numpy as np
    import torch

    from torchdebug import progress
    from torchdebug.cli.tensor_files import damaged_files, logger, warn_damaged

    index: dict[str, dict[str, object]] = {}
    skipped = 0
    for rank, dump in sorted(run_.ranks.items()):
        selected = [record for record in dump.records() if record.tensor and (not matcher or matcher(record.name))]
        damaged = damaged_files(dump, selected)
        warn_damaged(rank, damaged, "skipped")
        for record in progress.track(selected, f"converting rank {rank}", unit="record"):
            if record.tensor.get("file") in damaged:
                skipped += 1
                continue
            try:
                tensor = dump.load_tensor(record)
            except DumpError as error:  # a file whose size is right but whose header or key is wrong
                logger.warning("rank %s: skipped %s: %s", rank, record.name, error)
                skipped += 1
                continue
            folder = out / f"rank{rank}" / f"step{record.step}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{file_stem(record.name)}.{to}"
            dtype = str(tensor.dtype).removeprefix("torch.")
            entry: dict[str, object] = {"file": str(path.relative_to(out)), "dtype": dtype}
            if to == "pt":
                torch.save(tensor.clone(), path)
            else:
                if dtype in _NUMPY_UNSUPPORTED:
                    entry["saved_as"] = "float32"
                    tensor = tensor.float()
                np.save(path, tensor.numpy())
            index[f"rank{rank}/{record.name}@step{record.step}"] = entry
    if not index and skipped:
        raise DumpError(
            f"{run_.path}: no saved tensor could be read: the {skipped} selected are in damaged files (see the warnings)"
        )
    if not index:
        raise DumpError(f"{run_.path}: no saved tensors match (dump with task='tensor' to save tensors)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.json").write_text(json.dumps(index, indent=2))
    print(f"wrote {len(index)} {to} files under {out}" + (f"; skipped {skipped} in damaged files" if skipped else ""))
    return 0


def _records_file(run_: Run, out: Path, matcher: NameMatcher) -> int:
    """Write the records (those ``--name`` selects) of every rank as one Parquet table or JSON-lines file."""
    from torchdebug.store import encode_records, records_frame, write_parquet

    records = [record for record in run_.records() if not matcher or matcher(record.name)]
    if not records:
        raise DumpError(f"{run_.path}: no records match")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":
        out.write_text(encode_records(records), encoding="utf-8")
    else:
        write_parquet(records_frame(records), out)
    print(f"wrote {len(records)} records to {out}")
    return 0
