"""The one kind of configuration object torchdebug has: an option is declared once, as an annotated field.

Every config is a keyword-only, slotted dataclass deriving from :class:`Options`, declared with
:func:`configclass`. A field's annotation is its type and its rule; :func:`option` adds what it means
(``doc``), its default and how the command line spells it (:class:`Flag`)::

    task: Literal["statistics", "tensor"] = option("What to capture.", default="statistics")
    window: Annotated[int, AtLeast(2)] = option("Steps kept.", default=32)

From the annotation come the check run when the object is built and whenever the field is assigned,
the JSON schema (:meth:`Options.json_schema`), the command-line flag
(``torchdebug.cli.arguments.add_options``), the *Options* part of a public function's docstring
(:func:`accepts`) and the constructor's signature for type checkers (``dataclass_transform``). Every
error is a :class:`~torchdebug.errors.ConfigError` shaped ``dotted.key: got VALUE, expected WHAT``;
old spellings stay readable with a ``FutureWarning`` (``_ALIASES``, :attr:`Flag.old`). The rest:
docs/architecture.md, "Configuration".
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import math
import os
import re
import sys
import types
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, cast, get_args, get_origin, overload

from torchdebug.errors import ConfigError

TYPE_CHECKING = False  # typing's; dataclass_transform is in typing from Python 3.11 only
if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: object) -> Callable[[T], T]:
        return lambda function: function


T = TypeVar("T")
C = TypeVar("C", bound="Options")
F = TypeVar("F", bound=Callable[..., Any])

Validator = Callable[[str, Any], Any]
"""``check(dotted_key, value) -> normalised value``; raises :class:`ConfigError`."""


# -- what an annotation may carry besides its type -----------------------------------------------------


# Plain classes, not dataclasses: the command line's help makes them, and each dataclass costs it 2 ms.
class AtLeast:
    """``Annotated[int, AtLeast(1)]``: a number no smaller than ``minimum``."""

    __slots__ = ("minimum",)

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum


class Above:
    """``Annotated[float, Above(0)]``: a number larger than ``minimum``."""

    __slots__ = ("minimum",)

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum


class Text:
    """``Annotated[str, Text("a folder path")]``: a non-empty string (or path); ``what`` names it in
    messages."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


class Check:
    """``Annotated[T, Check(read)]``: what only code can say of a value (``'0|3-5'`` is steps 0, 3, 4
    and 5; a mapping file is read; a folder must exist): ``read(dotted_key, value)`` returns the
    value as ``T``. ``schema`` is its JSON-schema entry, for what files may hold. ``accepts``: the
    type a public function's keyword takes where it is wider than ``T`` (``'0|3-5'`` for steps), as
    annotation text whose names ``read``'s module binds (or ``collections.abc``'s, ``Path``); the API
    stub writes it (tools/api_stub.py)."""

    __slots__ = ("accepts", "read", "schema")

    def __init__(self, read: Validator, schema: Mapping[str, Any] | None = None, accepts: str | None = None) -> None:
        self.read = read
        self.schema = schema or {}
        self.accepts = accepts


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    """How an option reads from the command line: ``--WORD`` (the option's name, ``_`` as ``-``)
    with the option's doc as help, its ``Literal`` choices and its default; a ``bool`` option is a
    switch, ``--WORD`` / ``--no-WORD``. The option's check takes what ``parse`` returns."""

    parse: Callable[[str], Any] | None = None
    """Text -> value; raises ``ValueError`` with the message to show. By default: an ``int`` or
    ``float`` option reads a number (:func:`integer_text`, :func:`number_text`), others the text."""
    word: str | None = None
    """The flag's word where it is not the option's name: the singular of a repeated option."""
    short: str | None = None
    """A one-letter spelling (``-o``)."""
    metavar: str | None = None
    repeated: bool = False
    """Given once per item; each item parses to a mapping, merged into the option's value."""
    old: tuple[str, ...] = ()
    """Former spellings, still read with a ``FutureWarning``: a switch's sets what the new flag sets
    against the default (``--replay`` is ``--rerun``) or, spelled ``--no-...``, the
    default (``--no-replay`` is ``--no-rerun``); another's takes the same value."""


