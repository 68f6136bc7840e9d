"""``torchdebug compare A B``: compare dump A against the reference dump B.

``torchdebug compare --across-ranks DUMP``: compare the ranks of one data-parallel run with each
other where replicas must agree (optimizer step, parameters, collective outputs).

Prints a summary (counts, first divergence, first non-finite op) and, with ``-o``, writes
``compare.csv``, ``compare.json`` and/or ``compare.html`` there; ``-o out.parquet`` writes the rows
as one Parquet table instead (needs ``torchdebug[parquet]``). ``--workers N`` splits A B over N
processes; under ``torchrun --nproc-per-node N -m torchdebug compare A B`` the processes torchrun
starts share the work and process 0 reports. Exit status 0: no divergence, 1: divergence found,
2: usage error (bad path, unreadable dump, bad option).

``--across-ranks`` reads one rank at a time and keeps a digest of each slot replicas must agree
on; ``--workers N`` reads N ranks at once in N processes, and torchrun spreads the ranks over the
processes of one or several nodes (each sees DUMP at the same path, e.g. a shared file system):

  torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK --rdzv-backend c10d \\
      --rdzv-endpoint $HEAD_NODE:29500 -m torchdebug compare --across-ranks /shared/dump -o out
"""

from __future__ import annotations

import argparse

from torchdebug.cli import RawDescriptionHelpFormatter
from torchdebug.cli.arguments import add_options, options_of
from torchdebug.compare import CompareConfig

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from torchdebug.compare import CompareResult

_FORMATS = ("csv", "json", "html")


def _formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in _FORMATS]
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a comma-separated subset of {','.join(_FORMATS)}")
    return formats


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = RawDescriptionHelpFormatter
    parser.add_argument("a", nargs="?", help="dump to check: dump path (latest run), run folder, rank folder or msprobe dump")
    parser.add_argument("b", nargs="?", help="reference dump, same forms as A")
    parser.add_argument("--across-ranks", metavar="DUMP", help="compare the ranks of one run with each other instead of A with B")
    parser.add_argument("-o", "--output", help="folder for the reports (created if missing), or a .parquet file for the rows")
    parser.add_argument(
        "--format", type=_formats, default=list(_FORMATS), help="reports to write with -o (default: csv,json,html)"
    )
    add_options(parser, CompareConfig)  # --tolerance, --mapping, --growth, --tensors, --ranks, ... (one per option)
    parser.set_defaults(func=run)


def _torchrun(args: argparse.Namespace) -> bool:
    """Whether torchrun started this process as one of the workers (then ``--workers`` is refused)."""
    from torchdebug.compare import launched_by_torchrun

    if not launched_by_torchrun():
        return False
    if args.workers != 1:
        raise ValueError("--workers: torchrun already started the worker processes; leave --workers out")
    return True


def _across_ranks(args: argparse.Namespace) -> CompareResult | None:
    from dataclasses import replace

    from torchdebug.compare import compare, process_group_from_env
    from torchdebug.dist import rank_and_world_size

    if args.a is not None:
        raise ValueError("--across-ranks takes one dump: give it as --across-ranks DUMP, without A B")
    if args.mapping is not None:
        raise ValueError("--mapping applies to A B only: the ranks of one run share their names")
    if args.rerun:
        raise ValueError("--rerun applies to A B only: --across-ranks checks that replicas agree bitwise")
    if args.noise is not None:
        raise ValueError("--noise applies to A B only: --across-ranks checks that replicas agree bitwise")
    config = CompareConfig(**options_of(args, CompareConfig))
    if not _torchrun(args):
        return compare(args.across_ranks, config=config)
    with process_group_from_env():  # its processes are the workers
        return compare(args.across_ranks, config=replace(config, workers=rank_and_world_size()[1]))


def _pair(args: argparse.Namespace) -> CompareResult | None:
    from dataclasses import replace

    from torchdebug.compare import compare, process_group_from_env
    from torchdebug.dist import rank_and_world_size

    if args.a is None or args.b is None:
        raise ValueError("give two dumps A B, or one with --across-ranks DUMP")
    if args.ranks is not None:
        raise ValueError("--ranks applies to --across-ranks only")
    config = CompareConfig(**options_of(args, CompareConfig))
    if not _torchrun(args):
        return compare(args.a, args.b, config=config)
    with process_group_from_env():  # its processes are the workers
        return compare(args.a, args.b, config=replace(config, workers=rank_and_world_size()[1]))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path  # here, not at the top: `torchdebug compare --help` needs no pathlib

    args.output = None if args.output is None else Path(args.output)
    table = args.output is not None and args.output.suffix == ".parquet"
    # bad outputs fail here, before a comparison that may take minutes
    if table and args.output.is_dir():
        raise ValueError(f"-o {args.output}: is a folder; give a file name ending in .parquet, or a folder for the reports")
    if not table and args.output is not None and args.output.exists() and not args.output.is_dir():
        raise ValueError(f"-o {args.output}: exists and is not a folder; give a folder for the reports, or a .parquet file")
    if table:
        from torchdebug.store import require_parquet

        require_parquet()  # before the comparison, which may take minutes
    result = _across_ranks(args) if args.across_ranks is not None else _pair(args)
    if result is None:
        return 0  # a torchrun worker other than process 0: process 0 reports
    print(result.summary())
    if table:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        print(f"wrote {result.to_parquet(args.output)}")
    elif args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        for fmt in args.format:
            path = getattr(result, f"to_{fmt}")(args.output / f"compare.{fmt}")
            print(f"wrote {path}")
    return 1 if result.diverged else 0
