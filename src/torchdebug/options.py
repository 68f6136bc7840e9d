"""The one kind of configuration object torchdebug has, and the validators every config shares.

Every config (:class:`~torchdebug.config.DebuggerConfig`, :class:`~torchdebug.compile.CompilerConfig`
and its groups, compare's and diagnose's options) is a keyword-only, slotted dataclass deriving
from :class:`Options`. Each field names its validator in its metadata (:func:`option`); the
validator runs when the object is built and again whenever the field is assigned, and the
cross-field rules (:meth:`Options.check`) run after both, so a bad value or combination fails at the
line that made it, never hours into a run. Every error is a :class:`~torchdebug.errors.ConfigError`
of one shape: ``dotted.key: got VALUE, expected WHAT`` (plus the fix where there is one).

Each option is declared once, as a field, and everything else is generated from it: the JSON schema
(:meth:`Options.json_schema`), the command-line flag (its :class:`Flag`: ``--growth`` for ``growth``,
help, choices and default from the field; ``torchdebug.cli.arguments.add_options``), and the keyword
options of a public function that takes the config (:func:`accepts`).

Old spellings of renamed options stay readable and writable as aliases (``_ALIASES``) with a
``FutureWarning`` that names the new one, and so do renamed flags (:attr:`Flag.old`); keys that
other tools' config files use (TorchAir's ``dump_*`` in scene files, ptdbg's ``L0``/``L1`` levels)
are read by the code that reads those files.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping

from torchdebug.errors import ConfigError

TYPE_CHECKING = False  # typing's, without importing typing: the command line's help imports this module
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    T = TypeVar("T")
    C = TypeVar("C", bound="Options")
    F = TypeVar("F", bound=Callable[..., Any])

    Validator = Callable[[str, Any], Any]
    """``check(dotted_key, value) -> normalised value``; raises :class:`ConfigError`."""


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    """How an option reads from the command line: ``--WORD`` (the option's name, ``_`` as ``-``)
    with the option's doc as help, its ``enum`` as choices and its default; a ``bool`` option is a
    switch, ``--WORD`` / ``--no-WORD``. The option's validator checks what ``parse`` returns."""

    parse: Callable[[str], Any] = str
    """Text -> value; raises ``ValueError`` with the message to show (:func:`number_text` and
    :func:`integer_text` leave text that is no number for the validator to name)."""
    word: str | None = None
    """The flag's word where it is not the option's name: the singular of a repeated option."""
    short: str | None = None
    """A one-letter spelling (``-o``)."""
    metavar: str | None = None
    repeated: bool = False
    """Given once per item; each item parses to a mapping, merged into the option's value."""
    old: tuple[str, ...] = ()
    """Former spellings, still read with a ``FutureWarning``: a switch's sets what the new flag sets
    against the default (``--statistics-only`` is ``--no-tensors``) or, spelled ``--no-...``, the
    default (``--no-replay`` is ``--no-rerun``); another's takes the same value."""


def option(doc: str, check: Validator, *, flag: Flag | None = None, **schema: Any) -> dict[str, Any]:
    """Field metadata: what the option means (``doc``), its validator, how the command line reads it
    (``flag``; by default the option's name, the text as it is, or a switch for a ``bool``) and its
    JSON-schema entry (an ``enum`` there is also the flag's choices)."""
    return {"doc": doc, "check": check, "schema": schema, "flag": flag or Flag()}


def number_text(text: str) -> float | str:
    """A command-line number: the finite float ``text`` spells, else ``text`` (the validator names
    what it expects)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def integer_text(text: str) -> int | str:
    """A command-line integer: the int ``text`` spells, else ``text`` (the validator names what it expects)."""
    try:
        return int(text)
    except ValueError:
        return text


def configclass(cls: type[T]) -> type[T]:
    """Make ``cls`` (a subclass of :class:`Options`) a keyword-only slotted dataclass whose
    constructor names an unknown keyword in a :class:`ConfigError` and accepts deprecated ones."""
    cls = dataclasses.dataclass(kw_only=True, slots=True, repr=False)(cls)
    generated = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @functools.wraps(generated)
    def __init__(self: Options, **options: Any) -> None:
        for key in list(options):
            if key in cls._ALIASES:  # type: ignore[attr-defined]
                options.update(cls._translate_static(key, options.pop(key), ""))  # type: ignore[attr-defined]
            elif key not in names:
                raise ConfigError(f"{key}: unknown option, expected one of {', '.join(map(repr, names))}")
        generated(self, **options)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


class Options:
    """Base of every torchdebug config (see the module docstring); declare one with
    :func:`configclass` and fields whose metadata comes from :func:`option`."""

    __slots__ = ("_assigned", "_prefix", "_ready")

    _ALIASES: ClassVar[Mapping[str, str]] = {}
    """Deprecated option name -> its new name."""
    _ALIAS_VALUES: ClassVar[Mapping[str, Mapping[Any, Any]]] = {}
    """Deprecated option name -> old values it took -> the new value, or a mapping of the new
    options and values it sets where it now takes several."""

    # -- construction and assignment -------------------------------------------------------------
    def __post_init__(self) -> None:
        if not hasattr(self, "_prefix"):
            object.__setattr__(self, "_prefix", "")
        assigned = set()
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            default = field_default(f)
            if not isinstance(value, Options) and value != default:
                assigned.add(f.name)
            object.__setattr__(self, f.name, self._validate(f, value))
        object.__setattr__(self, "_assigned", assigned)
        self.check()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):  # our own slots (also set by unpickling)
            object.__setattr__(self, name, value)
            return
        if name in self._ALIASES:
            for new, translated in self._translate(name, value).items():
                setattr(self, new, translated)
            return
        known = self._field_map()
        if name not in known:
            raise ConfigError(f"{self._key(name)}: unknown option, expected one of {', '.join(map(repr, known))}")
        if not getattr(self, "_ready", False):  # the dataclass __init__; __post_init__ validates
            object.__setattr__(self, name, value)
            return
        new = self._validate(known[name], value)
        old, was_assigned = getattr(self, name), name in self._assigned
        object.__setattr__(self, name, new)
        self._assigned.add(name)
        try:
            self.check()
        except ConfigError:
            object.__setattr__(self, name, old)
            if not was_assigned:
                self._assigned.discard(name)
            raise

    @property
    def assigned(self) -> frozenset[str]:
        """The options given a value other than their default (at construction or later)."""
        return frozenset(self._assigned)

    def __getattr__(self, name: str) -> Any:
        """Reading a deprecated name reads its replacement (after a warning)."""
        if name in type(self)._ALIASES:
            new = type(self)._ALIASES[name]
            warnings.warn(f"{self._key(name)} is deprecated; read {self._key(new)}", FutureWarning, stacklevel=2)
            return getattr(self, new)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def check(self) -> None:
        """Cross-field rules; raise :class:`ConfigError` naming the keys involved. None by default."""

    # -- building from mappings (files, CLI, keyword arguments) ----------------------------------
    @classmethod
    def build(cls: type[C], config: C | None = None, /, **options: Any) -> C:
        """``config`` (the defaults when ``None``) with ``options`` set on top, all validated: what a
        function that takes ``config=`` and keyword options works with (:func:`accepts`)."""
        if config is None:
            return cls(**options)
        if type(config) is not cls:
            raise ConfigError(f"config: got {config!r}, expected a {cls.__name__} (or keyword options)")
        return dataclasses.replace(config, **options) if options else config  # type: ignore[type-var]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Options:
        """Build from a mapping (keyword options, a file's contents), rejecting unknown keys by name;
        deprecated names (``_ALIASES``) are accepted with a warning."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: got {type(data).__name__}, expected a mapping of option names to values")
        known = cls._field_map()
        values: dict[str, Any] = {}
        for key, value in data.items():
            translated = cls._translate_static(key, value, "") if key in cls._ALIASES else {key: value}
            for new, new_value in translated.items():
                if new not in known:
                    raise ConfigError(f"{new}: unknown config key, expected one of {', '.join(known)}")
                values[new] = new_value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values: groups nested, index sets as sorted lists, callables by qualified name."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Options):
                value = value.to_dict()
            elif isinstance(value, frozenset):
                value = sorted(value)
            elif callable(value):
                value = getattr(value, "__qualname__", type(value).__qualname__)
            out[f.name] = value
        return out

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """JSON schema of this config as a file, generated from the field metadata."""
        properties = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            default = field_default(f)
            if isinstance(default, Options):
                prop = {"description": f.metadata["doc"], **type(default).json_schema()}
                prop.pop("$schema", None)
            else:
                prop = {"description": f.metadata["doc"], **f.metadata["schema"], "default": default}
            properties[f.name] = prop
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"torchdebug {cls.__name__}",
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"

    # -- helpers ---------------------------------------------------------------------------------
    @classmethod
    def _field_map(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def _key(self, name: str) -> str:
        return f"{getattr(self, '_prefix', '')}{name}"

    def _validate(self, f: dataclasses.Field, value: Any) -> Any:
        value = f.metadata["check"](self._key(f.name), value)
        if isinstance(value, Options):
            value._set_prefix(self._key(f.name) + ".")
        return value

    def _set_prefix(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Options):
                value._set_prefix(f"{prefix}{f.name}.")

    def _translate(self, name: str, value: Any) -> dict[str, Any]:
        return self._translate_static(name, value, getattr(self, "_prefix", ""))

    @classmethod
    def _translate_static(cls, name: str, value: Any, prefix: str) -> dict[str, Any]:
        """The new options a deprecated one's value sets (one, or several where an old value now
        takes several options: ``_ALIAS_VALUES`` maps it to a mapping), after a warning naming them."""
        new = cls._ALIASES[name]
        mapped = cls._ALIAS_VALUES.get(name, {})
        target = mapped.get(value) if isinstance(value, str) else None
        if isinstance(target, Mapping):
            spelled = ", ".join(f"{prefix}{key}={each!r}" for key, each in target.items())
            warnings.warn(f"{prefix}{name}={value!r} is deprecated; use {spelled}", FutureWarning, stacklevel=4)
            return dict(target)
        note = "" if target is None else f" ({value!r} is now {target!r})"
        warnings.warn(f"{prefix}{name} is deprecated; use {prefix}{new}{note}", FutureWarning, stacklevel=4)
        return {new: value if target is None else target}


def field_default(f: dataclasses.Field) -> Any:
    """An option's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def accepts(kind: type[Options]) -> Callable[[F], F]:
    """Decorate a function whose last parameter is ``config`` (a ``kind``) so that callers give it
    ``config=``, keyword options checked by ``kind`` (the field names, old spellings with a
    warning), or both (the keywords win). The options stay declared once, in ``kind``: its fields
    make the function's signature and the *Options* part of its docstring."""
    import inspect  # here: the command line imports this module, and its help needs no inspect

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, config: Options | None = None, **options: Any) -> Any:
            return function(*args, config=kind.build(config, **options))

        parameters = list(inspect.signature(function).parameters.values())[:-1]
        parameters.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind.__name__))
        for f in dataclasses.fields(kind):  # type: ignore[arg-type]
            parameters.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=field_default(f), annotation=f.type)
            )
        wrapper.__signature__ = inspect.signature(function).replace(parameters=parameters)  # type: ignore[attr-defined]
        wrapper.__doc__ = _with_options_doc(function.__doc__ or "", kind)
        return wrapper  # type: ignore[return-value]

    return decorate


