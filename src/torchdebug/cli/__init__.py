"""The ``torchdebug`` command line: one subcommand per module in this package.

Each subcommand module defines ``register(subparsers)``, which adds its parser and sets
``func(args) -> int`` as the handler. Exit status: 0 success, 1 a finding (e.g. a divergence),
2 a usage error (bad arguments, bad config, unreadable dump).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torchdebug import progress
from torchdebug.errors import TorchDebugError

# subcommand modules, in the order `torchdebug --help` lists them
_COMMANDS = [
    "torchdebug.cli.show",
    "torchdebug.cli.check",
    "torchdebug.cli.convert",
    "torchdebug.cli.config",
    "torchdebug.cli.compare",
    "torchdebug.cli.report",
    "torchdebug.cli.diagnose",
]


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="torchdebug",
        description="Debug torch.compile failures and numerical divergence in PyTorch models.",
    )
    _add_output_options(parser, default=0)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).register(subparsers)
    for subparser in subparsers.choices.values():
        _add_output_options(subparser, default=argparse.SUPPRESS)  # `torchdebug compare A B -q` as well
    return parser


def _add_output_options(parser: argparse.ArgumentParser, default: object) -> None:
    """``-q`` and ``-v``, accepted before and after the subcommand (``SUPPRESS`` on a subcommand
    keeps what the root parser set when the subcommand does not give it)."""
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="no progress bars, no warnings")
    parser.add_argument("-v", "--verbose", action="count", default=default, help="tell what is happening (-vv: debug details)")


@contextmanager
def _output(quiet: bool, verbose: int) -> Iterator[None]:
    """Progress bars and torchdebug's log level for one command; the previous state restored after."""
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.quiet and args.verbose:
        parser.error("--quiet and --verbose: give one of them")
    try:
        with _output(args.quiet, args.verbose):
            return int(args.func(args) or 0)
    except (TorchDebugError, ValueError, FileNotFoundError, NotADirectoryError) as error:
        print(f"torchdebug {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `torchdebug show ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
