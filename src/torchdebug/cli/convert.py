"""``torchdebug convert DUMP --to npy|pt OUT``: export the saved tensors of a dump.

One file per record that has a tensor, named after the record (``/`` becomes ``__``), under
``OUT/rank{R}/step{S}/``, plus ``OUT/index.json`` mapping record names to files. NumPy has no
bfloat16 or float8: those tensors are widened to float32 in ``.npy`` files (``index.json`` says so);
``.pt`` files keep every dtype.
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
from torchdebug.store.reader import load

_NUMPY_UNSUPPORTED = {torch.bfloat16, *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("convert", help="export saved tensors to .npy or .pt files", description=__doc__)
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument("out", help="output folder (created)")
    parser.add_argument("--to", choices=("npy", "pt"), required=True, help="file format")
    parser.add_argument("--name", action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)")
    parser.set_defaults(func=run)


def file_stem(name: str) -> str:
    """A file name for a record name: path separators and unusual characters replaced."""
    return re.sub(r"[^A-Za-z0-9._#<>-]", "_", name.replace("/", "__")).replace("<", "(").replace(">", ")")


def run(args: argparse.Namespace) -> int:
    run_ = load(args.dump)
    out = Path(args.out)
    matcher = NameMatcher(args.name)
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
