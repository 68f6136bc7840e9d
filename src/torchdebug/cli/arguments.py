"""Arguments shared by the subcommands: each checks a value as argparse reads it, so a bad one is a
one-line usage error (exit 2) naming the option, never a traceback from deep inside a command.

A config's options (``CompareConfig``, ``DiagnoseConfig``) become flags with :func:`add_options`,
generated from the annotated fields that declare them (``torchdebug.options``): the option's word,
help, ``Literal`` choices and default, its check run on each value as it is read, and its former
spellings hidden, with a warning. The other argument types follow the config's rules: a ``--name`` pattern is
a substring or ``re:REGEX``, as in ``Debugger(list=...)``; ``--step`` and ``--rank`` take
``0|3-5|10`` as the config's ``step`` and ``rank`` do, and commas as well (``0,2,4``).
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Callable

from torchdebug.errors import ConfigError
from torchdebug.options import Options, OptionSpec, specs

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any


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


def add_options(parser: argparse.ArgumentParser, kind: type[Options]) -> None:
    """A flag for each option of ``kind``, generated from its declaration (see
    :class:`~torchdebug.options.Flag`): the value lands in ``args.<option>``, already checked as the
    config checks it."""
    for spec in specs(kind):
        flag, default = spec.flag, spec.default
        long = f"--{(flag.word or spec.name).replace('_', '-')}"
        names = [*([flag.short] if flag.short else []), long]
        doc = spec.doc.replace("%", "%%")  # argparse formats help with %
        if spec.kind is bool:
            off = f"--no-{long[2:]}"
            shown = long if default else off
            parser.add_argument(*names, off, action=_Switch, dest=spec.name, default=default, help=f"{doc} (default: {shown})")
            for old in flag.old:  # a former switch did what the new one does: --no-OLD sets the default
                back = old.startswith("--no-")
                new, value = (off, False) if back != default else (long, True)
                parser.add_argument(old, action=_Renamed, new=new, const=value, dest=spec.name, help=argparse.SUPPRESS)
            continue
        choices = [choice for choice in spec.choices or () if choice is not None] or None
        notes = [f"one of: {', '.join(choices)}"] if choices else []
        if default not in (None, {}, []):
            notes.append(f"default: {default}")
        shown = f" ({'; '.join(notes)})" if notes else ""
        read, metavar = _reader(spec), flag.metavar or spec.name.upper()
        action = _Merge if flag.repeated else "store"
        parser.add_argument(
            *names,
            action=action,
            type=read,
            dest=spec.name,
            metavar=metavar,
            default=default,
            choices=choices,
            help=f"{doc}{shown}",
        )
        for old in flag.old:
            parser.add_argument(
                old, action=_Renamed, new=long, type=read, dest=spec.name, metavar=metavar, help=argparse.SUPPRESS
            )


def options_of(args: argparse.Namespace, kind: type[Options]) -> dict[str, Any]:
    """The options :func:`add_options` read into ``args``, by name."""
    return {spec.name: getattr(args, spec.name) for spec in specs(kind)}


def _reader(spec: OptionSpec) -> Callable[[str], Any]:
    """``text -> value``: the flag's parse, then the option's check; its error without the key
    (argparse names the flag) and quoting the text as typed (``got '0'``, not ``got 0.0``)."""

    def read(text: str) -> Any:
        try:
            value = spec.parse(text)
            return spec.check(spec.name, value)
        except ConfigError as error:
            message = _message(error, spec.name)
            got = f"got {value!r},"
            raise argparse.ArgumentTypeError(
                f"got {text!r},{message[len(got) :]}" if message.startswith(got) else message
            ) from None
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    read.__name__ = spec.name  # argparse's "invalid NAME value" when it wraps an error itself
    return read


class _Switch(argparse.Action):
    """``--word`` sets the option, ``--no-word`` clears it."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        setattr(namespace, self.dest, not (option or "").startswith("--no-"))


class _Merge(argparse.Action):
    """A repeated flag whose items are mappings: each merged into the value (a later one wins)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), **values})


class _Renamed(argparse.Action):
    """A flag's former spelling: still works (a switch sets ``const``, another takes its value) and
    warns, naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        nargs = 0 if "const" in kwargs else None
        super().__init__(option_strings, dest, nargs=nargs, default=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        warnings.warn(f"{option} is deprecated; use {self.new}", FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
