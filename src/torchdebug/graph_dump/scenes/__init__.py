"""The graph dump's scenes, one class each behind :class:`~torchdebug.graph_dump.scenes._base.Scene`.

- ``model`` (:class:`ModelScene`): the selected nodes of the selected graphs;
- ``overflow`` (:class:`OverflowScene`, ``"dump_debug": "on"``): only the calls that make a NaN/Inf;
- ``watcher`` (:class:`WatcherScene`, ``"dump_scene": "watcher"``): watched outputs after later
  nodes ran, to find memory written by an op that does not own it (:func:`find_overwrites`).

:func:`scene_from_file` is the one place that reads which scene a scene file asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchdebug.graph_dump.scenes._base import Scene
from torchdebug.graph_dump.scenes._model import ModelScene
from torchdebug.graph_dump.scenes._overflow import Overflow, OverflowScene
from torchdebug.graph_dump.scenes._watcher import Overwrite, WatcherScene, find_overwrites

__all__ = ["ModelScene", "Overflow", "OverflowScene", "Overwrite", "Scene", "WatcherScene", "find_overwrites", "scene_from_file"]


def scene_from_file(dump: Mapping[str, Any] | None) -> Scene:
    """The scene a checked scene file's ``dump`` object asks for (no file: the model dump)."""
    dump = dump or {}
    if dump.get("dump_scene") == "watcher":
        return WatcherScene.from_file(dump)
    if dump.get("dump_debug") == "on":
        return OverflowScene.from_file(dump)
    return ModelScene.from_file(dump)