def _with_options_doc(doc: str, kind: type[Options]) -> str:
    """``doc`` with an *Options* section listing ``kind``'s fields, before its *Returns* if it has one."""
    import textwrap  # here, as inspect in accepts()

    lines = doc.expandtabs().splitlines()
    pad = " " * min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
    section = [f"{pad}Options (:class:`{kind.__module__}.{kind.__name__}`; keyword options win over ``config``):"]
    for f in dataclasses.fields(kind):  # type: ignore[arg-type]
        default = field_default(f)
        text = f"{f.name}: {f.metadata['doc']}" + ("" if default is None else f" Default: ``{default!r}``.")
        section.append(textwrap.fill(text, 100, initial_indent=pad + " " * 4, subsequent_indent=pad + " " * 8))
    returns = next((i for i, line in enumerate(lines) if line.strip() == "Returns:"), len(lines))
    while returns > 0 and not lines[returns - 1].strip():
        returns -= 1
    return "\n".join([*lines[:returns], "", *section, *lines[returns:]]).rstrip() + "\n"


# -- validators shared by every config ---------------------------------------------------------------


def one_of(*allowed: Any) -> Validator:
    """The value must be one of ``allowed``."""

    def check(key: str, value: Any) -> Any:
        if value not in allowed:
            raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(map(repr, allowed))}")
        return value

    return check


