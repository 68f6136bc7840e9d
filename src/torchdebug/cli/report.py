"""``torchdebug report RUN_DIR -o report.html``: one offline HTML page for a compile debug run."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="HTML page for a TORCH_COMPILE_DEBUG run",
        description="Render models, phases, the pass pipeline with diffs, graph breaks, recompiles and "
        "compile times of a torchdebug compile debug run as one self-contained HTML file.",
    )
    parser.add_argument("run_dir", help="torch_compile_debug/run_* folder, its torchdebug/ folder, or the root")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here: torchdebug.compile pulls in inductor, too slow for every `torchdebug --help`
    from torchdebug.compile.debug_report import find_torchdebug_folder, render_report

    folder = find_torchdebug_folder(Path(args.run_dir))
    output = Path(args.output)
    output.write_text(render_report(folder))
    print(f"wrote {output} ({folder})")
    return 0
