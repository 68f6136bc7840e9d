"""``torchdebug show DUMP``: print records with statistics and source stack (ptdbg's ``parse``).

The first op call of each rank that made a NaN or an Inf is named at the top.
Damaged tensor files (truncated, missing) are named in warnings, and their records say so.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from torchdebug.cli.arguments import indices, integer, name_pattern

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from torchdebug.records import Record
    from torchdebug.store.reader import RankRecords


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument(
        "--name", type=name_pattern, action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)"
    )
    parser.add_argument("--step", type=indices, help="only these steps: 3, 0|3-5 or 0,2")
    parser.add_argument("--rank", type=indices, help="only these ranks, same forms as --step")
    parser.add_argument("--limit", type=integer(0), default=0, help="print at most N records (0: all)")
    parser.add_argument("--no-stack", action="store_true", help="omit call stacks")
    parser.set_defaults(func=run)


def _format_number(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def format_record(
    record: Record, dump: RankRecords, with_stack: bool = True, damaged: Mapping[str, tuple[str, int]] | None = None
) -> str:
    """A few indented lines describing one record, as ``show`` prints it (``damaged``: the rank's
    damaged tensor files, see ``cli/tensor_files.py``)."""
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
        file = record.tensor.get("file")
        unreadable = f" (unreadable, damaged file: {damaged[file][0]})" if damaged and file in damaged else ""
        lines.append(f"  tensor: {file} [{record.tensor.get('key')}]{sampled}{unreadable}")
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
    # here, not at the top: these load torch, which `torchdebug show --help` must not
    from torchdebug.capture.filters import NameMatcher
    from torchdebug.cli.tensor_files import damaged_files, warn_damaged
    from torchdebug.nonfinite import find_origin
    from torchdebug.store.reader import load

    run_ = load(args.dump)
    matcher = NameMatcher(args.name)
    ranks = {rank: dump for rank, dump in sorted(run_.ranks.items()) if args.rank is None or rank in args.rank}
    if not ranks:
        raise ValueError(f"--rank: got {_spec(args.rank)}, the run has ranks {_spec(sorted(run_.ranks))}")
    print(f"run {run_.path}: ranks {sorted(run_.ranks)}")
    for rank in run_.partial_ranks:
        print(f"warning: rank {rank} did not finish (no completion marker); its records end where it stopped")
    damaged = {}
    for rank, dump in ranks.items():
        damaged[rank] = damaged_files(dump)
        warn_damaged(rank, damaged[rank], "cannot be read")
        first = find_origin(dump.records())
        if first is not None:
            print(f"first NaN/Inf of rank {rank}: {str(first)}")
    shown = 0
    for rank, dump in ranks.items():
        for record in dump.records():
            if args.step is not None and record.step not in args.step:
                continue
            if matcher and not matcher(record.name):
                continue
            print(format_record(record, dump, with_stack=not args.no_stack, damaged=damaged[rank]))
            shown += 1
            if args.limit and shown >= args.limit:
                return 0
    if not shown:
        print("no records match")
    return 0


def _spec(values: list[int]) -> str:
    return ",".join(map(str, values))
