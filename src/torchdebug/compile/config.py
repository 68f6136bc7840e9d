"""``CompilerConfig``: the options of the torchdebug compile backend, checked when assigned.

Options are plain attributes on small nested objects (``config.debug.graph_dump.type = "py"``).
Assigning an unknown option or a bad value raises :class:`~torchdebug.errors.ConfigError` at once,
with one line naming the dotted key and what is allowed, so a typo fails at the line that made it
rather than silently after a long compile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchdebug.compile import dump_scenes
from torchdebug.config import parse_index_set
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


def _writable_folder(key: str, value: Any) -> str:
    """An existing folder this process can write into (the seed's rule: it is not created for you)."""
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(f"{key}: got {value!r}, expected an existing writable folder path")
    folder = Path(value)
    if not folder.is_dir():
        raise ConfigError(f"{key}: got {str(value)!r}, which is not an existing folder; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: got {str(value)!r}, which this process cannot write to; choose a writable folder")
    return str(value)


def _step_set(key: str, value: Any) -> frozenset[int] | None:
    return parse_index_set(key, value)


def _layer_names(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{key}: got {value!r}, expected node names separated by spaces, e.g. 'addmm mul_3'")
    return value


def _scene_file(key: str, value: Any) -> str | None:
    """A scene file is read and checked when assigned, so a bad one fails at that line."""
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(f"{key}: got {value!r}, expected the path of a JSON dump config file or None")
    dump_scenes.read_scene_file(str(value))
    return str(value)


class DumpConfig(_Options):
    """``dump_config``: op input/output data dumps inside compiled graphs (TorchAir's data dump).

    - ``enable_dump``: turn it on (default False).
    - ``dump_mode``: ``"all"`` (default), ``"input"`` or ``"output"`` slots of the selected nodes.
    - ``dump_path``: an existing writable folder (default ``"."``); runs go in new subfolders.
    - ``dump_step``: steps to dump, ``"0|3-5|10"``; ``None`` (default) dumps every step.
    - ``dump_layer``: node names as printed in the graph dumps, separated by spaces; with
      ``torchdebug.scope.data_dump()`` blocks the selection is the union; neither: every node.
    - ``dump_data``: ``"tensor"`` (default: tensors and statistics) or ``"stats"`` (statistics only,
      computed inside the compiled graph).
    - ``dump_stage``: ``"optimized"`` (default: values of the compiled kernels) or ``"original"`` (an
      FX interpreter over the graph before the backend's passes: the golden side).
    - ``dump_config_path``: a JSON scene file (see :mod:`torchdebug.compile.dump_scenes`); options
      assigned here win over it.
    """

    _fields = {
        "enable_dump": (False, _bool),
        "dump_mode": ("all", _one_of(dump_scenes.DUMP_MODES)),
        "dump_path": (".", _writable_folder),
        "dump_step": (None, _step_set),
        "dump_layer": (None, _layer_names),
        "dump_data": ("tensor", _one_of(dump_scenes.DUMP_DATA)),
        "dump_stage": ("optimized", _one_of(dump_scenes.DUMP_STAGES)),
        "dump_config_path": (None, _scene_file),
    }

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        object.__setattr__(self, "_explicit", set())

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        self._explicit.add(name)

    def settings(self) -> dump_scenes.DumpSettings:
        """The resolved dump: the scene file merged under the options assigned on this object."""
        file = dump_scenes.read_scene_file(self.dump_config_path) if self.dump_config_path else None
        explicit = {name: getattr(self, name) for name in self._explicit}
        defaults = {name: getattr(self, name) for name in self._fields}
        return dump_scenes.resolve(file, explicit, defaults)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if out["dump_step"] is not None:
            out["dump_step"] = sorted(out["dump_step"])
        return out


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
    - ``dump_config``: op data dumps inside compiled graphs, see :class:`DumpConfig`.
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
        "dump_config": (DumpConfig, None),
        "post_grad_custom_pre_pass": (None, _optional_graph_pass),
        "post_grad_custom_post_pass": (None, _optional_graph_pass),
    }

    def __init__(self, **options: Any) -> None:
        """Top-level options may be given as keywords: ``CompilerConfig(mode="aot_eager")``."""
        super().__init__("")
        for name, value in options.items():
            setattr(self, name, value)