def optional(inner: Validator) -> Validator:
    """``None`` or what ``inner`` accepts."""
    return lambda key, value: None if value is None else inner(key, value)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected True or False")
    return value


def number(minimum: float, *, integer: bool = False, inclusive: bool = True) -> Validator:
    """A real number (an ``int`` if ``integer``) at least ``minimum`` (above it if not ``inclusive``)."""
    kind = "an integer" if integer else "a finite number"
    bound = f">= {minimum}" if inclusive else f"> {minimum}"

    def check(key: str, value: Any) -> Any:
        types = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, types):
            raise ConfigError(f"{key}: got {value!r}, expected {kind} {bound}")
        if not math.isfinite(value) or value < minimum or (not inclusive and value == minimum):
            raise ConfigError(f"{key}: got {value!r}, expected {kind} {bound}")
        return value

    return check


def text(what: str) -> Validator:
    """A non-empty string (``what`` says what it holds, for the message)."""

    def check(key: str, value: Any) -> str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: got {value!r}, expected {what}")
        return value

    return check


def choices(allowed: Iterable[str]) -> Validator:
    """A list of values from ``allowed`` (a single value is a list of one); never empty."""
    allowed = tuple(allowed)

    def check(key: str, value: Any) -> list[str]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise ConfigError(f"{key}: got {value!r}, expected a list of {', '.join(allowed)}")
        return [one_of(*allowed)(key, item) for item in items]

    return check


