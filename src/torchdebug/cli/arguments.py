"""Argument types shared by the subcommands: each checks a value as argparse reads it, so a bad one
is a one-line usage error (exit 2) naming the option, never a traceback from deep inside a command.

The rules are the config's (``torchdebug.options``): a ``--name`` pattern is a substring or
``re:REGEX``, as in ``Debugger(list=...)``; ``--step`` and ``--rank`` take ``0|3-5|10`` as the
config's ``step`` and ``rank`` do, and commas as well (``0,2,4``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from torchdebug.errors import ConfigError


def _message(error: ConfigError, key: str) -> str:
    """The validator's message without its leading ``key: `` (argparse names the option itself)."""
    return str(error).removeprefix(f"{key}: ")


def name_pattern(text: str) -> str:
    """A ``--name`` pattern: a non-empty substring of record names, or ``re:REGEX`` that compiles."""
    from torchdebug.options import patterns  # here: only when the option is given, not for `--help`

    if not text:
        raise argparse.ArgumentTypeError("got '', expected a substring or 're:REGEX' of record names")
    try:
        return patterns("name", text)[0]
    except ConfigError as error:
        raise argparse.ArgumentTypeError(_message(error, "name")) from None


def indices(text: str) -> list[int]:
    """Steps or ranks: ``3``, ``0|3-5|10`` or ``0,2,4`` (ranges inclusive), sorted."""
    from torchdebug.options import index_set  # here: only when the option is given, not for `--help`

    try:
        selected = index_set("indices", text.replace(",", "|"))
    except ConfigError as error:
        raise argparse.ArgumentTypeError(_message(error, "indices")) from None
    if not selected:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected indices like 3, 0|3-5 or 0,2,4")
    return sorted(selected)


def integer(minimum: int) -> Callable[[str], int]:
    """An int of at least ``minimum``."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"got {text!r}, expected an integer >= {minimum}")
        return value

    check.__name__ = f"integer >= {minimum}"
    return check


def number(minimum: float, *, inclusive: bool = True) -> Callable[[str], float]:
    """A finite float above ``minimum`` (or equal to it when ``inclusive``)."""

    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            relation = ">=" if inclusive else ">"
            raise argparse.ArgumentTypeError(f"got {text!r}, expected a finite number {relation} {minimum:g}")
        return value

    check.__name__ = f"number >= {minimum}"
    return check
