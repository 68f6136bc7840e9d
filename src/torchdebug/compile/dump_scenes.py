"""What a graph-mode data dump captures: ``config.dump_config`` plus the JSON scene file, resolved.

The JSON file (``dump_config.dump_config_path``) follows TorchAir's ``dump`` object and holds one of
three scenes::

    {"dump": {"dump_list": [{"model_name": "model__0", "layer": ["addmm", "mul_3"]}],
              "dump_path": "out", "dump_mode": "output", "dump_data": "stats", "dump_step": "0|2"}}
    {"dump": {"dump_path": "out", "dump_debug": "on"}}                                   # overflow
    {"dump": {"dump_list": [{"layer": ["A"], "watcher_nodes": ["C"]}],
              "dump_path": "out", "dump_mode": "output", "dump_scene": "watcher"}}        # watcher

Options assigned on the config win over the file; the file wins over defaults. Scenes that cannot
be combined (overflow with a model or op dump, watcher with either) are refused with one line
naming the keys, as the seed does. ``model_name`` is a graph name as the backend numbers them
(``model__0`` is the first graph it compiled), with ``.``, ``/``, ``\\`` and spaces read as ``_``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchdebug.config import parse_index_set
from torchdebug.errors import ConfigError

DUMP_MODES = ("all", "input", "output")
DUMP_DATA = ("tensor", "stats")
DUMP_STAGES = ("optimized", "original")

_FILE_KEYS = ("dump_list", "dump_path", "dump_mode", "dump_data", "dump_step", "dump_op_switch", "dump_debug", "dump_scene")
_ENTRY_KEYS = ("model_name", "layer", "watcher_nodes")


def safe_model_name(name: str) -> str:
    """A graph name as it appears in dump folders: ``.``, ``/``, ``\\`` and spaces turned into ``_``."""
    return re.sub(r"[./\\ ]", "_", name)


@dataclass(frozen=True)
class DumpSettings:
    """The resolved options of one graph-mode data dump (see the module docstring)."""

    scene: str = "model"
    mode: str = "all"
    data: str = "tensor"
    path: str = "."
    steps: frozenset[int] | None = None
    stage: str = "optimized"
    layers: frozenset[str] = frozenset()
    """Node names selected in every graph (``dump_layer``); empty with no scope marks: every node."""
    models: Mapping[str, frozenset[str]] | None = None
    """From ``dump_list``: graph name -> node names (empty set: every node); ``None``: every graph."""
    watched_after: frozenset[str] = frozenset()
    """Watcher: the nodes after which the watched outputs are dumped (empty: after every node)."""
    watched: tuple[str, ...] = ()
    """Watcher: the nodes whose outputs are dumped (``watcher_nodes``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the dump manifest."""
        return {
            "scene": self.scene, "dump_mode": self.mode, "dump_data": self.data, "dump_path": self.path,
            "dump_step": sorted(self.steps) if self.steps is not None else None, "dump_stage": self.stage,
            "dump_layer": sorted(self.layers), "models": {k: sorted(v) for k, v in (self.models or {}).items()} or None,
            "watched_after": sorted(self.watched_after), "watcher_nodes": list(self.watched),
        }  # fmt: skip


def _names(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{key}: got {value!r}, expected a list of node names like ['addmm', 'mul_3']")
    return [v.strip() for v in value]


def _on_off(key: str, value: Any) -> bool:
    if value not in ("on", "off"):
        raise ConfigError(f"{key}: got {value!r}, expected one of 'on', 'off'")
    return value == "on"


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
    dump = document["dump"]
    for key in dump:
        if key not in _FILE_KEYS:
            raise ConfigError(f"dump.{key}: unknown key in {path}, expected one of {', '.join(_FILE_KEYS)}")
    entries = dump.get("dump_list", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"dump.dump_list: got {entries!r}, expected a list of objects like {{'model_name': ..., 'layer': [...]}}")
    for index, entry in enumerate(entries):
        for key in entry:
            if key not in _ENTRY_KEYS:
                raise ConfigError(f"dump.dump_list[{index}].{key}: unknown key, expected one of {', '.join(_ENTRY_KEYS)}")
    _check_scene(dump)
    return dump


def _check_scene(dump: dict[str, Any]) -> None:
    """Refuse the combinations the seed refuses, naming the keys involved."""
    overflow = _on_off("dump.dump_debug", dump.get("dump_debug", "off"))
    op_switch = _on_off("dump.dump_op_switch", dump.get("dump_op_switch", "off"))
    scene = dump.get("dump_scene")
    if scene not in (None, "watcher"):
        raise ConfigError(f"dump.dump_scene: got {scene!r}, expected 'watcher' or no dump_scene")
    entries = dump.get("dump_list", [])
    if scene == "watcher":
        if overflow:
            raise ConfigError("dump.dump_scene: 'watcher' cannot be combined with dump.dump_debug 'on' (overflow dump); use one scene per file")
        if op_switch:
            raise ConfigError("dump.dump_scene: 'watcher' cannot be combined with dump.dump_op_switch 'on' (op dump); use one scene per file")
        if dump.get("dump_mode", "output") != "output":
            raise ConfigError(f"dump.dump_mode: got {dump['dump_mode']!r}, the watcher scene supports only 'output'")
        if any("model_name" in e for e in entries):
            raise ConfigError("dump.dump_list[].model_name: not supported in the watcher scene; list node names in layer and watcher_nodes")
        if not any(e.get("watcher_nodes") for e in entries):
            raise ConfigError("dump.dump_list[].watcher_nodes: the watcher scene needs at least one node to watch")
    elif overflow and (entries or op_switch):
        raise ConfigError(
            "dump.dump_debug: 'on' (overflow dump) cannot be combined with dump.dump_list or dump.dump_op_switch 'on' "
            "(model/op dump); use one scene per file"
        )
    elif any("watcher_nodes" in e for e in entries):
        raise ConfigError("dump.dump_list[].watcher_nodes: only used with dump.dump_scene 'watcher'")


def resolve(file: dict[str, Any] | None, explicit: Mapping[str, Any], defaults: Mapping[str, Any]) -> DumpSettings:
    """Merge the scene file (``file``, from :func:`read_scene_file`), the options assigned on the
    config (``explicit``, they win) and the config defaults into :class:`DumpSettings`."""
    file = file or {}

    def pick(key: str) -> Any:
        if key in explicit:
            return explicit[key]
        if key in file:
            return file[key]
        return defaults[key]

    if file and "dump_path" not in file and "dump_path" not in explicit:
        raise ConfigError("dump.dump_path: the scene file sets no dump_path; set it in the file or in config.dump_config.dump_path")
    mode, data = pick("dump_mode"), pick("dump_data")
    for key, value, allowed in (("dump_mode", mode, DUMP_MODES), ("dump_data", data, DUMP_DATA)):
        if value not in allowed:
            raise ConfigError(f"dump.{key}: got {value!r}, expected one of {', '.join(map(repr, allowed))}")
    steps = explicit["dump_step"] if "dump_step" in explicit else parse_index_set("dump.dump_step", file.get("dump_step", defaults["dump_step"]))
    layer_text = pick("dump_layer") or ""
    common = dict(mode=mode, data=data, path=str(pick("dump_path")), steps=steps, stage=pick("dump_stage"), layers=frozenset(layer_text.split()))
    entries = file.get("dump_list", [])
    if file.get("dump_scene") == "watcher":
        after = {n for i, e in enumerate(entries) for n in _names(f"dump.dump_list[{i}].layer", e.get("layer", []))}
        watched = [n for i, e in enumerate(entries) for n in _names(f"dump.dump_list[{i}].watcher_nodes", e.get("watcher_nodes", []))]
        return DumpSettings(scene="watcher", watched_after=frozenset(after), watched=tuple(dict.fromkeys(watched)), **common)
    if file.get("dump_debug") == "on":
        return DumpSettings(scene="overflow", **common)
    models = None
    if entries and file.get("dump_op_switch", "off") == "off":
        models = {}
        for index, entry in enumerate(entries):
            name = safe_model_name(str(entry.get("model_name", "")))
            layer = frozenset(_names(f"dump.dump_list[{index}].layer", entry.get("layer", [])))
            models[name] = models.get(name, frozenset()) | layer
    return DumpSettings(scene="model", models=models, **common)
