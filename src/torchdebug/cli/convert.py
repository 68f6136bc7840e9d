"""``torchdebug convert DUMP --to npy|pt OUT``: export the saved tensors of a dump;
``torchdebug convert DUMP out.parquet``: its records as one table.

One file per record that has a tensor, named after the record (``/`` becomes ``__``), under
``OUT/rank{R}/step{S}/``, plus ``OUT/index.json`` mapping record names to files. NumPy has no
bfloat16 or float8: those tensors are widened to float32 in ``.npy`` files (``index.json`` says so);
``.pt`` files keep every dtype.

A ``.parquet`` OUT gets one row per record of every rank (statistics as columns, see
``torchdebug.store.tables``), for pandas, Polars, DuckDB or Spark; needs ``torchdebug[parquet]``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import torch

from torchdebug import progress
from torchdebug.capture.filters import NameMatcher
from torchdebug.errors import DumpError
from torchdebug.store.reader import Run, load
from torchdebug.store.tables import records_frame, write_parquet

_NUMPY_UNSUPPORTED = {torch.bfloat16, *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert", help="export saved tensors to .npy or .pt files, or the records to Parquet", description=__doc__
    )
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument("out", help="output folder (created), or a .parquet file for the records table")
    parser.add_argument("--to", choices=("npy", "pt"), help="tensor file format (required unless OUT ends in .parquet)")
    parser.add_argument("--name", action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)")
    parser.set_defaults(func=run)


def file_stem(name: str) -> str:
    """A file name for a record name: path separators and unusual characters replaced."""
    return re.sub(r"[^A-Za-z0-9._#<>-]", "_", name.replace("/", "__")).replace("<", "(").replace(">", ")")


def run(args: argparse.Namespace) -> int:
    run_ = load(args.dump)
    out = Path(args.out)
    matcher = NameMatcher(args.name)
    if out.suffix == ".parquet" and args.to is None:
        return _records_table(run_, out, matcher)
    if args.to is None:
        raise ValueError(f"--to: required for an output folder ({out}); give --to npy or --to pt, or an OUT ending in .parquet")
    index: dict[str, dict[str, object]] = {}
    for rank, dump in sorted(run_.ranks.items()):
        for record in progress.track(dump.records(), f"converting rank {rank}", unit="record"):
            if not record.tensor or (matcher and not matcher(record.name)):
                continue
            tensor = dump.load_tensor(record)
            folder = out / f"rank{rank}" / f"step{record.step}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{file_stem(record.name)}.{args.to}"
            entry: dict[str, object] = {"file": str(path.relative_to(out)), "dtype": str(tensor.dtype).removeprefix("torch.")}
            if args.to == "pt":
                torch.save(tensor.clone(), path)
            else:
                if tensor.dtype in _NUMPY_UNSUPPORTED:
                    entry["saved_as"] = "float32"
                    tensor = tensor.float()
                np.save(path, tensor.numpy())
            index[f"rank{rank}/{record.name}@step{record.step}"] = entry
    if not index:
        raise DumpError(f"{run_.path}: no saved tensors match (dump with task='tensor' to save tensors)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.json").write_text(json.dumps(index, indent=2))
    print(f"wrote {len(index)} {args.to} files under {out}")
    return 0


def _records_table(run_: Run, out: Path, matcher: NameMatcher) -> int:
    """Write the records (those ``--name`` selects) of every rank as one Parquet table."""
    records = [record for record in run_.records() if not matcher or matcher(record.name)]
    if not records:
        raise DumpError(f"{run_.path}: no records match")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(records_frame(records), out)
    print(f"wrote {len(records)} records to {out}")
    return 0