class OptionSpec:
    """One option as its annotation and :func:`option` declare it, resolved when its class is made."""

    __slots__ = ("accepts", "check", "choices", "doc", "field", "flag", "kind", "name", "parse", "schema")

    def __init__(
        self,
        field: dataclasses.Field[Any],
        check: Validator,
        schema: Mapping[str, Any],
        choices: tuple[Any, ...] | None,
        kind: type,
        parse: Callable[[str], Any],
    ) -> None:
        self.field, self.name, self.doc = field, field.name, field.metadata["doc"]
        self.flag: Flag = field.metadata["flag"]
        self.check = check
        """Runs on every value given (:data:`Validator`)."""
        self.schema = schema
        """Its JSON-schema entry without description and default (a group's is its class's schema)."""
        self.choices = choices
        """The values a ``Literal`` allows (the command line's choices); ``None`` where any value of the type goes."""
        self.kind = kind
        """``bool``, ``int``, ``float``, ``str``, an :class:`Options` class (a group) or ``object``."""
        self.parse = parse
        """How the command line reads one value: the flag's ``parse``, else derived from ``kind``."""
        self.accepts: tuple[str, str] | None = None
        """``(annotation text, module binding its names)`` of what a keyword takes where it is
        wider than the field's type (:attr:`Check.accepts`)."""

    @property
    def default(self) -> Any:
        """The default value (a fresh one from its factory)."""
        return field_default(self.field)


_MUTABLE = (list, dict, set)


