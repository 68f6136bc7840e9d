"""``torchdebug report PATH -o report.html``: one offline HTML page for a compile debug run or an
eager dump (per rank: records per phase and module, the largest magnitudes, a plot of them along
the modules, damaged tensor files, and the first NaN/Inf with every slot that holds one)."""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render models, phases, the pass pipeline with diffs, graph breaks, recompiles and "
        "compile times of a torchdebug compile debug run, or an eager dump's overview (records per phase and "
        "module, largest magnitudes, per-module statistics with a plot) with its first NaN/Inf and every "
        "overflowing slot, as one self-contained HTML file."
    )
    parser.add_argument("run_dir", help="torch_compile_debug/run_* folder, its torchdebug/ folder or the root; or an eager dump")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: the reader loads torch, and `torchdebug report --help` imports none of it
    from pathlib import Path

    from torchdebug.store import is_dump

    output = Path(args.output)
    path = Path(args.run_dir)
    if output.is_dir():
        raise ValueError(f"-o {output}: is a folder; give the HTML file to write, e.g. {output / 'report.html'}")
    if not path.exists():
        raise ValueError(f"{path}: no such folder; give an eager dump or a torch_compile_debug/run_* folder")
    if is_dump(path):
        from torchdebug.report.dump import render_dump

        page = render_dump(**_dump_page(path))
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(page, encoding="utf-8")
        print(f"wrote {output} ({path})")
        return 0
    # imported here: torchdebug.compile pulls in inductor, too slow for every `torchdebug --help`
    from torchdebug.compile import find_torchdebug_folder, render_report

    folder = find_torchdebug_folder(path)
    page = render_report(folder)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    print(f"wrote {output} ({folder})")
    return 0


def _dump_page(path: Path) -> dict[str, Any]:
    """What the eager dump page shows, per rank: aggregates, never every record."""
    from torchdebug.cli.tensor_files import damaged_files
    from torchdebug.nonfinite import find_origin
    from torchdebug.report.dump import overflow_rows, overview
    from torchdebug.report.timeline import timeline
    from torchdebug.store import load, write_fault_note

    run_ = load(path)
    ranks = []
    for rank, dump in sorted(run_.ranks.items()):
        records = dump.records()
        first = find_origin(records)
        overflows, more_overflows = overflow_rows(records)
        damaged = damaged_files(dump, records)
        event = (dump.completion or {}).get("monitor")  # a flight recorder's window
        ranks.append(
            {
                "rank": rank,
                "task": getattr(dump, "task", "?"),
                "complete": dump.complete,
                "write_fault": write_fault_note(rank, dump),
                "records": len(records),
                "first": str(first) if first is not None else None,
                "overflows": overflows,
                "more_overflows": more_overflows,
                "damaged": [{"file": file, "reason": reason, "records": count} for file, (reason, count) in damaged.items()],
                "overview": overview(records),
                "monitor": event,
                "timeline": timeline(records, event) if event else None,
            }
        )
    return {"path": str(run_.path), "ranks": ranks}
