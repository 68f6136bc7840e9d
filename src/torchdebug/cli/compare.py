"""``torchdebug compare A B``: compare dump A against the reference dump B.

Prints a summary (counts, first divergence, first non-finite op) and, with ``-o``, writes
``compare.csv``, ``compare.json`` and/or ``compare.html`` there. Exit status 0: no divergence,
1: divergence found, 2: usage error (bad path, unreadable dump, bad option).
"""

from __future__ import annotations

import argparse
from pathlib import Path

_FORMATS = ("csv", "json", "html")


def _tolerance(text: str) -> tuple[str, dict[str, float]]:
    """``bfloat16=0.02`` or ``float32=1e-5,1e-6`` (rtol[,atol])."""
    dtype, _, values = text.partition("=")
    try:
        numbers = [float(v) for v in values.split(",")]
    except ValueError:
        numbers = []
    if not dtype or not 1 <= len(numbers) <= 2:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected DTYPE=RTOL or DTYPE=RTOL,ATOL (e.g. bfloat16=0.02)")
    spec = {"rtol": numbers[0]}
    if len(numbers) == 2:
        spec["atol"] = numbers[1]
    return dtype, spec


def _formats(text: str) -> list[str]:
    formats = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in formats if f not in _FORMATS]
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a comma-separated subset of {','.join(_FORMATS)}")
    return formats


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two dumps and find the first divergent op",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("a", help="dump to check: dump path (latest run), run folder, rank folder or msprobe dump")
    parser.add_argument("b", help="reference dump, same forms as A")
    parser.add_argument("-o", "--output", type=Path, help="folder for the reports (created if missing)")
    parser.add_argument("--format", type=_formats, default=list(_FORMATS), help="reports to write with -o (default: csv,json,html)")
    parser.add_argument("--tolerance", type=_tolerance, action="append", default=[], metavar="DTYPE=RTOL[,ATOL]",
                        help="override a dtype's tolerance, e.g. bfloat16=0.02 (repeatable)")  # fmt: skip
    parser.add_argument("--mapping", type=Path, help="JSON/YAML file renaming A's modules/ops: {modules: {...}, ops: {...}}")
    parser.add_argument("--stats-only", action="store_true", help="compare statistics even where tensors were saved")
    parser.add_argument("--growth", type=float, default=16.0, help="error amplification an op may show before it is blamed (default 16)")
    parser.add_argument("--workers", type=int, default=None, help="threads for tensor metrics (default: all cores)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torchdebug.compare import compare  # keeps `torchdebug --help` fast

    result = compare(
        args.a,
        args.b,
        tolerances=dict(args.tolerance),
        mapping=args.mapping,
        growth=args.growth,
        tensors=not args.stats_only,
        workers=args.workers,
    )
    print(result.summary())
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        for fmt in args.format:
            path = getattr(result, f"to_{fmt}")(args.output / f"compare.{fmt}")
            print(f"wrote {path}")
    return 1 if result.diverged else 0