@overload
def option(doc: str, *, default: T, flag: Flag | None = None) -> T: ...
@overload
def option(doc: str, *, default_factory: Callable[[], T], flag: Flag | None = None) -> T: ...
def option(
    doc: str, *, default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING, flag: Flag | None = None
) -> Any:
    """A field of an :class:`Options` class: what the option means (``doc``), its default (a list,
    dict or set is copied for each object) and, where the name or text is not enough, its
    :class:`Flag`. Its type and rule are the field's annotation."""
    metadata = {"doc": doc, "flag": flag or Flag()}
    if isinstance(default, _MUTABLE):
        return dataclasses.field(default_factory=functools.partial(type(default), default), metadata=metadata)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def number_text(text: str) -> float | str:
    """A command-line number: the finite float ``text`` spells, else ``text`` (the check names
    what it expects)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def integer_text(text: str) -> int | str:
    """A command-line integer: the int ``text`` spells, else ``text`` (the check names what it expects)."""
    try:
        return int(text)
    except ValueError:
        return text


@dataclass_transform(kw_only_default=True, field_specifiers=(option,))
def configclass(cls: type[C]) -> type[C]:
    """Make ``cls`` (a subclass of :class:`Options`) a keyword-only slotted dataclass whose options
    are resolved from its annotations, and whose constructor names an unknown keyword in a
    :class:`ConfigError` and accepts deprecated ones."""
    cls = dataclasses.dataclass(kw_only=True, slots=True, repr=False)(cls)
    names = _Names(vars(sys.modules[cls.__module__]))
    cls._specs = {f.name: _spec(f, names.evaluate(f.type, f"{cls.__name__}.{f.name}"), cls) for f in dataclasses.fields(cls)}
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self: Options, **options: Any) -> None:
        for key in list(options):
            if key in cls._ALIASES:
                options.update(cls._translate_static(key, options.pop(key), ""))
            elif key not in cls._specs:
                raise ConfigError(f"{key}: unknown option, expected one of {', '.join(map(repr, cls._specs))}")
        generated(self, **options)

    setattr(cls, "__init__", __init__)  # noqa: B010 - the generated one, wrapped
    return cls


def specs(kind: type[Options]) -> tuple[OptionSpec, ...]:
    """The options of ``kind``, in declaration order."""
    return tuple(kind._specs.values())


class Options:
    """Base of every torchdebug config (see the module docstring); declare one with
    :func:`configclass` and fields made by :func:`option`."""

    __slots__ = ("_assigned", "_prefix", "_ready")
    _assigned: set[str]
    _prefix: str

    if TYPE_CHECKING:  # what makes a class a dataclass to type checkers; configclass sets it
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    _specs: ClassVar[dict[str, OptionSpec]] = {}
    """Option name -> its :class:`OptionSpec` (set by :func:`configclass`)."""
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
        for spec in self._specs.values():
            value = getattr(self, spec.name)
            if not isinstance(value, Options) and value != spec.default:
                assigned.add(spec.name)
            object.__setattr__(self, spec.name, self._validate(spec, value))
        object.__setattr__(self, "_assigned", assigned)
        self.check()
        object.__setattr__(self, "_ready", True)

    if not TYPE_CHECKING:  # hidden from type checkers, which then see each option's own type

        def __setattr__(self, name: str, value: Any) -> None:
            if name.startswith("_"):  # our own slots (also set by unpickling)
                object.__setattr__(self, name, value)
                return
            if name in self._ALIASES:
                for new, translated in self._translate(name, value).items():
                    setattr(self, new, translated)
                return
            if name not in self._specs:
                raise ConfigError(f"{self._key(name)}: unknown option, expected one of {', '.join(map(repr, self._specs))}")
            if not getattr(self, "_ready", False):  # the dataclass __init__; __post_init__ validates
                object.__setattr__(self, name, value)
                return
            new = self._validate(self._specs[name], value)
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

        def __getattr__(self, name: str) -> Any:
            """Reading a deprecated name reads its replacement (after a warning)."""
            if name in type(self)._ALIASES:
                new = type(self)._ALIASES[name]
                warnings.warn(f"{self._key(name)} is deprecated; read {self._key(new)}", FutureWarning, stacklevel=2)
                return getattr(self, new)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def assigned(self) -> frozenset[str]:
        """The options given a value other than their default (at construction or later)."""
        return frozenset(self._assigned)

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
        return dataclasses.replace(config, **options) if options else config

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build from a mapping (keyword options, a file's contents), rejecting unknown keys by name;
        deprecated names (``_ALIASES``) are accepted with a warning."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: got {type(data).__name__}, expected a mapping of option names to values")
        values: dict[str, Any] = {}
        for key, value in data.items():
            translated = cls._translate_static(key, value, "") if key in cls._ALIASES else {key: value}
            for new, new_value in translated.items():
                if new not in cls._specs:
                    raise ConfigError(f"{new}: unknown config key, expected one of {', '.join(cls._specs)}")
                values[new] = new_value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values: groups nested, index sets as sorted lists, callables by qualified name."""
        out: dict[str, Any] = {}
        for name in self._specs:
            value = getattr(self, name)
            if isinstance(value, Options):
                value = value.to_dict()
            elif isinstance(value, frozenset):
                value = sorted(value)
            elif callable(value):
                value = getattr(value, "__qualname__", type(value).__qualname__)
            out[name] = value
        return out

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """JSON schema of this config as a file, generated from the annotations."""
        properties = {}
        for spec in cls._specs.values():
            if issubclass(spec.kind, Options):
                prop = {"description": spec.doc, **spec.kind.json_schema()}
                prop.pop("$schema", None)
            else:
                prop = {"description": spec.doc, **spec.schema, "default": _json_value(spec.default)}
            properties[spec.name] = prop
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
    def _key(self, name: str) -> str:
        return f"{getattr(self, '_prefix', '')}{name}"

    def _validate(self, spec: OptionSpec, value: Any) -> Any:
        value = spec.check(self._key(spec.name), value)
        if isinstance(value, Options):
            value._set_prefix(self._key(spec.name) + ".")
        return value

    def _set_prefix(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)
        for name in self._specs:
            value = getattr(self, name)
            if isinstance(value, Options):
                value._set_prefix(f"{prefix}{name}.")

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


