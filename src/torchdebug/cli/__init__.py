"""The ``torchdebug`` command line: one subcommand per module in this package.

Each subcommand module defines ``register(parser)``, which gives the subcommand's parser its
description and arguments and sets ``func(args) -> int`` as the handler; :data:`COMMANDS` lists
them with their one-line help. Exit status: 0 success, 1 a finding (e.g. a divergence), 2 a usage
error (bad arguments, bad config, unreadable dump).

Every usage error is one line on stderr, ``torchdebug COMMAND: error: ...``: the parser's own
(:class:`_Parser`) and those a command raises (:data:`_USAGE_ERRORS`).

Help is fast (``torchdebug --help`` and every ``torchdebug COMMAND --help`` take about as long as
an argparse script's help; torch takes 2 s to import): :func:`main` builds and imports only the
subcommand it runs, and subcommand modules import what loads torch (the reader, numpy), json and
pathlib inside their handlers, not at the top, and typing only for type checkers
(``TYPE_CHECKING = False``: typing costs a tenth of an argparse help); ``tests/test_package.py``
checks that no help imports torch or another subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torchdebug.errors import TorchDebugError

__all__ = ["COMMANDS", "build_parser", "main"]

TYPE_CHECKING = False  # typing's (type checkers read the name as True), without importing typing
if TYPE_CHECKING:
    from typing import Any, NoReturn

COMMANDS = {
    "show": "print records of a dump",
    "check": "exit 1 when an op made a NaN or an Inf (for CI)",
    "convert": "export saved tensors to .npy or .pt files, or the records to Parquet",
    "config": "print the config schema or check a config file",
    "compare": "compare two dumps and find the first divergent op",
    "report": "HTML page for a TORCH_COMPILE_DEBUG run or an eager dump",
    "diagnose": "find the compiler stage, node and source line that break a model",
}
"""Subcommand (module ``torchdebug.cli.<name>``) -> its line in ``torchdebug --help``, in that order."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors: the message and where to find the usage, no usage
    block (subparsers are made of the same class); a flag only by its whole name (argparse takes
    any unambiguous prefix: ``--output`` for ``--output-dir``, which a new flag would silently change)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _terminal_width() -> int:
    """What ``shutil.get_terminal_size`` says (``$COLUMNS``, else the terminal, else 80), without
    importing shutil, which loads the archive modules (a tenth of the time help takes)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help layout, with the width found without shutil."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, _terminal_width() - 2 if width is None else width)


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`HelpFormatter` that keeps the description's line breaks."""


_USAGE_ERRORS = (TorchDebugError, ValueError, OSError, re.error)
"""What a command raises for bad input (a ``ConfigError`` is a ``ValueError``; a missing or
unwritable path an ``OSError``): printed as one line, exit 2."""


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The root parser with every subcommand registered; given the command line ``argv``, only
    what it needs: the subcommand it names alone (parsers cost a millisecond each to build), or,
    when it names none (``torchdebug --help``, a typo), every subcommand's help line without
    importing its module."""
    parser = _Parser(
        prog="torchdebug",
        description="Debug torch.compile failures and numerical divergence in PyTorch models.",
        formatter_class=HelpFormatter,
    )
    _add_output_options(parser, default=0)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    named = None if argv is None else _named_command(argv)
    for name, line in COMMANDS.items():
        if named is not None and name != named:
            continue
        subparser = subparsers.add_parser(name, help=line, description=line, formatter_class=HelpFormatter)
        if argv is None or named is not None:
            importlib.import_module(f"torchdebug.cli.{name}").register(subparser)
        _add_output_options(subparser, default=argparse.SUPPRESS)  # `torchdebug compare A B -q` as well
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs: its first word that is no option (``-q`` and ``-v`` take no
    value), if that is a subcommand and no ``--help`` comes before it (the root's help lists all)."""
    for word in argv:
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _add_output_options(parser: argparse.ArgumentParser, default: object) -> None:
    """``-q`` and ``-v``, accepted before and after the subcommand (``SUPPRESS`` on a subcommand
    keeps what the root parser set when the subcommand does not give it)."""
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="no progress bars, no warnings")
    parser.add_argument("-v", "--verbose", action="count", default=default, help="tell what is happening (-vv: debug details)")


@contextmanager
def _output(quiet: bool, verbose: int) -> Iterator[None]:
    """Progress bars and torchdebug's log level for one command; the previous state restored after."""
    import logging  # here, not at the top: `--help` needs neither logging nor the bars (see test_package.py)

    from torchdebug import progress

    logger = logging.getLogger("torchdebug")
    saved = logger.handlers, logger.level, logger.propagate
    handler = progress.LogHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)])
    bars = progress.set_enabled(not quiet)
    try:
        yield
    finally:
        logger.handlers, logger.level, logger.propagate = saved
        progress.set_enabled(bars)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand and return its exit status (2 for usage errors)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warning_line  # a renamed flag's warning: one line, no source line
        args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.quiet and args.verbose:
        parser.error("--quiet and --verbose: give one of them")
    try:
        with _output(args.quiet, args.verbose):
            return int(args.func(args) or 0)
    except BrokenPipeError:  # `torchdebug show ... | head`
        return 0
    except _USAGE_ERRORS as error:
        message = _one_line(error).removeprefix(f"{args.command}: ")  # "diagnose: no script at ..."
        print(f"{_command(args)}: error: {message}", file=sys.stderr)
        return 2


def _warning_line(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    print(f"torchdebug: warning: {message}", file=sys.stderr)


def _command(args: argparse.Namespace) -> str:
    """``torchdebug show``, ``torchdebug config check``: the command that failed."""
    return " ".join(["torchdebug", args.command, *([args.action] if getattr(args, "action", None) else [])])


def _one_line(error: BaseException) -> str:
    """The error's message on one line (an ``OSError`` as ``strerror: path``)."""
    if isinstance(error, OSError) and error.strerror and error.filename is not None:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
