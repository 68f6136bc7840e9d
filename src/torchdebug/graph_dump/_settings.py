"""What a graph-mode data dump captures: ``config.dump_config`` plus the JSON scene file, resolved
into one :class:`DumpSettings` with ``DumpConfig``'s names and the scene object the file asks for.

The scene file (``dump_config.dump_config_path``) follows TorchAir's ``dump`` object and keeps its keys
(``dump_data``, ``dump_mode``, ``dump_step``); options set on the config win over the file, the file
over defaults, and scenes that cannot be combined are refused with one line naming the keys, as
TorchAir does. Each scene reads its own entries (``torchdebug.graph_dump.scenes``). The options and
the three scenes: docs/graph_dump.md, "Options" and "Scene file".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from torchdebug.errors import ConfigError
from torchdebug.graph_dump.scenes import ModelScene, Scene, scene_from_file
from torchdebug.options import index_set

DataMode = Literal["all", "input", "output"]
Task = Literal["statistics", "tensor"]
DumpStage = Literal["optimized", "original"]
"""The values of ``DumpConfig``'s options of these names (``torchdebug.compile._config``)."""
DATA_MODES: tuple[DataMode, ...] = get_args(DataMode)
_FILE_TASKS = {"tensor": "tensor", "stats": "statistics"}
"""TorchAir's ``dump_data`` values in scene files, and the task each means."""
_FILE_DEFAULT_TASK = "tensor"
"""The task of a scene file without ``dump_data``: TorchAir's default (``DumpConfig.task``'s is statistics)."""

_FILE_KEYS = ("dump_list", "dump_path", "dump_mode", "dump_data", "dump_step", "dump_op_switch", "dump_debug", "dump_scene")
_ENTRY_KEYS = ("model_name", "layer", "watcher_nodes")


