"""``CompilerConfig``: the options of the torchdebug compile backend, checked when assigned.

Options are plain attributes on small nested objects (``config.debug.graph_dump.type = "py"``).
Assigning an unknown option or a bad value raises :class:`~torchdebug.errors.ConfigError` at once,
with one line naming the dotted key and what is allowed, so a typo fails at the line that made it
rather than silently after a long compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdebug.errors import ConfigError

MODES = ("max-autotune", "reduce-overhead", "aot_eager", "eager")
GRAPH_DUMP_TYPES = ("txt", "py", "json", "dot")


def _one_of(choices: tuple[Any, ...]) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{key}: got {value!r}, expected one of {allowed}")
        return value

    return check


def _optional_one_of(choices: tuple[Any, ...]) -> Callable[[str, Any], Any]:
    check = _one_of(choices)
    return lambda key, value: None if value is None else check(key, value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected True or False")
    return value


def _optional_path(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: got {value!r}, expected a folder path (str) or None")
    return value


def _optional_graph_pass(key: str, value: Any) -> Any:
    """A user FX pass: a callable taking a ``torch.fx.Graph`` (inductor's custom-pass contract)."""
    if value is not None and not callable(value):
        raise ConfigError(
            f"{key}: got {value!r}, expected None or a callable taking a torch.fx.Graph "
            "(a torch._inductor.custom_graph_pass.CustomGraphPass keeps the FX graph cache usable)"
        )
    return value


class _Options:
    """Base of the option groups: fixed fields, each checked by its validator on assignment."""

    # name -> (default, validator); a validator of None marks a nested option group
    _fields: dict[str, tuple[Any, Callable[[str, Any], Any] | None]] = {}

    def __init__(self, prefix: str) -> None:
        object.__setattr__(self, "_prefix", prefix)
        for name, (default, validator) in self._fields.items():
            if validator is None:
                object.__setattr__(self, name, default(f"{prefix}{name}."))
            else:
                object.__setattr__(self, name, default)

    def __setattr__(self, name: str, value: Any) -> None:
        key = f"{self._prefix}{name}"
        if name not in self._fields:
            allowed = ", ".join(repr(f) for f in self._fields)
            raise ConfigError(f"{key}: unknown option, expected one of {allowed}")
        validator = self._fields[name][1]
        if validator is None:
            raise ConfigError(f"{key}: is a group of options; set its fields, e.g. {key}.{self._first_leaf(name)}")
        object.__setattr__(self, name, validator(key, value))

    def _first_leaf(self, name: str) -> str:
        return next(iter(getattr(self, name)._fields))

    def to_dict(self) -> dict[str, Any]:
        """The options as a nested dict (callables as their qualified names), for ``config.json``."""
        out: dict[str, Any] = {}
        for name, (_, validator) in self._fields.items():
            value = getattr(self, name)
            if validator is None:
                out[name] = value.to_dict()
            elif callable(value):
                out[name] = getattr(value, "__qualname__", type(value).__qualname__)
            else:
                out[name] = value
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


class GraphDumpConfig(_Options):
    """``debug.graph_dump``: extra graph dumps in one format.

    - ``type``: ``None`` (off), ``"txt"``, ``"py"`` (runnable repro), ``"json"`` or ``"dot"``
      (plus ``.svg`` when Graphviz ``dot`` is installed). Written for the first and the last graph of
      every phase, with the same stem as the matching ``.txt`` dump.
    - ``path``: folder for these dumps when ``TORCH_COMPILE_DEBUG`` is off (default ``./torchdebug_graphs``);
      with it on, they go into the debug folder next to the ``.txt`` dumps.
    """

    _fields = {"type": (None, _optional_one_of(GRAPH_DUMP_TYPES)), "path": (None, _optional_path)}


class DebugConfig(_Options):
    """``debug``: what to dump and how to run.

    - ``graph_dump``: see :class:`GraphDumpConfig`.
    - ``run_eagerly``: run each AOT graph after the pass pipeline eagerly instead of generating code
      (separates a pass bug from a code-generation bug). Default False.
    """

    _fields = {"graph_dump": (GraphDumpConfig, None), "run_eagerly": (False, _bool)}


class CompilerConfig(_Options):
    """Options of :func:`torchdebug.get_backend`.

    - ``mode``: ``"max-autotune"`` (default: inductor compiles the whole graph), ``"reduce-overhead"``
      (inductor with CUDA graphs; graphs without CUDA tensors run without them and a warning says so
      once), ``"aot_eager"`` (AOT autograd, then the ATen graphs run eagerly), ``"eager"`` (the Dynamo
      graph runs as is).
    - ``debug``: see :class:`DebugConfig`.
    - ``post_grad_custom_pre_pass`` / ``post_grad_custom_post_pass``: user FX passes on each AOT
      graph (forward, backward, inference), before and after the pipeline's own passes; dumped like ours.

    Example::

        config = CompilerConfig()
        config.debug.graph_dump.type = "py"
        model = torch.compile(model, backend=torchdebug.get_backend(config))
    """

    _fields = {
        "mode": ("max-autotune", _one_of(MODES)),
        "debug": (DebugConfig, None),
        "post_grad_custom_pre_pass": (None, _optional_graph_pass),
        "post_grad_custom_post_pass": (None, _optional_graph_pass),
    }

    def __init__(self, **options: Any) -> None:
        """Top-level options may be given as keywords: ``CompilerConfig(mode="aot_eager")``."""
        super().__init__("")
        for name, value in options.items():
            setattr(self, name, value)