def field_default(f: dataclasses.Field[Any]) -> Any:
    """An option's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _json_value(value: Any) -> Any:
    return sorted(value) if isinstance(value, frozenset) else value


def accepts(kind: type[Options]) -> Callable[[F], F]:
    """Decorate a function whose last parameter is ``config`` (a ``kind``) so that callers give it
    ``config=``, keyword options checked by ``kind`` (the field names, old spellings with a
    warning), or both (the keywords win). The options stay declared once, in ``kind``: its fields
    make the function's runtime signature and the *Options* part of its docstring; type checkers
    read the same signature from the generated ``torchdebug/__init__.pyi`` (``make stubs``)."""
    import inspect  # here: the command line imports this module, and its help needs no inspect

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, config: Options | None = None, **options: Any) -> Any:
            return function(*args, config=kind.build(config, **options))

        parameters = list(inspect.signature(function).parameters.values())[:-1]
        parameters.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind.__name__))
        for spec in specs(kind):
            parameters.append(
                inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=spec.default, annotation=spec.field.type)
            )
        setattr(wrapper, "__signature__", inspect.signature(function).replace(parameters=parameters))  # noqa: B010
        setattr(wrapper, "__options__", kind)  # noqa: B010 - for tools/api_stub.py
        wrapper.__doc__ = _with_options_doc(function.__doc__ or "", kind)
        return cast(F, wrapper)

    return decorate


def _with_options_doc(doc: str, kind: type[Options]) -> str:
    """``doc`` with an *Options* section listing ``kind``'s fields, before its *Returns* if it has one."""
    import textwrap  # here, as inspect in accepts()

    lines = doc.expandtabs().splitlines()
    pad = " " * min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
    section = [f"{pad}Options (:class:`{kind.__module__}.{kind.__name__}`; keyword options win over ``config``):"]
    for spec in specs(kind):
        default = spec.default
        text = f"{spec.name}: {spec.doc}" + ("" if default is None else f" Default: ``{default!r}``.")
        section.append(textwrap.fill(text, 100, initial_indent=pad + " " * 4, subsequent_indent=pad + " " * 8))
    returns = next((i for i, line in enumerate(lines) if line.strip() == "Returns:"), len(lines))
    while returns > 0 and not lines[returns - 1].strip():
        returns -= 1
    return "\n".join([*lines[:returns], "", *section, *lines[returns:]]).rstrip() + "\n"


# -- from an annotation to a check, a schema and choices ------------------------------------------------


class _Names(dict[str, Any]):
    """The names an annotation reads: its module's, and for a name only type checkers import
    (``if TYPE_CHECKING:``, so that the command line's help loads no torch) a stand-in class; an
    option of such a type needs a :class:`Check`."""

    def __init__(self, module_names: Mapping[str, Any]) -> None:
        super().__init__()
        self.module_names = module_names

    def __missing__(self, name: str) -> Any:
        if name in self.module_names:
            return self.module_names[name]
        return getattr(builtins, name) if hasattr(builtins, name) else type(name, (), {"__module__": "typing-only"})

    def evaluate(self, annotation: Any, where: str) -> Any:
        if not isinstance(annotation, str):
            return annotation
        try:
            return eval(annotation, {"__builtins__": {}}, self)  # our own annotations, read as typing.get_type_hints would
        except Exception as error:
            raise TypeError(f"{where}: cannot read the annotation {annotation!r} ({error})") from None


_PARSE: dict[type, Callable[[str], Any]] = {int: integer_text, float: number_text}


def _spec(f: dataclasses.Field[Any], annotation: Any, owner: type) -> OptionSpec:
    check, schema, choices, kind = _derive(annotation, f"{owner.__name__}.{f.name}")
    spec = OptionSpec(f, check, schema, choices, kind, f.metadata["flag"].parse or _PARSE.get(kind, str))
    read = (
        next((m for m in get_args(annotation)[1:] if isinstance(m, Check)), None) if get_origin(annotation) is Annotated else None
    )
    if read is not None and read.accepts is not None:
        spec.accepts = (read.accepts, read.read.__module__)
    return spec


