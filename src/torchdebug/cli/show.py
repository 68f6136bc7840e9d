"""``torchdebug show DUMP``: what a dump holds, on one screen, then its records one by one.

First the first op call of each rank that made a NaN or an Inf, then a summary of the matching
records (per phase: records, op calls, NaN/Inf slots, largest magnitude; the modules with NaN/Inf
or the largest magnitudes; the largest slots), then the first ``--limit`` records with statistics
and source stack, and how many more there are. A dump holds up to a million records per rank and a
run hundreds of ranks, so each rank's records are read in order and dropped, keeping only the first
few (``--all`` reads them a second time to print them). Damaged tensor files
(truncated, missing) are named in warnings, and their records say so.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

from torchdebug.cli.arguments import indices, integer, name_pattern

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from torchdebug.records import Record
    from torchdebug.store import RankRecords


ROWS = 10
"""Records printed after the summary unless ``--limit`` or ``--all`` says otherwise."""
MODULES = 8
"""Modules in the summary: those with NaN/Inf slots first, then by largest magnitude."""
SLOTS = 5
"""Slots listed under the largest magnitudes."""
ORIGIN_RANKS = 8
"""Ranks whose first NaN/Inf is named; the others are counted."""


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.add_argument(
        "--name", type=name_pattern, action="append", default=[], help="substring or 're:REGEX' of record names (repeatable)"
    )
    parser.add_argument("--step", type=indices, help="only these steps: 3, 0|3-5 or 0,2")
    parser.add_argument("--rank", type=indices, help="only these ranks, same forms as --step")
    parser.add_argument(
        "--limit", type=integer(0), default=ROWS, help=f"print the first N matching records (default {ROWS}; 0: all)"
    )
    parser.add_argument("--all", action="store_true", help="print every matching record (as --limit 0)")
    parser.add_argument("--no-stack", action="store_true", help="omit call stacks")
    parser.set_defaults(func=run)


def _format_number(value: object) -> str:
    if value is None:
        return "-"
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
        from torchdebug.stats import COUNTS, VALUE_KEYS  # here: the help path imports no dataclasses

        stats = record.stats
        numbers = "  ".join(f"{k} {_format_number(stats.get(k))}" for k in VALUE_KEYS)
        counts = " ".join(f"{a.label or a.field} {_format_number(stats.get(a.field))}" for a in COUNTS)
        lines.append(f"  {numbers}  {counts}")  # a count the record predates shows as "-"
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
    from torchdebug.report.dump import overview
    from torchdebug.store import load, write_fault_note

    run_ = load(args.dump)
    matcher = NameMatcher(args.name)
    ranks = {rank: dump for rank, dump in sorted(run_.ranks.items()) if args.rank is None or rank in args.rank}
    if not ranks:
        raise ValueError(f"--rank: got {_spec(args.rank)}, the run has ranks {_spec(sorted(run_.ranks))}")
    print(f"run {run_.path}: ranks {_spec(sorted(run_.ranks))}")
    for rank in run_.partial_ranks:
        print(f"warning: rank {rank} did not finish (no completion marker); its records end where it stopped")
    for rank, dump in sorted(run_.ranks.items()):
        note = write_fault_note(rank, dump)
        if note is not None:
            print(f"warning: {note}")
    damaged = {}
    origins = []
    for rank, dump in ranks.items():  # ranks' records are read a rank at a time and not kept
        damaged[rank] = damaged_files(dump)
        warn_damaged(rank, damaged[rank], "cannot be read")
        first = find_origin(dump.passing_records())
        if first is not None:
            origins.append(f"first NaN/Inf of rank {rank}: {first}")
    for line in origins[:ORIGIN_RANKS]:
        print(line)
    if len(origins) > ORIGIN_RANKS:
        print(f"... and a first NaN/Inf on {len(origins) - ORIGIN_RANKS} more ranks (--rank to see them)")

    limit = None if args.all or args.limit == 0 else args.limit
    first_rows: list[tuple[int, Record]] = []
    matched = 0

    def matching() -> Iterator[tuple[int, Record]]:
        for rank, dump in ranks.items():
            for record in dump.passing_records():
                if (args.step is None or record.step in args.step) and (not matcher or matcher(record.name)):
                    yield rank, record

    def counted() -> Iterator[Record]:
        nonlocal matched
        for rank, record in matching():
            matched += 1
            if limit is not None and len(first_rows) < limit:
                first_rows.append((rank, record))
            yield record

    summary = overview(counted(), largest=SLOTS)
    if not matched:
        print("no records match")
        return 0
    print(*_summary_lines(summary, matched), sep="\n")
    rows = matching() if limit is None else iter(first_rows)  # every record: read again, not kept
    shown = matched if limit is None else len(first_rows)
    print(f"\nthe first {shown} records:" if shown < matched else f"\nall {matched} records:")
    for rank, record in rows:
        print(format_record(record, ranks[rank], with_stack=not args.no_stack, damaged=damaged[rank]))
    if shown < matched:
        print(f"... {matched - shown} more: --limit N or --all prints them, --name, --step and --rank narrow them")
    return 0


def _summary_lines(summary: dict[str, Any], matched: int) -> list[str]:
    """The summary's text: phases, the modules worth a look, the largest slots."""
    steps = summary["steps"]
    calls = sum(row["calls"] for row in summary["phases"])
    lines = [f"\n{matched} records of {calls} op calls in steps {_spec(steps)}"]
    lines.append(
        _table(
            ["phase", "records", "calls", "NaN/Inf", "largest"],
            [
                [row["phase"], row["records"], row["calls"], row["nonfinite"], _format_number(row["largest"])]
                for row in summary["phases"]
            ],
        )
    )
    modules = summary["modules"]
    picked = sorted(modules, key=_module_rank)[:MODULES]
    if picked:
        count = len(modules) + summary["more_modules"]
        lines.append(f"\nmodules ({len(picked)} of {count}: NaN/Inf first, then by largest magnitude):")
        lines.append(
            _table(
                ["module", "records", "NaN/Inf", "largest forward", "largest backward"],
                [
                    [
                        row["module"],
                        row["records"],
                        row["nonfinite"],
                        *(_largest(row, phase) for phase in ("forward", "backward")),
                    ]
                    for row in picked
                ],
            )
        )
    if summary["largest"]:
        lines.append("\nlargest magnitudes:")
        lines.extend(
            f"  {_format_number(slot['magnitude']):>12}  {slot['name']}  (step {slot['step']})" for slot in summary["largest"]
        )
    return lines


def _module_rank(row: dict[str, Any]) -> tuple[bool, float]:
    values = [entry["value"] for entry in row["largest"].values()]
    return (not row["nonfinite"], -max(values, default=-1.0))


def _largest(row: dict[str, Any], phase: str) -> str:
    entry = row["largest"].get(phase)
    return _format_number(entry["value"]) if entry else "-"


def _table(header: list[str], rows: list[list[object]]) -> str:
    """Columns padded to their widest cell: text left-aligned, numbers right-aligned."""
    cells = [header, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  " + "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(row, widths)))
        for row in cells
    )


def _spec(values: list[int]) -> str:
    """``0-3,7``: sorted integers with consecutive runs joined (the form --step and --rank take)."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)