def patterns(key: str, value: Any) -> list[str]:
    """Name patterns: exact names, substrings or ``re:REGEX`` (a single string is a list of one)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: got {value!r}, expected a list of non-empty name patterns")
    for pattern in value:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as error:
                raise ConfigError(f"{key}: pattern {pattern!r} is not a valid regex ({error})") from None
    return list(value)


_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def index_set(key: str, value: Any) -> frozenset[int] | None:
    """A step or rank selection; ``None`` (or empty) means "all".

    Accepts ``"0|3-5|10"``, ``[0, "3-5", 10]``, a single int, or ``None``. Ranges are inclusive.
    """
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected step/rank indices like [0, '3-5'] or '0|3-5'")
    if isinstance(value, int):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = value.split("|")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigError(f"{key}: got {value!r}, expected step/rank indices like [0, '3-5'] or '0|3-5'")
    out: set[int] = set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.add(item)
            continue
        item_text = str(item).strip()
        match = _RANGE.match(item_text)
        if item_text.isdigit():
            out.add(int(item_text))
        elif match and int(match[1]) <= int(match[2]):
            out.update(range(int(match[1]), int(match[2]) + 1))
        else:
            raise ConfigError(f"{key}: got {item!r}, expected a non-negative integer or an inclusive range 'a-b' with a <= b")
    return frozenset(out)


def group(kind: type[Options]) -> Validator:
    """A nested group of options: an instance of ``kind``."""

    def check(key: str, value: Any) -> Options:
        if not isinstance(value, kind):
            first = dataclasses.fields(kind)[0].name  # type: ignore[arg-type]
            raise ConfigError(
                f"{key}: got {value!r}, expected a {kind.__name__} (a group of options: set its fields, e.g. {key}.{first})"
            )
        return value

    return check
