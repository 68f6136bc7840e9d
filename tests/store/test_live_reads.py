"""A dump read in the process that is still capturing it shows every record captured so far."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch

import torchdebug
from tests.capture.native_compare import on_the_dispatch_mode
from torchdebug.compile import CompilerConfig, get_backend
from torchdebug.store import _live as live


def _backend(**dump_options: object):
    """A torchdebug backend on ``aot_eager`` (no inductor compile: fast) with a data dump."""
    config = CompilerConfig(backend="aot_eager")
    config.dump_config.enable_dump = True
    for key, value in dump_options.items():
        setattr(config.dump_config, key, value)
    return get_backend(config)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_a_compiled_graph_dump_is_read_and_compared_before_it_is_closed(tmp_path: Path) -> None:
    model, x = _model(), torch.randn(3, 4)
    with torchdebug.dump(tmp_path / "eager", model=model):
        model(x).sum().backward()
    model.zero_grad()
    (tmp_path / "compiled").mkdir()
    backend = _backend(dump_path=str(tmp_path / "compiled"), task="statistics")
    torch.compile(model, backend=backend)(x).sum().backward()
    records = torchdebug.load(tmp_path / "compiled").ranks[0].records()  # no flush(), no close()
    assert {r.phase for r in records} == {"forward", "backward"}
    result = torchdebug.compare(tmp_path / "eager", tmp_path / "compiled")
    assert result.first_divergence is None and any(row.verdict == "pass" for row in result.rows)
    backend.data_dump.close()
    assert len(torchdebug.load(tmp_path / "compiled").ranks[0].records()) == len(records)


def test_the_overflow_scene_is_read_before_it_is_closed(tmp_path: Path) -> None:
    scene = tmp_path / "overflow.json"
    scene.write_text(json.dumps({"dump": {"dump_path": str(tmp_path), "dump_debug": "on"}}))
    backend = _backend(dump_config_path=str(scene))
    torch.compile(lambda t: (t.exp() * 2).sum(), backend=backend)(torch.tensor([1.0, 100.0]))
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    assert "forward/-/aten.exp.default#0" in {r.call_name for r in records}
    backend.data_dump.close()


def test_an_eager_dump_is_read_in_the_middle_of_a_step_with_its_tensors(tmp_path: Path, monkeypatch) -> None:
    """The dispatch mode's records of the step under way are read too (the native path hands a
    step's records over at its stop: a reader sees the steps stopped)."""
    on_the_dispatch_mode(monkeypatch)
    debugger = torchdebug.Debugger(tmp_path, task="tensor")
    debugger.start()
    torch.ones(3).mul(2)
    debugger.stop()
    debugger.start()
    torch.ones(3).add(5)  # still in the session's list: not handed to the writer
    records = torchdebug.load(tmp_path).ranks[0].records()
    dump = torchdebug.load(tmp_path).ranks[0]
    debugger.close()
    added = [r for r in records if r.op == "aten.add.Tensor" and r.io == "output"]
    assert len(added) == 1 and torch.equal(dump.load_tensor(added[0]), torch.full((3,), 6.0))


def test_a_dump_captured_by_another_thread_is_not_flushed_from_this_one(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    def capture() -> None:
        with torchdebug.dump(tmp_path, task="statistics"):
            torch.ones(3).mul(2)
            started.set()
            release.wait(30)

    thread = threading.Thread(target=capture)
    thread.start()
    try:
        assert started.wait(30)
        assert torchdebug.load(tmp_path).ranks[0].records() == []  # left to its own thread
    finally:
        release.set()
        thread.join()
    assert torchdebug.load(tmp_path).ranks[0].records()


def test_a_closed_dump_is_forgotten(tmp_path: Path) -> None:
    with torchdebug.dump(tmp_path):
        torch.ones(2).add(1)
    torchdebug.load(tmp_path)
    assert not [entry for entry in live._live if entry[0].is_relative_to(tmp_path.resolve())]
