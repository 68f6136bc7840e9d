"""``torchdebug check DUMP``: a CI gate on NaN/Inf, exit 0 clean, 1 a NaN or Inf found, 2 usage error.

Reads the statistics in the dump (``task="overflow_check"`` records only the calls that made a
NaN/Inf; ``statistics`` and ``tensor`` dumps have them all) and prints, per rank, the first op call
that made a NaN or an Inf from finite inputs, or through which a NaN entered the step (an op that
only writes an infinity it was given, a ``-inf`` attention mask, is not one; see
``torchdebug.nonfinite``): call name, phase, module and source line (for a backward op, the forward
line that created it). Damaged tensor files (truncated, missing) are named
in warnings on stderr; they do not change the exit status, which is about NaN/Inf only.
"""

from __future__ import annotations

import argparse
import sys


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0]
    parser.add_argument("dump", help="dump path (latest run), run folder or rank folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: these load torch, which `torchdebug check --help` must not
    from torchdebug.cli.tensor_files import damaged_files, warn_damaged
    from torchdebug.nonfinite import find_origin
    from torchdebug.store import load, write_fault_note

    run_ = load(args.dump)
    found = with_stats = False
    for rank, dump in sorted(run_.ranks.items()):
        note = write_fault_note(rank, dump)
        if note is not None:
            print(f"warning: {note}; the steps after it were not checked", file=sys.stderr)
        records = dump.records()
        warn_damaged(rank, damaged_files(dump, records), "cannot be read (their statistics were checked)")
        # an overflow check that found nothing recorded nothing
        with_stats = with_stats or getattr(dump, "task", None) == "overflow_check" or any(record.stats for record in records)
        first = find_origin(records)
        if first is not None:
            found = True
            print(f"rank {rank}: first NaN/Inf at {str(first)}")
    if found:
        return 1
    if not with_stats:
        raise ValueError(f"{run_.path} holds no statistics (task='structure' or 'checksum'): nothing to check")
    given = [r for r in run_.records() if r.io == "output" and r.stats and (r.stats.get("posinf") or r.stats.get("neginf"))]
    if given:
        held = f"{len(given)} output slots hold infinities they were given (first: {given[0].name})"
        print(f"run {run_.path}: no NaN or Inf made; {held}")
    else:
        print(f"run {run_.path}: no NaN or Inf")
    return 0
