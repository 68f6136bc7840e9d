"""dump_config options and JSON scene files are checked when assigned, naming the dotted key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchdebug.compile import CompilerConfig
from torchdebug.errors import ConfigError


def _scene(tmp_path: Path, dump: dict) -> str:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), **dump}}))
    return str(path)


def test_dump_config_defaults_dump_every_node_as_tensors() -> None:
    settings = CompilerConfig().dump_config.settings()
    assert (settings.scene, settings.mode, settings.data, settings.stage, settings.steps) == ("model", "all", "tensor", "optimized", None)


def test_dump_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^dump_config\.dump_path: got '.*missing', which is not an existing folder; create it first$"):
        CompilerConfig().dump_config.dump_path = str(tmp_path / "missing")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to any folder")
def test_dump_path_must_be_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ConfigError, match=r"^dump_config\.dump_path: .*cannot write to"):
            CompilerConfig().dump_config.dump_path = str(locked)
    finally:
        locked.chmod(0o700)


def test_dump_step_uses_the_index_set_syntax() -> None:
    config = CompilerConfig()
    config.dump_config.dump_step = "0|3-5|10"
    assert config.dump_config.dump_step == frozenset({0, 3, 4, 5, 10})
    with pytest.raises(ConfigError, match=r"^dump_config\.dump_step: got '5-3', expected a non-negative integer"):
        config.dump_config.dump_step = "5-3"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("dump_mode", "both", r"^dump_config\.dump_mode: got 'both', expected one of 'all', 'input', 'output'$"),
        ("dump_data", "csv", r"^dump_config\.dump_data: got 'csv', expected one of 'tensor', 'stats'$"),
        ("dump_stage", "golden", r"^dump_config\.dump_stage: got 'golden', expected one of 'optimized', 'original'$"),
        ("enable_dump", "yes", r"^dump_config\.enable_dump: got 'yes', expected True or False$"),
        ("dump_layer", ["addmm"], r"^dump_config\.dump_layer: got \['addmm'\], expected node names separated by spaces"),
        ("dump_lyer", "addmm", r"^dump_config\.dump_lyer: unknown option, expected one of 'enable_dump'"),
    ],
)
def test_bad_dump_options_name_the_key_and_the_allowed_values(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        setattr(CompilerConfig().dump_config, key, value)


def test_model_dump_scene_selects_layers_per_model(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(
        tmp_path, {"dump_list": [{"model_name": "model.0"}, {"model_name": "model__1", "layer": ["addmm", "mul_3"]}], "dump_mode": "output", "dump_data": "stats", "dump_step": "1|3"}
    )
    settings = config.dump_config.settings()
    assert settings.scene == "model" and settings.mode == "output" and settings.data == "stats"
    assert settings.steps == frozenset({1, 3})
    assert settings.models == {"model_0": frozenset(), "model__1": frozenset({"addmm", "mul_3"})}


def test_options_set_on_the_config_override_the_scene_file(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(tmp_path, {"dump_mode": "output", "dump_data": "stats"})
    config.dump_config.dump_mode = "input"
    settings = config.dump_config.settings()
    assert (settings.mode, settings.data) == ("input", "stats")


def test_overflow_and_watcher_scenes_are_read(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(tmp_path, {"dump_debug": "on"})
    assert config.dump_config.settings().scene == "overflow"
    config.dump_config.dump_config_path = _scene(
        tmp_path, {"dump_scene": "watcher", "dump_mode": "output", "dump_list": [{"layer": ["A"], "watcher_nodes": ["C", "D"]}]}
    )
    settings = config.dump_config.settings()
    assert (settings.scene, settings.watched_after, settings.watched) == ("watcher", frozenset({"A"}), ("C", "D"))


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        ({"dump_debug": "on", "dump_list": [{"model_name": "m"}]}, r"^dump\.dump_debug: 'on' \(overflow dump\) cannot be combined"),
        ({"dump_debug": "on", "dump_op_switch": "on"}, r"^dump\.dump_debug: 'on' \(overflow dump\) cannot be combined"),
        ({"dump_scene": "watcher", "dump_debug": "on", "dump_list": [{"watcher_nodes": ["C"]}]}, r"^dump\.dump_scene: 'watcher' cannot be combined with dump\.dump_debug"),
        ({"dump_scene": "watcher", "dump_op_switch": "on", "dump_list": [{"watcher_nodes": ["C"]}]}, r"^dump\.dump_scene: 'watcher' cannot be combined with dump\.dump_op_switch"),
        ({"dump_scene": "watcher", "dump_list": [{"model_name": "m", "watcher_nodes": ["C"]}]}, r"^dump\.dump_list\[\]\.model_name: not supported in the watcher scene"),
        ({"dump_scene": "watcher", "dump_mode": "all", "dump_list": [{"watcher_nodes": ["C"]}]}, r"^dump\.dump_mode: got 'all', the watcher scene supports only 'output'$"),
        ({"dump_scene": "watcher", "dump_list": [{"layer": ["A"]}]}, r"^dump\.dump_list\[\]\.watcher_nodes: the watcher scene needs"),
        ({"dump_scene": "spy"}, r"^dump\.dump_scene: got 'spy', expected 'watcher'"),
        ({"dump_debug": "yes"}, r"^dump\.dump_debug: got 'yes', expected one of 'on', 'off'$"),
        ({"dump_lists": []}, r"^dump\.dump_lists: unknown key in .*dump\.json, expected one of dump_list"),
        ({"dump_list": [{"modle_name": "m"}]}, r"^dump\.dump_list\[0\]\.modle_name: unknown key"),
    ],
)
def test_scene_file_refuses_incompatible_or_unknown_settings(tmp_path: Path, dump: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CompilerConfig().dump_config.dump_config_path = _scene(tmp_path, dump)


def test_scene_file_must_be_readable_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"dump_config_path \(.*nope\.json\): cannot read the file"):
        CompilerConfig().dump_config.dump_config_path = str(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        CompilerConfig().dump_config.dump_config_path = str(bad)


def test_scene_file_without_dump_path_needs_it_on_the_config(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"dump": {"dump_debug": "on"}}))
    config = CompilerConfig()
    config.dump_config.dump_config_path = str(path)
    with pytest.raises(ConfigError, match=r"^dump\.dump_path: the scene file sets no dump_path"):
        config.dump_config.settings()
    config.dump_config.dump_path = str(tmp_path)
    assert config.dump_config.settings().path == str(tmp_path)
