"""``torchdebug diagnose SCRIPT.py:FUNCTION``: localise a torch.compile failure or accuracy loss.

Exit status: 0 every stage is accurate, 1 a stage raises or loses accuracy, 2 usage error.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="find the compiler stage, node and source line that break a model",
        description="Run a model through eager, aot_eager, aot_eager_decomp_partition and a backend; name the first "
        "stage that raises or loses accuracy against fp64, its first bad node and source line, and write repro.py. "
        "ENTRY is path/to/script.py:function (or package.module:function); the function takes no arguments and "
        "returns (model_or_fn, example_inputs).",
    )
    parser.add_argument("entry", metavar="ENTRY", help="script.py:make_model_and_inputs")
    parser.add_argument("--backend", default=None, help="torch.compile backend under test (default: inductor)")
    parser.add_argument("--mode", default=None, help="torch.compile mode for the last stage")
    parser.add_argument("--forward-only", action="store_true", help="skip backward (no gradient checks)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="tol of torch._dynamo.utils.same (default 1e-3)")
    parser.add_argument("-o", "--output", default="torchdebug_diagnose", help="folder for repro.py and report.html")
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # here, not at the top: diagnose loads Dynamo and inductor (2 s), which `torchdebug --help` must not
    from torchdebug.diagnose import diagnose
    from torchdebug.diagnose.entry import load_entry

    program, inputs = load_entry(args.entry)
    report = diagnose(
        program,
        *inputs,
        backend=args.backend,
        mode=args.mode,
        train=not args.forward_only,
        tolerance=args.tolerance,
        output_dir=args.output,
    )
    print(report.summary())
    if not args.no_html:
        folder = Path(args.output)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"report: {report.to_html(folder / 'report.html')}")
    return 0 if report.ok else 1
