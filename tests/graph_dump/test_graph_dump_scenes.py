"""Each scene's contract, end to end without a compiler: a graph traced with make_fx, instrumented by
the data-dump pass, run on the CPU, its records read back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torchdebug
from torchdebug.graph_dump import find_overwrites
from torchdebug.graph_dump._capture import GraphCapture
from torchdebug.graph_dump._instrument import DataDumpPass
from torchdebug.graph_dump._planner import ModelContext
from torchdebug.graph_dump._settings import DumpSettings
from torchdebug.graph_dump.scenes import ModelScene, OverflowScene, Scene, WatcherScene, scene_from_file


def _log_of_negative(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x * 2 - 10) + 1  # finite inputs; log makes the NaN, add passes it on


def _stomped(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.view(-1).add_(1)  # writes into mul's output after mul ran
    return y.sum()


def _dump(fn: Callable[[torch.Tensor], torch.Tensor], scene: Scene, tmp_path: Path) -> tuple[GraphCapture, list]:
    """Trace, instrument and run ``fn`` once under ``scene``; the capture and its records."""
    x = torch.ones(4, 8)
    gm = make_fx(fn, tracing_mode="fake")(x)
    settings = DumpSettings(scene=scene, task="statistics", dump_path=str(tmp_path))
    capture = GraphCapture(settings)
    try:
        DataDumpPass(settings, capture, ModelContext("model__0"))(gm)
        gm.recompile()
        gm(x)
    finally:
        capture.close()
    manifest = json.loads((capture.rank_dir / "manifest.json").read_text())
    assert manifest["config"]["dump_config"]["scene"] == scene.name
    return capture, list(torchdebug.load(capture.run_dir).records())


def test_the_model_scene_writes_every_slot_of_every_selected_call(tmp_path: Path) -> None:
    capture, records = _dump(_log_of_negative, ModelScene(), tmp_path)
    ops = [r.op for r in records if r.io == "output"]
    assert ops == ["aten.mul.Tensor", "aten.sub.Tensor", "aten.log.default", "aten.add.Tensor"]
    assert all(r.stats is not None for r in records if r.kind == "tensor")
    assert capture.overflows == []


def test_the_overflow_scene_writes_only_the_call_that_made_the_nan_and_names_it(tmp_path: Path) -> None:
    capture, records = _dump(_log_of_negative, OverflowScene(), tmp_path)
    assert {r.name.split("/")[-2] for r in records} == {"aten.log.default#0"}
    assert {r.io for r in records} == {"input", "output"}
    (found,) = capture.overflows
    assert (found.step, found.name, found.nan) == (0, "forward/-/aten.log.default#0", 32)


def test_the_watcher_scene_finds_the_node_that_wrote_into_a_watched_output(tmp_path: Path) -> None:
    gm = make_fx(_stomped, tracing_mode="fake")(torch.ones(4, 8))
    mul, add_ = (n.name for n in gm.graph.nodes if n.op == "call_function" and n.name.startswith(("mul", "add_")))
    _, records = _dump(_stomped, WatcherScene((mul,)), tmp_path)
    assert {r.op for r in records} == {"aten.mul.Tensor"} and {r.io for r in records} == {"output"}
    assert records[0].extra["after"] == mul  # its values as produced
    (overwrite,) = find_overwrites(records)
    assert (overwrite.before, overwrite.after) == (records[1].extra["after"], add_)


def test_a_scene_file_names_its_scene_and_each_scene_reads_its_own_entries() -> None:
    assert isinstance(scene_from_file(None), ModelScene) and scene_from_file(None).models is None
    model = scene_from_file({"dump_list": [{"model_name": "model.0", "layer": ["mm"]}]})
    assert isinstance(model, ModelScene) and model.to_dict() == {"models": {"model_0": ["mm"]}}
    assert isinstance(scene_from_file({"dump_debug": "on"}), OverflowScene)
    watcher = scene_from_file({"dump_scene": "watcher", "dump_list": [{"layer": ["a"], "watcher_nodes": ["b", "b"]}]})
    assert isinstance(watcher, WatcherScene) and watcher.to_dict() == {"watched_after": ["a"], "watcher_nodes": ["b"]}