@dataclass(frozen=True)
class DumpSettings:
    """The resolved options of one graph-mode data dump, named as on ``DumpConfig`` (see the module
    docstring); ``scene`` holds what the scene file selects."""

    scene: Scene = field(default_factory=ModelScene)
    task: str = "statistics"
    """``statistics`` or ``tensor``."""
    data_mode: str = "all"
    """``all``, ``input`` or ``output`` slots of the dumped nodes (one of them, resolved)."""
    dump_path: str = "."
    step: frozenset[int] | None = None
    """The steps written (``None``: every step)."""
    nodes: frozenset[str] = frozenset()
    """Node names selected in every graph; empty with no scope marks: every node (model dump)."""
    dump_stage: str = "optimized"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the dump manifest."""
        return {
            "scene": self.scene.name,
            "data_mode": self.data_mode,
            "task": self.task,
            "dump_path": self.dump_path,
            "step": sorted(self.step) if self.step is not None else None,
            "dump_stage": self.dump_stage,
            "nodes": sorted(self.nodes),
            **self.scene.to_dict(),
        }


def _on_off(key: str, value: Any) -> bool:
    if value not in ("on", "off"):
        raise ConfigError(f"{key}: got {value!r}, expected one of 'on', 'off'")
    return bool(value == "on")


def read_scene_file(path: str) -> dict[str, Any]:
    """Read and check a scene file; return its ``dump`` object (raises ConfigError naming the key)."""
    where = f"dump_config.dump_config_path ({path})"
    try:
        document = json.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"{where}: cannot read the file ({error.strerror}); give an existing JSON file") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(document, dict) or not isinstance(document.get("dump"), dict):
        raise ConfigError(f'{where}: expected an object {{"dump": {{...}}}} as in TorchAir\'s dump config')
    dump: dict[str, Any] = document["dump"]
    for key in dump:
        if key not in _FILE_KEYS:
            raise ConfigError(f"dump.{key}: unknown key in {path}, expected one of {', '.join(_FILE_KEYS)}")
    entries = dump.get("dump_list", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(
            f"dump.dump_list: got {entries!r}, expected a list of objects like {{'model_name': ..., 'layer': [...]}}"
        )
    for index, entry in enumerate(entries):
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise ConfigError(f"dump.dump_list[{index}].{key}: unknown key, expected one of {', '.join(_ENTRY_KEYS)}")
    _check_scene(dump)
    return dump


def _check_scene(dump: dict[str, Any]) -> None:
    """Refuse the combinations TorchAir refuses, naming the keys involved."""
    overflow = _on_off("dump.dump_debug", dump.get("dump_debug", "off"))
    op_switch = _on_off("dump.dump_op_switch", dump.get("dump_op_switch", "off"))
    scene = dump.get("dump_scene")
    if scene not in (None, "watcher"):
        raise ConfigError(f"dump.dump_scene: got {scene!r}, expected 'watcher' or no dump_scene")
    entries = dump.get("dump_list", [])
    if scene == "watcher":
        if overflow:
            raise ConfigError(
                "dump.dump_scene: 'watcher' cannot be combined with dump.dump_debug 'on' (overflow dump); use one scene per file"
            )
        if op_switch:
            raise ConfigError(
                "dump.dump_scene: 'watcher' cannot be combined with dump.dump_op_switch 'on' (op dump); use one scene per file"
            )
        if dump.get("dump_mode", "output") != "output":
            raise ConfigError(f"dump.dump_mode: got {dump['dump_mode']!r}, the watcher scene supports only 'output'")
        if any("model_name" in e for e in entries):
            raise ConfigError(
                "dump.dump_list[].model_name: not supported in the watcher scene; list node names in layer and watcher_nodes"
            )
        if not any(e.get("watcher_nodes") for e in entries):
            raise ConfigError("dump.dump_list[].watcher_nodes: the watcher scene needs at least one node to watch")
    elif overflow and (entries or op_switch):
        raise ConfigError(
            "dump.dump_debug: 'on' (overflow dump) cannot be combined with dump.dump_list or dump.dump_op_switch 'on' "
            "(model/op dump); use one scene per file"
        )
    elif any("watcher_nodes" in e for e in entries):
        raise ConfigError("dump.dump_list[].watcher_nodes: only used with dump.dump_scene 'watcher'")


def _single_mode(modes: list[str]) -> str:
    """One of ``all``, ``input``, ``output`` from a ``data_mode`` list."""
    if "all" in modes or {"input", "output"} <= set(modes):
        return "all"
    return modes[0]


def resolve(file: dict[str, Any] | None, values: Mapping[str, Any], assigned: frozenset[str], prefix: str = "") -> DumpSettings:
    """Merge the scene file (``file``, from :func:`read_scene_file`, TorchAir's keys) under the
    config's ``values`` (``task``, ``data_mode``, ``dump_path``, ``step``, ``nodes``,
    ``dump_stage``): an option in ``assigned`` wins over the file, the file over the defaults."""
    file = file or {}

    def pick(key: str, file_key: str) -> tuple[Any, bool]:
        """The value and whether it came from the file."""
        if key in assigned or file_key not in file:
            return values[key], False
        return file[file_key], True

    if file and "dump_path" not in file and "dump_path" not in assigned:
        raise ConfigError(f"dump.dump_path: the scene file sets no dump_path; set it in the file or in {prefix}dump_path")
    task, from_file = pick("task", "dump_data")
    if from_file:
        if task not in _FILE_TASKS:
            raise ConfigError(f"dump.dump_data: got {task!r}, expected one of {', '.join(map(repr, _FILE_TASKS))}")
        task = _FILE_TASKS[task]
    elif file and "task" not in assigned:
        task = _FILE_DEFAULT_TASK
    mode, from_file = pick("data_mode", "dump_mode")
    if from_file and mode not in DATA_MODES:
        raise ConfigError(f"dump.dump_mode: got {mode!r}, expected one of {', '.join(map(repr, DATA_MODES))}")
    mode = mode if from_file else _single_mode(mode)
    steps, from_file = pick("step", "dump_step")
    if from_file:
        steps = index_set("dump.dump_step", steps)
    return DumpSettings(
        scene=scene_from_file(file),
        task=task,
        data_mode=mode,
        dump_path=str(pick("dump_path", "dump_path")[0]),
        step=steps,
        nodes=frozenset((values["nodes"] or "").split()),
        dump_stage=values["dump_stage"],
    )
