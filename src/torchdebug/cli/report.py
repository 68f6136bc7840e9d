"""``torchdebug report PATH -o report.html``: one offline HTML page for a compile debug run or an
eager dump (per rank its first NaN/Inf with the source line, and every slot that holds one)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torchdebug.capture.overflow_check import describe_overflow, first_overflow
from torchdebug.report.dump import render_dump
from torchdebug.store.reader import is_dump, load


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="HTML page for a TORCH_COMPILE_DEBUG run or an eager dump",
        description="Render models, phases, the pass pipeline with diffs, graph breaks, recompiles and "
        "compile times of a torchdebug compile debug run, or the first NaN/Inf and every overflowing slot "
        "of an eager dump, as one self-contained HTML file.",
    )
    parser.add_argument("run_dir", help="torch_compile_debug/run_* folder, its torchdebug/ folder or the root; or an eager dump")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    output = Path(args.output)
    path = Path(args.run_dir)
    if is_dump(path):
        output.write_text(render_dump(**_dump_page(path)), encoding="utf-8")
        print(f"wrote {output} ({path})")
        return 0
    # imported here: torchdebug.compile pulls in inductor, too slow for every `torchdebug --help`
    from torchdebug.compile.debug_report import find_torchdebug_folder, render_report

    folder = find_torchdebug_folder(path)
    output.write_text(render_report(folder))
    print(f"wrote {output} ({folder})")
    return 0


def _dump_page(path: Path) -> dict[str, Any]:
    """What the eager dump page shows, per rank."""
    run_ = load(path)
    ranks = []
    for rank, dump in sorted(run_.ranks.items()):
        records = dump.records()
        first = first_overflow(records)
        overflows = [
            {
                "name": r.name,
                "phase": r.phase,
                "module": r.module,
                "source": r.source,
                "dtype": r.dtype,
                "shape": r.shape,
                "nan": r.stats.get("nan") or 0,
                "inf": (r.stats.get("posinf") or 0) + (r.stats.get("neginf") or 0),
            }
            for r in records
            if r.stats and (r.stats.get("nan") or r.stats.get("posinf") or r.stats.get("neginf"))
        ]
        ranks.append(
            {
                "rank": rank,
                "task": getattr(dump, "task", "?"),
                "complete": dump.complete,
                "records": len(records),
                "first": describe_overflow(first) if first is not None else None,
                "overflows": overflows,
            }
        )
    return {"path": str(run_.path), "ranks": ranks}