def _derive(tp: Any, where: str) -> tuple[Validator, dict[str, Any], tuple[Any, ...] | None, type]:
    """``(check, schema, choices, kind)`` of an annotation (see the module docstring)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        base, *meta = args
        read = next((m for m in meta if isinstance(m, Check)), None)
        if read is not None:
            return read.read, dict(read.schema), None, _kind(base)
        bound = next((m for m in meta if isinstance(m, (AtLeast, Above))), None)
        if bound is not None and base in (int, float):
            schema_key = "minimum" if isinstance(bound, AtLeast) else "exclusiveMinimum"
            check = number(bound.minimum, integer=base is int, inclusive=isinstance(bound, AtLeast))
            return check, {"type": "integer" if base is int else "number", schema_key: bound.minimum}, None, base
        said = next((m for m in meta if isinstance(m, Text)), None)
        if said is not None and base is str:
            return text(said.what), {"type": "string"}, None, str
        raise TypeError(f"{where}: no check for {tp!r}")
    if origin is Literal:
        return one_of(*args), {"enum": list(args)}, args, _kind(args[0])
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"{where}: no check for {tp!r}; one type or None, or a Check")
        inner, schema, values, kind = _derive(rest[0], where)
        return optional(inner), _or_null(schema), values, kind
    if origin is list and get_origin(args[0]) is Literal:
        allowed = get_args(args[0])
        return choices(allowed), {"type": "array", "items": {"enum": list(allowed)}}, None, list
    if tp is bool:
        return boolean, {"type": "boolean"}, None, bool
    if isinstance(tp, type) and issubclass(tp, Options):
        return group(tp), {}, None, tp
    raise TypeError(f"{where}: no check for {tp!r}; annotate it with Literal, bool, a bounded number, Text or a Check")


def _kind(tp: Any) -> type:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        rest = [arg for arg in get_args(tp) if arg is not type(None)]
        tp = rest[0] if len(rest) == 1 else object
    tp = type(tp) if not isinstance(tp, type) else tp
    return tp if tp in (bool, int, float, str) or issubclass(tp, Options) else object


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return schema


# -- checks shared by every config --------------------------------------------------------------------


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
        types_ = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, types_):
            raise ConfigError(f"{key}: got {value!r}, expected {kind} {bound}")
        if not math.isfinite(value) or value < minimum or (not inclusive and value == minimum):
            raise ConfigError(f"{key}: got {value!r}, expected {kind} {bound}")
        return value

    return check


def text(what: str) -> Validator:
    """A non-empty string or path (``what`` says what it holds, for the message)."""

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
    elif isinstance(value, (list, tuple, set, frozenset, range)):
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
            first = next(iter(kind._specs))
            raise ConfigError(
                f"{key}: got {value!r}, expected a {kind.__name__} (a group of options: set its fields, e.g. {key}.{first})"
            )
        return value

    return check


# -- annotations every config uses -------------------------------------------------------------------

Folder = Annotated[str, Text("a folder path")]
"""A folder's path (a ``Path`` is read as its text)."""
Indices = Annotated[
    Collection[int] | None,
    Check(index_set, schema={"type": ["array", "string", "integer", "null"]}, accepts="Collection[int | str] | str | int | None"),
]
"""Steps or ranks (``None``: all): ``[0, 3, 4, 5]``; in files and keyword options also ``[0, '3-5']``
or ``'0|3-5'``; held as a ``frozenset``."""
Patterns = Annotated[
    list[str], Check(patterns, schema={"type": "array", "items": {"type": "string"}}, accepts="str | Collection[str] | None")
]
"""Name patterns: exact names, substrings or ``re:REGEX`` (a single string is a list of one); held as a list."""
