"""``torchdebug show DUMP``: print records with statistics and source stack (ptdbg's ``parse``).

When an output holds a NaN or an Inf, the first such op call of each rank is named at the top.
"""

from __future__ import annotations

import argparse

from torchdebug.capture.filters import NameMatcher
from torchdebug.capture.overflow_check import describe_overflow, first_overflow
from torchdebug.records import Record
from torchdebug.store.reader import RankRecords, load


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("show", help="print records of a dump", description=__doc__)
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument("--name", action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)")
    parser.add_argument("--step", type=int, help="only this step")
    parser.add_argument("--rank", type=int, help="only this rank")
    parser.add_argument("--limit", type=int, default=0, help="print at most N records (0: all)")
    parser.add_argument("--no-stack", action="store_true", help="omit call stacks")
    parser.set_defaults(func=run)


def _format_number(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def format_record(record: Record, dump: RankRecords, with_stack: bool = True) -> str:
    """A few indented lines describing one record, as ``show`` prints it."""
    lines = [f"{record.name}  (step {record.step}, rank {record.rank}, seq {record.seq})"]
    if record.kind == "value":
        lines.append(f"  value: {record.value!r}")
    else:
        lines.append(f"  {record.dtype} {record.shape} on {record.device}")
    if record.stats:
        stats = record.stats
        numbers = "  ".join(f"{k} {_format_number(stats.get(k))}" for k in ("min", "max", "mean", "norm"))
        lines.append(f"  {numbers}  nan {stats.get('nan')} +inf {stats.get('posinf')} -inf {stats.get('neginf')}")
    if record.checksum:
        lines.append(f"  checksum: {record.checksum}")
    if record.tensor:
        sampled = f" (sampled every {record.sampled})" if record.sampled else ""
        lines.append(f"  tensor: {record.tensor.get('file')} [{record.tensor.get('key')}]{sampled}")
    if record.fwd:
        lines.append(f"  gradient of: {record.fwd}")
    if record.capture_error:
        lines.append(f"  error: {record.capture_error}")
    if with_stack:
        frames = dump.stack(record)
        if frames:
            lines.append("  stack (most recent call last):")
            lines.extend(f"    {frame}" for frame in frames)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    run_ = load(args.dump)
    matcher = NameMatcher(args.name)
    print(f"run {run_.path}: ranks {sorted(run_.ranks)}")
    for rank in run_.partial_ranks:
        print(f"warning: rank {rank} did not finish (no completion marker); its records end where it stopped")
    for rank, dump in sorted(run_.ranks.items()):
        first = first_overflow(dump.records())
        if first is not None and (args.rank is None or rank == args.rank):
            print(f"first NaN/Inf of rank {rank}: {describe_overflow(first)}")
    shown = 0
    for rank, dump in sorted(run_.ranks.items()):
        if args.rank is not None and rank != args.rank:
            continue
        for record in dump.records():
            if args.step is not None and record.step != args.step:
                continue
            if matcher and not matcher(record.name):
                continue
            print(format_record(record, dump, with_stack=not args.no_stack))
            shown += 1
            if args.limit and shown >= args.limit:
                return 0
    if not shown:
        print("no records match")
    return 0
