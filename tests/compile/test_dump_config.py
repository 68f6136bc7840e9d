"""dump_config options and JSON scene files are checked when assigned, naming the dotted key; the
options speak the eager dump's words, TorchAir's old names still work with a warning."""

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


def test_dump_config_defaults_dump_statistics_of_every_node_as_eager_capture_does() -> None:
    settings = CompilerConfig().dump_config.settings()
    assert (settings.scene.name, settings.data_mode, settings.task, settings.dump_stage, settings.step) == (
        "model",
        "all",
        "statistics",
        "optimized",
        None,
    )


def test_a_scene_file_without_dump_data_dumps_tensors_as_torchair_does(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(tmp_path, {"dump_mode": "output"})
    assert config.dump_config.settings().task == "tensor"
    config.dump_config.task = "statistics"  # set on the config, it wins over the file
    assert config.dump_config.settings().task == "statistics"


def test_dump_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^dump_config\.dump_path: got '.*missing', which is not an existing folder; create it first$"
    ):
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


def test_step_uses_the_index_set_syntax() -> None:
    config = CompilerConfig()
    config.dump_config.step = "0|3-5|10"
    assert config.dump_config.step == frozenset({0, 3, 4, 5, 10})
    with pytest.raises(ConfigError, match=r"^dump_config\.step: got '5-3', expected a non-negative integer"):
        config.dump_config.step = "5-3"


@pytest.mark.parametrize(
    ("old", "value", "new", "expected"),
    [
        ("dump_data", "stats", "task", "statistics"),
        ("dump_step", "1|3", "step", frozenset({1, 3})),
        ("dump_mode", "output", "data_mode", ["output"]),
        ("dump_layer", "addmm mul_3", "nodes", "addmm mul_3"),
    ],
)
def test_torchair_option_names_still_work_with_a_warning_naming_the_new_one(old, value, new, expected) -> None:
    config = CompilerConfig()
    with pytest.warns(FutureWarning, match=rf"^dump_config\.{old} is deprecated; use dump_config\.{new}"):
        setattr(config.dump_config, old, value)
    assert getattr(config.dump_config, new) == expected
    with pytest.warns(FutureWarning, match=rf"read dump_config\.{new}"):
        assert getattr(config.dump_config, old) == expected


