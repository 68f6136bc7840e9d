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
from collections.abc import Sequence

from torchdebug.errors import TorchDebugError

# subcommand modules, in the order `torchdebug --help` lists them
_COMMANDS = [
    "torchdebug.cli.show",
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
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand and return its exit status (2 for usage errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (TorchDebugError, ValueError, FileNotFoundError, NotADirectoryError) as error:
        print(f"torchdebug {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `torchdebug show ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
