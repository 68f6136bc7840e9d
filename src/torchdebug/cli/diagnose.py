"""``torchdebug diagnose SCRIPT.py:FUNCTION``: localise a torch.compile failure or accuracy loss.

Exit status: 0 every stage is accurate, 1 a stage raises or loses accuracy, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from torchdebug.cli.arguments import add_options, options_of
from torchdebug.diagnose import DiagnoseConfig


def _check_entry(text: str) -> None:
    """``path/to/script.py:function`` naming a script that exists, or ``package.module:function``
    whose top-level package is installed (checked without importing it, before diagnose loads the
    compiler)."""
    target, sep, name = text.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"ENTRY {text!r} must look like path/to/script.py:function or package.module:function")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ValueError(f"ENTRY {text!r}: no script at {target}")
    elif importlib.util.find_spec(target.partition(".")[0]) is None:
        raise ValueError(f"ENTRY {text!r}: no module named {target.partition('.')[0]!r}")


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a model through eager, aot_eager, aot_eager_decomp_partition and a backend; name the first "
        "stage that raises or loses accuracy against fp64, its first bad node and source line, and write repro.py. "
        "ENTRY is path/to/script.py:function (or package.module:function); the function takes no arguments and "
        "returns (model_or_fn, example_inputs)."
    )
    parser.add_argument("entry", metavar="ENTRY", help="script.py:make_model_and_inputs")
    add_options(parser, DiagnoseConfig)  # --backend, --train, -o/--output-dir, ... (one per option)
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _check_entry(args.entry)
    # here, not at the top: diagnose loads Dynamo and inductor (2 s), which `torchdebug --help` must not
    from torchdebug.diagnose import diagnose, load_entry

    config = DiagnoseConfig(**options_of(args, DiagnoseConfig))  # each option was checked as it was read
    try:
        program, inputs = load_entry(args.entry)
    except TypeError as error:
        if _raised_in(error, load_entry):  # the function returned something else than (model, inputs)
            raise ValueError(str(error)) from None
        raise  # a bug in the user's function: its traceback helps
    report = diagnose(program, *inputs, config=config)
    print(report.summary())
    if not args.no_html:
        from pathlib import Path  # here, not at the top: `torchdebug diagnose --help` needs no pathlib

        folder = Path(config.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"report: {report.to_html(folder / 'report.html')}")
    return 0 if report.ok else 1


def _raised_in(error: BaseException, function: object) -> bool:
    """Whether ``error`` was raised by ``function`` itself, not by something it called."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and frame.tb_frame.f_code is getattr(function, "__code__", None)