def test_dump_path_is_checked_when_dumps_are_enabled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = CompilerConfig()  # the default "." is not checked while dumps are off
    config.dump_config.dump_path = str(tmp_path)
    (tmp_path / "gone").mkdir()
    config.dump_config.dump_path = str(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    with pytest.raises(ConfigError, match=r"^dump_config\.dump_path: got '.*gone', which is not an existing folder"):
        config.dump_config.enable_dump = True
    assert config.dump_config.enable_dump is False


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("data_mode", "both", r"^dump_config\.data_mode: got 'both', expected one of 'all', 'input', 'output'$"),
        ("task", "stats", r"^dump_config\.task: got 'stats', expected one of 'statistics', 'tensor'$"),
        ("dump_stage", "golden", r"^dump_config\.dump_stage: got 'golden', expected one of 'optimized', 'original'$"),
        ("enable_dump", "yes", r"^dump_config\.enable_dump: got 'yes', expected True or False$"),
        ("nodes", 3, r"^dump_config\.nodes: got 3, expected node names separated by spaces"),
        ("dump_lyer", "addmm", r"^dump_config\.dump_lyer: unknown option, expected one of 'enable_dump'"),
    ],
)
def test_bad_dump_options_name_the_key_and_the_allowed_values(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        setattr(CompilerConfig().dump_config, key, value)


def test_model_dump_scene_selects_layers_per_model(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(
        tmp_path,
        {
            "dump_list": [{"model_name": "model.0"}, {"model_name": "model__1", "layer": ["addmm", "mul_3"]}],
            "dump_mode": "output",
            "dump_data": "stats",
            "dump_step": "1|3",
        },
    )
    settings = config.dump_config.settings()
    assert settings.scene.name == "model" and settings.data_mode == "output" and settings.task == "statistics"
    assert settings.step == frozenset({1, 3})
    assert settings.scene.models == {"model_0": frozenset(), "model__1": frozenset({"addmm", "mul_3"})}


def test_options_set_on_the_config_override_the_scene_file(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(tmp_path, {"dump_mode": "output", "dump_data": "stats"})
    config.dump_config.data_mode = "input"
    settings = config.dump_config.settings()
    assert (settings.data_mode, settings.task) == ("input", "statistics")


def test_overflow_and_watcher_scenes_are_read(tmp_path: Path) -> None:
    config = CompilerConfig()
    config.dump_config.dump_config_path = _scene(tmp_path, {"dump_debug": "on"})
    assert config.dump_config.settings().scene.name == "overflow"
    config.dump_config.dump_config_path = _scene(
        tmp_path, {"dump_scene": "watcher", "dump_mode": "output", "dump_list": [{"layer": ["A"], "watcher_nodes": ["C", "D"]}]}
    )
    settings = config.dump_config.settings()
    scene = settings.scene
    assert (scene.name, scene.watched_after, scene.watched) == ("watcher", frozenset({"A"}), ("C", "D"))


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        (
            {"dump_debug": "on", "dump_list": [{"model_name": "m"}]},
            r"^dump\.dump_debug: 'on' \(overflow dump\) cannot be combined",
        ),
        ({"dump_debug": "on", "dump_op_switch": "on"}, r"^dump\.dump_debug: 'on' \(overflow dump\) cannot be combined"),
        (
            {"dump_scene": "watcher", "dump_debug": "on", "dump_list": [{"watcher_nodes": ["C"]}]},
            r"^dump\.dump_scene: 'watcher' cannot be combined with dump\.dump_debug",
        ),
        (
            {"dump_scene": "watcher", "dump_op_switch": "on", "dump_list": [{"watcher_nodes": ["C"]}]},
            r"^dump\.dump_scene: 'watcher' cannot be combined with dump\.dump_op_switch",
        ),
        (
            {"dump_scene": "watcher", "dump_list": [{"model_name": "m", "watcher_nodes": ["C"]}]},
            r"^dump\.dump_list\[\]\.model_name: not supported in the watcher scene",
        ),
        (
            {"dump_scene": "watcher", "dump_mode": "all", "dump_list": [{"watcher_nodes": ["C"]}]},
            r"^dump\.dump_mode: got 'all', the watcher scene supports only 'output'$",
        ),
        (
            {"dump_scene": "watcher", "dump_list": [{"layer": ["A"]}]},
            r"^dump\.dump_list\[\]\.watcher_nodes: the watcher scene needs",
        ),
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
    with pytest.raises(
        ConfigError, match=r"^dump\.dump_path: the scene file sets no dump_path; set it in the file or in dump_config\.dump_path$"
    ):
        config.dump_config.dump_config_path = str(path)  # refused at this line, not at the first compile
    assert config.dump_config.dump_config_path is None
    config.dump_config.dump_path = str(tmp_path)
    config.dump_config.dump_config_path = str(path)
    assert config.dump_config.settings().dump_path == str(tmp_path)


def test_a_dump_left_at_the_default_task_says_once_that_it_is_now_statistics(tmp_path: Path) -> None:
    import warnings

    import torch

    from torchdebug.compile import get_backend

    def dumped(task: str | None) -> list[str]:
        config = CompilerConfig(backend="aot_eager")
        config.dump_config.enable_dump = True
        config.dump_config.dump_path = str(tmp_path)
        if task is not None:
            config.dump_config.task = task
        backend = get_backend(config)
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = torch.compile(lambda x: (x + 1).sin() * 2, backend=backend)
            compiled(torch.ones(3))
            compiled(torch.ones(3, 2))  # a second graph: no second warning
        backend.data_dump.close()
        torch._dynamo.reset()
        return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]

    assert dumped(None) == [
        "dump_config.task now defaults to 'statistics' (it was 'tensor'); set dump_config.task = 'tensor' to dump the tensors"
    ]
    assert dumped("statistics") == []
