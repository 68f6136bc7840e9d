"""The flight recorder on a small GPT (examples/gpt.py, with its -inf causal mask), one process."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests.global_hooks import global_module_hooks
from tests.triton_interpreter import ROOT, interpreter_env, interpreter_skip
from torchdebug.errors import AnomalyError, ConfigError
from torchdebug.monitor._ring import Ring
from torchdebug.records import LOSS_OP, MODULE_OP
from torchdebug.stats._schema import STAT_KEYS, WIDTH

CONFIG = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=64)


@pytest.fixture
def monitors():
    """``monitors(...)`` builds a Monitor that is closed after the test (its global hooks removed)."""
    made: list[torchdebug.Monitor] = []

    def make(*args, **kwargs) -> torchdebug.Monitor:
        made.append(torchdebug.Monitor(*args, **kwargs))
        return made[-1]

    yield make
    for monitor in made:
        monitor.close()


def _gpt() -> tuple[GPT, torch.optim.Optimizer]:
    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _closure(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    scale: float = 1.0,
    grad_scale: float = 1.0,
    batch: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Forward and backward of one batch (``batch``, else random tokens); ``scale`` multiplies the
    loss, ``grad_scale`` every gradient the backward makes (the loss unchanged)."""

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        tokens = batch or make_batch(CONFIG, batch=2, seed=step, device=str(next(model.parameters()).device))
        loss = model(*tokens) * scale
        if grad_scale != 1.0:
            loss.register_hook(lambda grad: grad * grad_scale)
        loss.backward()
        return loss

    return closure


def _step(monitor: torchdebug.Monitor, optimizer: torch.optim.Optimizer, closure, closure_mode: bool) -> None:  # noqa: ANN001
    """One step as a loop runs it: through ``monitor.step(closure)``, or (``closure_mode`` false) the
    loop's own forward, backward and optimizer step, then ``monitor.step(loss=...)``."""
    if closure_mode:
        monitor.step(closure)
    else:
        loss = closure()
        optimizer.step()
        monitor.step(loss=loss)


def _train_with_a_nan(monitor: torchdebug.Monitor, model: GPT, optimizer: torch.optim.Optimizer, steps: int, nan_at: int) -> None:
    """``steps`` steps of the loop's own optimizer step and ``monitor.step(loss=...)``, with a NaN
    planted in a weight of ``layers.1.mlp.out`` at step ``nan_at``; the monitor closed after."""
    for step in range(steps):
        if step == nan_at:
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")
        loss = _closure(model, optimizer, step)()
        optimizer.step()
        monitor.step(loss=loss)
    monitor.close()


def test_a_nan_at_step_40_dumps_the_window_of_steps_25_to_40_and_names_the_module(monitors, tmp_path: Path) -> None:
    """The loop keeps its own optimizer step (no closure): the window is read from the step's tables."""
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=16)
    _train_with_a_nan(monitor, model, optimizer, steps=60, nan_at=40)
    assert [(e.step, e.reason) for e in monitor.events] == [(40, "nonfinite")]
    event = monitor.events[0]
    assert event.slot == "forward/layers.1.mlp.out/module#0/output.0"
    assert event.module == "layers.1.mlp.out"
    assert monitor.anomalies == 20  # every step after 40 holds the NaN; only the first is dumped (max_events=1)
    records = torchdebug.load(event.window).ranks[0].records()
    assert sorted({r.step for r in records}) == list(range(25, 41))
    bad = [r for r in records if r.step == 40 and r.name == event.slot]
    assert len(bad) == 1 and bad[0].stats["nan"] > 0
    assert all(r.stats["nan"] == 0 for r in records if r.step < 40)
    assert {"forward", "backward", "optimizer"} <= {r.phase for r in records}
    assert event.replay is None and "Monitor.step(closure)" in str(event)


def test_a_run_resumed_at_a_step_numbers_its_window_from_there_and_monitors_of_one_second_keep_apart(
    monitors, tmp_path: Path, monkeypatch
) -> None:
    """``start_at(100)`` (a loop resumed from a checkpoint at step 100): the event, the window and
    the replay carry the loop's steps. A second monitor built within the same second (the clock
    held still here), firing at the same step, writes its window into a run folder of its own."""
    monkeypatch.setattr(torchdebug.monitor._monitor, "new_run_name", lambda: "20261125-120000")
    monkeypatch.setattr(torchdebug.monitor._monitor, "_run_names", set())
    events, names = [], []
    for _ in range(2):
        model, optimizer = _gpt()
        monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
        monitor.start_at(100)
        for step in range(100, 106):
            if step == 103:
                with torch.no_grad():
                    model.layers[1].mlp.out.weight[0, 0] = float("nan")
            monitor.step(_closure(model, optimizer, step))
        with pytest.raises(ValueError, match="below the step under way"):
            monitor.start_at(0)
        monitor.close()
        (event,) = monitor.events
        events.append(event)
        names.append(monitor.run_name)
    first, second = events
    assert (first.step, first.reason) == (103, "nonfinite")
    assert first.window == second.window == tmp_path / "step103-window"
    assert names == ["20261125-120000", "20261125-120000-1"]
    for name in names:
        assert sorted({r.step for r in torchdebug.load(first.window / name).ranks[0].records()}) == [100, 101, 102, 103]
    assert {r.step for r in torchdebug.load(first.replay.dump).ranks[0].records()} == {103}


def test_a_healthy_run_with_an_infinite_causal_mask_never_fires(monitors, tmp_path: Path) -> None:
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path)
    for step in range(200):
        monitor.step(_closure(model, optimizer, step))
    assert monitor.events == [] and monitor.anomalies == 0
    assert not any(tmp_path.iterdir())  # nothing written while nothing fired
    slots = {slot.name for slot in monitor.ring.slots}
    assert "forward/layers.0.attn/module#0/output.0" in slots
    assert "backward/layers.0.attn.qkv/module#0/parameter_grad.weight" in slots
    assert "optimizer/layers.0.attn.qkv/module#0/parameter.weight" in slots
    assert monitor.memory_bytes() >= 32 * len(slots) * 8 * 8


@pytest.mark.parametrize("grad_norm_spike_floor", [None, 0.1], ids=["default", "floor-0.1"])
def test_a_healthy_run_on_learnable_data_fires_only_below_the_default_gradient_floor(
    monitors, tmp_path: Path, grad_norm_spike_floor: float | None
) -> None:
    """A small GPT learning a Markov chain (AdamW, 3e-3, no warm-up) leaves its first plateau within
    a few dozen steps and its gradient norm rises to more than twice the window's median: healthy,
    and no spike at the default ``grad_norm_spike_floor`` (0.5); the loss's floor (0.1) under the
    gradient norm fires on it, at a robust z-score near 11. With the random-data run above, the
    second trajectory the defaults stay quiet on."""
    torchdebug.seed_all(0)
    config = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=64, vocab=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    norms: dict[int, float] = {}
    floor = {} if grad_norm_spike_floor is None else {"grad_norm_spike_floor": grad_norm_spike_floor}
    monitor = monitors(
        model, optimizer, dump_path=tmp_path, replay="off", predicate=lambda s: norms.__setitem__(s.step, s.grad_norm), **floor
    )
    for step in range(120):
        monitor.step(_closure(model, optimizer, step, batch=_markov_batch(config, step)))
    if grad_norm_spike_floor is not None:  # (the predicate is not asked at a step that fired)
        assert [event.reason for event in monitor.events] == ["grad_norm_spike"]
        return
    assert monitor.events == [] and monitor.anomalies == 0
    values = [norms[step] for step in sorted(norms)]
    rises = [values[step] / np.median(values[max(0, step - 31) : step]) for step in range(8, len(values))]
    assert max(rises) > 2.0  # the run did move its gradient norm by a multiple


def _markov_batch(config: GPTConfig, step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens of a Markov chain (each token followed by one of three, a tenth of them random), the
    same chain for every step: a sequence a model learns."""
    successors = torch.randint(0, config.vocab, (config.vocab, 3), generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(1000 + step)
    tokens = torch.empty(batch, config.seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, config.vocab, (batch,), generator=generator)
    choice = torch.randint(0, 3, (batch, config.seq_len), generator=generator)
    noise = torch.rand(batch, config.seq_len, generator=generator) < 0.1
    random = torch.randint(0, config.vocab, (batch, config.seq_len), generator=generator)
    for t in range(config.seq_len):
        tokens[:, t + 1] = torch.where(noise[:, t], random[:, t], successors[tokens[:, t], choice[:, t]])
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.parametrize("closure_mode", [True, False])
def test_each_reason_has_its_own_max_events(monitors, tmp_path: Path, closure_mode: bool) -> None:
    """With the default ``max_events=1``, a gradient-norm spike at step 12 is dumped, and so is the
    NaN at step 20 (before, the spike had used up the run's one dump); the NaN's later steps are
    counted only."""
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, replay="off")
    for step in range(24):
        if step == 20:
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")
        closure = _closure(model, optimizer, step, grad_scale=1000.0 if step == 12 else 1.0)
        _step(monitor, optimizer, closure, closure_mode)
    monitor.close()
    assert [(e.step, e.reason) for e in monitor.events] == [(12, "grad_norm_spike"), (20, "nonfinite")]
    assert all(event.window.is_dir() for event in monitor.events)
    assert monitor.anomalies > 2


@pytest.mark.parametrize("spike", ["loss", "grad_norm"])
def test_a_spike_fires_once(monitors, tmp_path: Path, spike: str) -> None:
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, max_events=5, replay="off")
    for step in range(40):
        scale = 50.0 if spike == "loss" and step == 30 else 1.0
        grad_scale = 100.0 if spike == "grad_norm" and step == 30 else 1.0
        monitor.step(_closure(model, optimizer, step, scale=scale, grad_scale=grad_scale))
    assert [(e.step, e.reason) for e in monitor.events] == [(30, f"{spike}_spike")]
    assert monitor.events[0].no_replay == "replay='off'" and "no replay: replay='off'" in str(monitor.events[0])
    slot = monitor.events[0].slot
    assert slot is not None
    if spike == "loss":  # a forward output stands out
        assert slot.startswith("forward/") and slot.endswith("/output.0")
    else:  # a gradient, where the backward made it
        assert slot.startswith("backward/") and "/parameter_grad." in slot


def test_the_ring_keeps_the_last_steps_whatever_their_numbers() -> None:
    """Steps that skip numbers (0, 3, 7, ...) still fill every place; a step forgotten as it ran
    leaves its place to the next."""
    ring = Ring(3)
    index = ring.slot("forward", "fc", MODULE_OP, 0, "output", "0")
    for step in (0, 3, 7, 8):
        ring.begin(step)
        ring.put_sums(step, index, [float(step)] * WIDTH, 1)
    assert ring.kept_steps() == [3, 7, 8] and ring.row(0) is None and ring.addresses(0, [index], [1]) is None
    ring.begin(9)
    ring.forget(9)
    ring.begin(12)
    assert ring.kept_steps() == [7, 8, 12]
    assert not math.isnan(ring.row(7)[index, 0]) and math.isnan(ring.row(12)[index, 0])


def test_gradients_are_ordered_as_the_backward_runs() -> None:
    """The backward runs the forward in reverse: a gradient is placed by its module's output, or its
    nearest watched ancestor's (a compiled block's), later modules first within one, a module's own
    parameters as registered; a parameter of the model's own last."""
    ring = Ring(4)
    for module in ["blocks.0", "blocks.1", "head", "<root>"]:
        ring.slot("forward", module, MODULE_OP, 0, "output", "0")
    grads = [
        ("<root>", "pos"),
        ("blocks.0.attn.qkv", "weight"),
        ("blocks.0.mlp.fc", "weight"),
        ("blocks.0.mlp.fc", "bias"),
        ("blocks.1.attn.qkv", "weight"),
        ("head", "weight"),
    ]
    for module, leaf in grads:
        ring.slot("backward", module, MODULE_OP, 0, "parameter_grad", leaf)
    loss = ring.slot("forward", "-", LOSS_OP, 0, "output", "")
    order = [ring.slots[i] for i in ring.execution_order()]
    assert [(s.module, s.arg) for s in order if s.io == "parameter_grad"] == [
        ("head", "weight"),
        ("blocks.1.attn.qkv", "weight"),
        ("blocks.0.mlp.fc", "weight"),
        ("blocks.0.mlp.fc", "bias"),
        ("blocks.0.attn.qkv", "weight"),
        ("<root>", "pos"),
    ]
    assert [s.module for s in order[:4]] == ["blocks.0", "blocks.1", "head", "<root>"] and order[4] is ring.slots[loss]
    head, pos = (ring.slots.index(next(s for s in ring.slots if s.arg == leaf)) for leaf in ("weight", "pos"))
    assert ring.place(loss) < ring.place(head) < ring.place(pos)


def _poison_gradient_of(module: nn.Module, state: dict[str, bool]) -> None:
    """While ``state["on"]``, the backward puts a NaN into the gradient of ``module``'s output."""

    def poison(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad.view(-1)[0] = float("nan")
        return grad

    def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> None:
        if state["on"]:
            output.register_hook(poison)

    module.register_forward_hook(hook)


def test_gradients_are_watched_as_the_backward_leaves_them_before_the_loop_clips_them(monitors, tmp_path: Path) -> None:
    """The loop clips its gradients (max norm 1, as the Hugging Face Trainer does by default): the
    window holds each step's norm before clipping, so a gradient spike still fires, and a NaN the
    backward makes is named where the backward made it (the backward runs the forward in reverse),
    not at the first parameter, which clipping by a NaN norm fills with NaN too."""
    model, optimizer = _gpt()
    state = {"on": False}
    _poison_gradient_of(model.layers[1].mlp, state)
    monitor = monitors(model, optimizer, dump_path=tmp_path, max_events=5, replay="off")
    norms = []
    for step in range(36):
        state["on"] = step == 33
        loss = _closure(model, optimizer, step, grad_scale=100.0 if step == 30 else 1.0)()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        optimizer.step()
        monitor.step(loss=loss)
    assert [(e.step, e.reason) for e in monitor.events][:2] == [(30, "grad_norm_spike"), (33, "nonfinite")]
    assert monitor.events[1].slot == "backward/layers.1.mlp.out/module#0/parameter_grad.weight"
    assert all(math.isnan(p.sum().item()) for p in model.parameters())  # clipping by a NaN norm spread it
    for step in range(28, 31):  # the norm the loop's clip_grad_norm_ returned, not the clipped one
        assert monitor.triggers.grad_norm(step) == pytest.approx(norms[step], rel=1e-4)
    assert norms[30] > 10 * max(norms[28], norms[29], 1.0)


_FC0_GRADIENT = "backward/layers.0.mlp.fc/module#0/parameter_grad.weight"


def test_with_gradient_accumulation_the_window_holds_the_summed_gradients(monitors, tmp_path: Path) -> None:
    """Each backward's end watches the gradients; the last micro-batch's watch holds their sum."""
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path)
    weight = model.layers[0].mlp.fc.weight
    for step in range(3):
        optimizer.zero_grad()
        for micro in range(3):
            model(*make_batch(CONFIG, batch=2, seed=10 * step + micro)).backward()
        expected = torch.linalg.vector_norm(weight.grad.double()).item()
        weight.grad.mul_(0.5)  # a change after the backward (clipping, say) is not watched
        optimizer.step()
        monitor.step()
        index = next(i for i, slot in enumerate(monitor.ring.slots) if slot.name == _FC0_GRADIENT)
        row = monitor.ring.row(step)
        assert row is not None and row[index, STAT_KEYS.index("norm")] == pytest.approx(expected, rel=1e-6)


class _Poisoned(nn.Module):
    """A layer whose forward takes the log of a negative number at a chosen step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        if self.poison:
            x = torch.log(x - 1e6)  # POISON
        return x


def _poison_line() -> str:
    lines = Path(__file__).read_text().splitlines()
    return f"test_monitor.py:{next(i for i, line in enumerate(lines, 1) if line.strip().endswith('# POISON'))}"


def test_the_replay_names_the_op_that_made_the_nan_and_reproduces_the_step(monitors, tmp_path: Path) -> None:
    torchdebug.seed_all(0)
    model = nn.Sequential(nn.Linear(8, 8), _Poisoned(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = monitors(model, optimizer, dump_path=tmp_path, on_anomaly="skip")
    x = torch.randn(4, 8)
    for step in range(16):
        model[1].poison = step == 12

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.dropout(model(x), 0.5).pow(2).mean()  # random: the replay restores the RNG
            loss.backward()
            return loss

        before = model[0].weight.detach().clone()
        monitor.step(closure)
        if step == 12:
            assert torch.equal(model[0].weight, before)  # on_anomaly="skip": no optimizer step
    (event,) = monitor.events
    assert event.step == 12 and event.slot == "forward/1/module#0/output.0"
    assert event.replay is not None and event.replay.reproduced
    assert "aten.log.default" in event.replay.origin and _poison_line() in event.replay.origin
    assert "reproduced the step bit for bit" in str(event)
    replayed = torchdebug.load(event.replay.dump).ranks[0].records()
    assert {r.step for r in replayed} == {12} and any(r.op == "aten.log.default" for r in replayed)


def test_the_replay_leaves_the_buffers_as_the_step_left_them(monitors, tmp_path: Path) -> None:
    """BatchNorm's running statistics and batch count move at each run of the forward: after a replay
    (two runs more, the step having run compiled code or not) they hold what the step itself made,
    as in a twin run without a monitor."""

    def run(monitored: bool) -> nn.Module:
        torchdebug.seed_all(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
        with torch.inference_mode():  # a buffer no one may write outside inference mode: left alone
            model.register_buffer("table", torch.arange(4.0))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        monitor = monitors(
            model, optimizer, dump_path=tmp_path / "monitor", predicate=lambda s: "asked for" if s.step == 3 else None
        )
        x = torch.randn(4, 8)
        for _ in range(6):

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                return loss

            if monitored:
                monitor.step(closure)
            else:
                closure()
                optimizer.step()
        if monitored:
            assert len(monitor.events) == 1 and monitor.events[0].replay.reproduced
        return model

    twin, watched = run(monitored=False), run(monitored=True)
    assert int(watched[1].num_batches_tracked) == 6
    assert torch.equal(watched[1].running_mean, twin[1].running_mean)
    assert torch.equal(watched[1].running_var, twin[1].running_var)


def test_a_nondeterministic_step_is_not_reproduced(monitors, tmp_path: Path) -> None:
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, predicate=lambda summary: "asked for" if summary.step == 5 else None)
    for step in range(8):
        inner = _closure(model, optimizer, step)
        monitor.step(lambda inner=inner: inner() * (1 + random.random()))  # Python's RNG: not restored
    (event,) = monitor.events
    assert event.reason == "predicate" and event.message == "step 5: asked for"
    assert event.replay is not None and not event.replay.reproduced
    assert "did NOT reproduce" in str(event) and "task='checksum'" in str(event)


def test_on_anomaly_raise_stops_the_loop_with_the_event(monitors, tmp_path: Path) -> None:
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, on_anomaly="raise", replay="off")
    with pytest.raises(AnomalyError) as raised:
        for step in range(10):
            monitor.step(_closure(model, optimizer, step, scale=float("nan") if step == 3 else 1.0))
    assert raised.value.event.step == 3 and raised.value.event.reason == "nonfinite"


def test_bad_options_fail_at_construction(monitors, tmp_path: Path) -> None:
    model, optimizer = _gpt()
    with pytest.raises(ConfigError, match="window: got 1"):
        monitors(model, optimizer, dump_path=tmp_path, window=1)
    with pytest.raises(ConfigError, match="on_anomaly: got 'stop'"):
        monitors(model, optimizer, dump_path=tmp_path, on_anomaly="stop")
    with pytest.raises(ConfigError, match="scaler_overflows: got 0"):
        monitors(model, optimizer, dump_path=tmp_path, scaler_overflows=0)
    with pytest.raises(ConfigError, match="grad_norm_spike_floor: got -0.5"):
        monitors(model, optimizer, dump_path=tmp_path, grad_norm_spike_floor=-0.5)
    with pytest.raises(ConfigError, match="on_write_error: got 'ignore', expected one of 'continue', 'raise'"):
        monitors(model, optimizer, dump_path=tmp_path, on_write_error="ignore")
    with pytest.raises(ConfigError, match=r"^scaler: got 'fp16', expected a torch.amp.GradScaler"):
        monitors(model, optimizer, dump_path=tmp_path, scaler="fp16")
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(torchdebug.DumpError, match="dump_path"):
        monitors(model, optimizer, dump_path=blocked / "monitor")


def test_the_report_of_a_window_draws_the_timeline_with_the_trigger(monitors, tmp_path: Path) -> None:
    from torchdebug.cli import main

    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path / "monitor", window=8, replay="off")
    for step in range(12):
        if step == 10:
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")
        monitor.step(_closure(model, optimizer, step))
    (event,) = monitor.events
    assert main(["report", str(event.window), "-o", str(tmp_path / "window.html")]) == 0
    page = (tmp_path / "window.html").read_text()
    assert 'id="monitor-0"' in page and "step 10: 32 NaN, 0 Inf in forward/layers.1.mlp.out/module#0/output.0" in page
    assert 'id="timeline-map-0"' in page and "the trigger at step 10" in page
    assert "layers.1.mlp.out, step 10: NaN/Inf" in page and "layers.1.mlp.out, step 9: norm" in page
    assert page.index('class="label first"') < page.index(">layers.1.mlp.out<") < page.index('class="label"')  # its row first
    assert page.count("<rect") >= 8 * len({slot.module for slot in monitor.ring.slots if slot.io == "output"}) - 8


def test_the_report_of_a_gradient_spike_draws_each_modules_gradient_norm(monitors, tmp_path: Path) -> None:
    """The gradients reaching ``layers.1.mlp``'s output jump a thousandfold in step 10: the window's
    page draws a heat map of each module's gradient norm, the trigger's module first, with the
    modules before that output (whose gradients pass through it) red at step 10 and those after it not."""
    import re

    from torchdebug.cli import main
    from torchdebug.records import module_of

    model, optimizer = _gpt()
    spike = {"on": False}

    def amplify(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if spike["on"]:
            out.register_hook(lambda grad: grad * 1000.0)

    model.layers[1].mlp.register_forward_hook(amplify)
    monitor = monitors(model, optimizer, dump_path=tmp_path / "monitor", window=12, replay="off")
    for step in range(11):
        spike["on"] = step == 10
        monitor.step(_closure(model, optimizer, step))
    (event,) = monitor.events
    assert (event.step, event.reason) == (10, "grad_norm_spike")
    assert main(["report", str(event.window), "-o", str(tmp_path / "window.html")]) == 0
    page = (tmp_path / "window.html").read_text()
    grads = page[page.index('id="timeline-grads-0"') :]
    grads = grads[: grads.index("</svg>")]
    labels = re.findall(r'<text class="label( first)?"[^>]*>([^<]+)</text>', grads)
    assert labels[0] == (" first", module_of(event.slot)) and module_of(event.slot).startswith("layers.1.mlp")
    norms = {(m, int(s)): float(v) for m, s, v in re.findall(r"<title>([^,]+), step (\d+): norm ([0-9.e+-]+)</title>", grads)}
    assert norms[("layers.1.mlp.fc", 10)] > 100 * norms[("layers.1.mlp.fc", 9)]
    assert norms[("layers.0.attn.qkv", 10)] > 100 * norms[("layers.0.attn.qkv", 9)]  # before the output: through it
    assert norms[("ln_f", 10)] < 10 * norms[("ln_f", 9)]  # after it: not


def _clipped_steps_with_a_nan_at_5(monitor, model: GPT, optimizer, forward_backward) -> list[float]:
    """Six ``monitor.step(closure)`` steps whose closure runs ``forward_backward(step)`` (the loss,
    after its backward) and clips the gradients to 1e-3, a NaN planted in a weight of
    ``layers.1.mlp.out`` at step 5; the norms the clip measured, before clipping."""
    norms = []
    for step in range(6):
        if step == 5:
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = forward_backward(step)
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)))
            return loss

        monitor.step(closure)
    return norms


def _compiled_notices(caplog) -> list[str]:
    """What the monitor's warnings that the model ran inside compiled code said it watches."""
    said = [r.getMessage() for r in caplog.records if r.name == "torchdebug.monitor" and "inside compiled code" in r.getMessage()]
    return [message.split("it watches only ")[1].split(". ")[0] for message in said]


def test_compiled_checkpointed_blocks_are_watched_from_outside_and_replayed_eagerly(monitors, tmp_path: Path, caplog) -> None:
    """Per-block torch.compile with activation checkpointing: no graph break for the monitor's hooks,
    each block's output watched once (not again in the recomputation), the replay's dump op by op."""
    from torch._dynamo.utils import counters
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model, optimizer = _gpt()
    for index, block in enumerate(model.layers):
        block = checkpoint_wrapper(block)
        block.compile(backend="aot_eager")
        model.layers[index] = block
    counters.clear()
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    for step in range(5):
        if step == 3:
            graphs = counters["stats"]["unique_graphs"]
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")
        monitor.step(_closure(model, optimizer, step))
    assert not counters["graph_break"] and _compiled_notices(caplog) == []
    assert counters["stats"]["unique_graphs"] == graphs  # the replay ran the compiled blocks as compiled: nothing recompiled
    forward = sorted(slot.name for slot in monitor.ring.slots if slot.phase == "forward" and slot.op == "module")
    assert "forward/layers.0/module#0/output.0" in forward and "forward/layers.0/module#1/output.0" not in forward
    assert not [name for name in forward if name.startswith("forward/layers.0.")]  # inside the compiled block
    (event,) = monitor.events
    assert (event.step, event.slot) == (3, "forward/layers.1/module#0/output.0")
    assert event.replay is not None and event.replay.reproduced and event.replay.eager_loss is not None
    assert "layers.1.mlp.out" in event.replay.origin
    replayed = torchdebug.load(event.replay.dump).ranks[0].records()
    assert any(r.module == "layers.1.attn.qkv" and r.op == "aten.addmm.default" for r in replayed)


@pytest.mark.parametrize("handed", ["model", "wrapper"])
def test_a_model_compiled_whole_is_watched_before_clipping_and_replayed_eagerly(
    monitors, tmp_path: Path, handed: str, caplog
) -> None:
    """``torch.compile(model)``, the monitor handed the model or the wrapper (the Hugging Face
    Trainer's callbacks get the model, the loop calls the wrapper): its output is watched once per
    step, the gradients before the loop clips them, and the replay's dump holds the model's own ops
    where the compiled step made a NaN."""
    from torch._dynamo.utils import counters

    model, optimizer = _gpt()
    compiled = torch.compile(model, backend="aot_eager")
    counters.clear()
    monitor = monitors(model if handed == "model" else compiled, optimizer, dump_path=tmp_path, window=8)
    calls = []  # what the trainer callbacks see of the model's calls: what was called, with how many arguments
    monitor.watcher.observe_model_calls(calls.append, lambda called, args, kwargs, output: calls.append((called, len(args))))

    def forward_backward(step: int) -> torch.Tensor:
        loss = compiled(*make_batch(CONFIG, batch=2, seed=step))
        loss.backward()
        return loss

    norms = _clipped_steps_with_a_nan_at_5(monitor, model, optimizer, forward_backward)
    assert not counters["graph_break"]
    assert calls == [compiled, (compiled, 2)] * 6  # the wrapper, once a step: not in the replay's two runs
    forward = sorted(slot.name for slot in monitor.ring.slots if slot.phase == "forward")
    assert forward == ["forward/-/monitor.loss#0/output", "forward/<root>/module#0/output.0"]
    assert _compiled_notices(caplog) == ["the model's output and the loss"]  # once, though every step ran so
    watched = [monitor.triggers.grad_norm(step) for step in range(5)]
    assert watched == pytest.approx(norms[:5], rel=1e-5) and min(watched) > 1e-2  # not the clipped 1e-3
    (event,) = monitor.events
    assert (event.step, event.slot) == (5, "forward/<root>/module#0/output.0")
    assert event.replay is not None and event.replay.reproduced and event.replay.eager_loss is not None
    origin = event.replay.origin
    assert origin is not None and "layers.1.mlp.out" in origin and "examples/gpt.py" in origin  # not generated code
    replayed = torchdebug.load(event.replay.dump).ranks[0].records()
    assert any(r.module == "layers.1.attn.qkv" and r.op == "aten.addmm.default" for r in replayed)


def test_a_model_trained_in_eval_mode_has_its_gradients_watched_and_is_not_taken_for_compiled(
    monitors, tmp_path: Path, caplog
) -> None:
    """A model trained in ``eval()`` mode (dropout off; the example's is 0): its modules' outputs are
    not watched, but its call still sets up the gradients' watch before the loop clips them, and
    it is not mistaken for a model that ran inside compiled code (no warning, one replay run)."""
    model, optimizer = _gpt()
    model.eval()
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=8)
    norms = _clipped_steps_with_a_nan_at_5(monitor, model, optimizer, lambda step: _closure(model, optimizer, step)())
    assert [slot.name for slot in monitor.ring.slots if slot.phase == "forward"] == ["forward/-/monitor.loss#0/output"]
    assert [monitor.triggers.grad_norm(step) for step in range(5)] == pytest.approx(norms[:5], rel=1e-5)
    assert _compiled_notices(caplog) == []
    (event,) = monitor.events
    assert event.step == 5 and event.replay.reproduced and event.replay.eager_loss is None


@pytest.mark.parametrize("compiled", [False, True])
def test_a_model_without_submodules_is_taken_for_compiled_only_when_it_ran_compiled(
    monitors, tmp_path: Path, compiled: bool, caplog
) -> None:
    """A model with no module below its root (one ``nn.Linear``) has no inner call that tells an
    eager step from a compiled one: its own call tells, eager or through ``torch.compile``'s wrapper.
    Eager: one replay run; compiled whole: the step as it ran, then eagerly. Never the warning,
    which is about modules inside the model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = torch.compile(model, backend="aot_eager") if compiled else model
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4, on_anomaly="skip")
    x = torch.randn(8, 4)
    for step in range(6):

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = run(x * float("nan") if step == 3 else x).square().mean()
            loss.backward()
            return loss

        monitor.step(closure)
    (event,) = monitor.events
    assert event.step == 3 and event.replay is not None and event.replay.reproduced
    assert (event.replay.eager_loss is not None) == compiled
    assert _compiled_notices(caplog) == []
    torch._dynamo.reset()


@pytest.mark.parametrize("compiled_autograd", [False, True])
def test_a_model_run_by_a_compiled_function_is_watched_before_clipping_from_its_second_step(
    monitors, tmp_path: Path, compiled_autograd: bool, caplog
) -> None:
    """``torch.compile`` of the function that runs the model and its backward: Dynamo traces the
    model's call, so its output never shows. After the first step a hook on one parameter sets up
    the gradients' watch as each backward ends, before the loop clips them; not under compiled
    autograd, whose graph it would break. No graph break is added, and the replay runs the
    function eagerly under capture."""
    from torch._dynamo.utils import counters

    model, optimizer = _gpt()

    @torch.compile(backend="aot_eager")
    def forward_backward(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = model(tokens, targets)
        loss.backward()
        return loss

    counters.clear()
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=8)
    with torch._dynamo.config.patch(compiled_autograd=compiled_autograd):
        norms = _clipped_steps_with_a_nan_at_5(
            monitor, model, optimizer, lambda step: forward_backward(*make_batch(CONFIG, batch=2, seed=step))
        )
    assert all("Tensor.backward()" in reason for reason in counters["graph_break"])  # the function's own break only
    assert [slot.name for slot in monitor.ring.slots if slot.phase == "forward"] == ["forward/-/monitor.loss#0/output"]
    assert _compiled_notices(caplog) == ["the loss"]
    watched = [monitor.triggers.grad_norm(step) for step in range(5)]
    clipped = pytest.approx(1e-3, rel=1e-4)
    assert watched[0] == clipped  # the first step's, at the optimizer step
    assert watched[1:] == ([clipped] * 4 if compiled_autograd else pytest.approx(norms[1:5], rel=1e-5))
    (event,) = monitor.events
    assert event.step == 5 and event.replay is not None and event.replay.reproduced and event.replay.eager_loss is not None
    assert "layers.1.mlp.out" in event.replay.origin and "examples/gpt.py" in event.replay.origin


@pytest.mark.gpu
@pytest.mark.parametrize("closure_mode", [True, False])
def test_on_cuda_the_window_is_read_without_waiting_and_a_nan_is_caught(monitors, tmp_path: Path, closure_mode: bool) -> None:
    """On CUDA the statistics go through the device table: without a closure the step is judged when
    its table has arrived (a step late at most), with one before the optimizer step."""
    torchdebug.seed_all(0)
    model = GPT(CONFIG).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=8, replay="statistics" if closure_mode else "off")
    for step in range(12):
        if step == 9:
            with torch.no_grad():
                model.layers[1].mlp.out.weight[0, 0] = float("nan")
        closure = _closure(model, optimizer, step)
        _step(monitor, optimizer, closure, closure_mode)
    monitor.close()
    event = monitor.events[0]
    assert (event.step, event.slot) == (9, "forward/layers.1.mlp.out/module#0/output.0")
    assert closure_mode == (event.replay is not None and event.replay.reproduced)
    assert 9 in {r.step for r in torchdebug.load(event.window).ranks[0].records()}  # a later step's rows may be in too


def test_a_paused_monitor_watches_nothing_until_resumed(monitors, tmp_path: Path, caplog) -> None:
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path)
    monitor.step(_closure(model, optimizer, 0))
    monitor.pause()
    monitor.step(_closure(model, optimizer, 1))
    monitor.resume()
    monitor.step(_closure(model, optimizer, 2))
    name = monitor.ring.slots[0].name
    seen = {step: monitor.triggers.ring.row(step) for step in (0, 1, 2)}
    index = next(i for i, slot in enumerate(monitor.ring.slots) if slot.name == name)
    assert not np.isnan(seen[0][index]).all() and not np.isnan(seen[2][index]).all()
    assert np.isnan(seen[1]).all()  # paused: no module, gradient or parameter hook ran
    monitor.pause()
    assert not global_module_hooks()  # an eager model's paused steps are plain steps: no hook left
    assert _compiled_notices(caplog) == []  # a paused step's unseen modules did not run compiled


@pytest.mark.parametrize("how", ["function", "whole", "block"])
def test_pausing_for_evaluation_never_compiles_the_model_again(monitors, tmp_path: Path, how: str) -> None:
    """The model run compiled (a compiled function calling it, compiled whole, or its blocks), the
    loop pausing the monitor for an evaluation after each of 12 steps: Dynamo compiled the model's
    calls with the monitor's global hooks registered and guards on their registration ids, so
    hooks registered anew at each resume compiled it again each time, and past the recompile limit
    it ran eagerly. Now: one graph for training and one for evaluation (no grad) per compiled
    frame, every call runs compiled, and the hooks kept through the pause report no call."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(_Block(4, 8), _Block(8, 2))  # Dynamo skips torch.nn's own classes compiled alone
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    counter = CompileCounterWithBackend("eager")
    if how == "function":
        run = torch.compile(lambda x: model(x), backend=counter)
    elif how == "whole":
        run = torch.compile(model, backend=counter)
    else:
        for block in model:
            block.compile(backend=counter)
        run = model
    monitor = monitors(model, optimizer, dump_path=tmp_path)
    x = torch.randn(2, 4)
    frames = 2 if how == "block" else 1
    reported = []  # module calls reported to the watcher while paused: none (the hooks stay, idle)
    watcher_enter = monitor.watcher.enter
    monitor.watcher.enter = lambda module, *args: (reported.append(module), watcher_enter(module, *args))
    for _ in range(12):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = run(x).square().mean()
            loss.backward()
            return loss

        monitor.step(closure)
        monitor.pause()
        reported.clear()
        with torch.no_grad():
            run(x)
        assert reported == []
        monitor.resume()
    assert counter.frame_count == 2 * frames
    run(x)
    assert counter.frame_count == 2 * frames
    torch._dynamo.reset()


def test_a_compiled_optimizer_step_is_compiled_once_and_watched_through_pauses(monitors, tmp_path: Path) -> None:
    """``torch.compile(optimizer.step)`` (PyTorch's recipe for a fused optimizer step) runs the
    optimizer's step hooks, the monitor's among them, and guards on the ids they were registered
    under. They stay registered, idle, through a pause, and Dynamo does not trace them: 12 steps,
    each followed by a pause and a resume, compile the step once (9 times before, each with a
    graph break in the monitor's hook), and every step's gradients and parameters are watched."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    counter = CompileCounterWithBackend("eager")
    optimizer_step = torch.compile(optimizer.step, backend=counter)
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=16)
    x = torch.randn(2, 4)
    for _ in range(12):
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer_step()
        monitor.step(loss=loss)
        monitor.pause()
        monitor.resume()
    assert counter.frame_count == 1
    assert not any("attrgetter" in reason for reason in counters["graph_break"])
    parameters = [i for i, slot in enumerate(monitor.ring.slots) if slot.phase == "optimizer"]
    for step in range(11):  # the last step's rows may be on their way
        assert math.isfinite(monitor.triggers.grad_norm(step))
        assert not np.isnan(monitor.triggers.ring.row(step)[parameters]).any()
    torch._dynamo.reset()


class _Block(nn.Module):
    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_the_device_table_path_fills_the_ring_as_the_cpu_kernel_does_and_catches_a_nan(
    monitors, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU tensors' sums are written into the ring by the native kernel; a device's come through the
    stager's table a step later. The table path, run here on the CPU, fills the same rows (to
    rounding: other kernels) and the same counts, and fires at the same step and slot."""
    from torchdebug import stats_table

    def run(table: bool) -> tuple[list[np.ndarray], torchdebug.monitor.MonitorEvent]:
        if table:
            monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
        model, optimizer = _gpt()
        monitor = monitors(model, optimizer, dump_path=tmp_path / str(table), window=8, replay="off")
        _train_with_a_nan(monitor, model, optimizer, steps=6, nan_at=4)
        monkeypatch.undo()
        return [monitor.ring.row(step).copy() for step in range(4)], monitor.events[0]

    direct, direct_event = run(table=False)
    via_table, table_event = run(table=True)
    for a, b in zip(direct, via_table):
        assert a.shape == b.shape and not np.isnan(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)
    where = (4, "forward/layers.1.mlp.out/module#0/output.0")
    assert (direct_event.step, direct_event.slot) == (table_event.step, table_event.slot) == where


def test_a_steps_parameters_and_gradients_in_one_native_call_fill_the_ring_as_one_call_each(
    monitors, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a step's gradients, and its parameters after the update, are reduced in one native
    call each, their slots found through a cache (in Python, and through the native module that also
    checks and describes them): the ring holds the same slots, in the same order, with the same dtypes,
    shapes and bits, and fires at the same step and slot, as when each goes through the path of
    module outputs, one native call a tensor (an empty parameter included)."""
    from torchdebug.monitor import _watch
    from torchdebug.monitor._native import ring_sums
    from torchdebug.stats._cpu import cpu_sums_into

    batches: list[int] = []
    native_lists: list[int] = []

    class CountedNative:  # the native module, noting the length of each list it takes
        def __init__(self, native: Any) -> None:
            self.native, self.output_sums = native, native.output_sums

        def group_sums(self, tensors: list, *where: Any) -> bool:
            taken = self.native.group_sums(tensors, *where)
            native_lists.append(len(tensors) if taken else -1)
            return taken

    many = _watch.cpu_sums_many_into

    def spy(tensors: list[torch.Tensor], addresses: list[int]) -> None:
        batches.append(len(tensors))
        many(tensors, addresses)

    def one_by_one(tensors: list[torch.Tensor], addresses: list[int]) -> None:
        for tensor, address in zip(tensors, addresses):
            cpu_sums_into(tensor, address)

    def as_module_outputs(self: _watch.Watcher, phase: str, io: str, params: list, values: list) -> None:
        self._add([(phase, *self._name(p), 0, io, value) for p, value in zip(params, values)])

    def run(batched: bool, native: bool = False) -> tuple[list, list[np.ndarray], torchdebug.monitor.MonitorEvent]:
        monkeypatch.setattr(_watch, "ring_sums", (lambda: CountedNative(ring_sums())) if native else (lambda: None))
        if batched:
            monkeypatch.setattr(_watch, "cpu_sums_many_into", spy)
        else:
            monkeypatch.setattr(_watch, "cpu_sums_many_into", one_by_one)
            monkeypatch.setattr(_watch.Watcher, "_add_parameters", as_module_outputs)
        torchdebug.seed_all(0)
        model = GPT(CONFIG)
        model.register_parameter("unused", nn.Parameter(torch.empty(0)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        monitor = monitors(model, optimizer, dump_path=tmp_path / str(batched), window=8, replay="off")
        _train_with_a_nan(monitor, model, optimizer, steps=6, nan_at=4)
        monkeypatch.undo()
        slots = [(slot.name, slot.dtype, slot.shape) for slot in monitor.ring.slots]
        return slots, [monitor.ring.row(step).copy() for step in range(6)], monitor.events[0]

    slots, rows, event = run(batched=True)
    nonempty = len(list(GPT(CONFIG).parameters()))
    assert batches.count(nonempty) == 12  # each step's gradients, and its parameters after the update: one call each
    one_slots, one_rows, one_event = run(batched=False)
    assert slots == one_slots
    assert ("optimizer/<root>/module#0/parameter.unused", "float32", (0,)) in slots
    for batched_row, one_row in zip(rows, one_rows):  # the first step's slots grow (move) the ring as they come
        assert np.array_equal(batched_row, one_row, equal_nan=True)
    assert (event.step, event.slot) == (one_event.step, one_event.slot) == (4, "forward/layers.1.mlp.out/module#0/output.0")
    if ring_sums() is None:
        return
    native_slots, native_rows, native_event = run(batched=True, native=True)
    assert native_lists == [nonempty, nonempty + 1] * 6  # each step's gradients, its parameters (the empty one too)
    assert native_slots == one_slots and (native_event.step, native_event.slot) == (one_event.step, one_event.slot)
    for native_row, one_row in zip(native_rows, one_rows):
        assert np.array_equal(native_row, one_row, equal_nan=True)


# -- fp16 mixed precision: a loss scaler's overflows -------------------------------------------------------
_FIRST_SCALE = 2.0**127
"""A GradScaler's first scale that makes the small GPT's scaled gradients overflow float32 until it
has come down, as fp16's do at the default scale."""


def _scaled_training(monitors, steps: int, watch: dict | None = None, closure_mode: bool = False, loss_factor: float = 1.0):  # noqa: ANN001
    """``steps`` steps of the small GPT under a GradScaler (``loss_factor``: the loss itself scaled),
    watched by a monitor of the options ``watch`` (``None``: none; ``scaler=True`` hands it the
    scaler). Returns the model, the scaler and the monitor."""
    model, optimizer = _gpt()
    scaler = torch.amp.GradScaler("cpu", init_scale=_FIRST_SCALE)
    monitor = None
    if watch is not None:
        monitor = monitors(model, optimizer, **{**watch, "scaler": scaler if watch.get("scaler") else None})
    for step in range(steps):
        batch = make_batch(CONFIG, batch=2, seed=step)

        def closure(batch: tuple = batch) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(*batch) * loss_factor
            scaler.scale(loss).backward()
            return loss

        if monitor is not None and closure_mode:
            monitor.step(closure)
            continue
        loss = closure()
        scaler.step(optimizer)
        scaler.update()
        if monitor is not None:
            monitor.step(loss=loss)
    if monitor is not None:
        monitor.close()
    return model, scaler, monitor


@pytest.mark.parametrize("closure_mode", [False, True], ids=["the loop's scaler.step", "closure"])
def test_a_loss_scalers_overflows_are_counted_not_fired(monitors, tmp_path: Path, closure_mode: bool) -> None:
    """The scaler skips the steps whose gradients overflow and halves its scale each time: routine,
    not an anomaly. With a closure the monitor unscales and steps through the scaler, and the run
    trains exactly as the plain loop does."""
    plain, plain_scaler, _ = _scaled_training(monitors, steps=24)
    skipped = round(math.log2(_FIRST_SCALE / plain_scaler.get_scale()))
    assert 1 <= skipped < 16  # some overflow, then the scale is low enough
    if not closure_mode:  # without scaler=, the first overflow fires
        _, _, blind = _scaled_training(monitors, steps=4, watch={"dump_path": tmp_path / "blind", "replay": "off"})
        assert blind.events[0].step == 0 and "parameter_grad" in blind.events[0].slot
    watch = {"scaler": True, "dump_path": tmp_path}
    model, scaler, monitor = _scaled_training(monitors, steps=24, watch=watch, closure_mode=closure_mode)
    assert monitor.events == [] and monitor.overflows == skipped
    assert scaler.get_scale() == plain_scaler.get_scale()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_overflows_in_a_row_beyond_scaler_overflows_fire(monitors, tmp_path: Path) -> None:
    """A loss so large that its gradients overflow at any scale the scaler reaches: the fourth
    overflow in a row fires, naming the first gradient."""
    watch = {"scaler": True, "dump_path": tmp_path, "scaler_overflows": 4, "replay": "off", "max_events": 5}
    _, _, monitor = _scaled_training(monitors, steps=6, watch=watch, loss_factor=1e30)
    assert [event.step for event in monitor.events] == [3, 4, 5]
    event = monitor.events[0]
    assert event.reason == "nonfinite" and "parameter_grad" in event.slot
    assert "overflowed in 4 steps in a row" in event.message and monitor.overflows == 6


def test_under_a_grad_scaler_the_gradients_are_watched_unscaled_before_the_closure_clips_them(monitors, tmp_path: Path) -> None:
    """fp16's loop: the closure scales the loss, then unscales and clips the gradients. The monitor
    leaves the unscaling to it (a second ``unscale_`` raises), watches the gradients as the backward
    leaves them, scaled, and divides them by the scale staged with them: the window holds the norm
    the clip measured though the scale doubles every 4 steps, a gradient spike fires once, and the
    window dump holds each step's scale."""
    model, optimizer = _gpt()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    monitor = monitors(model, optimizer, dump_path=tmp_path, scaler=scaler, replay="off", max_events=5)
    norms, scales = [], []
    for step in range(32):
        scales.append(scaler.get_scale())
        batch = make_batch(CONFIG, batch=2, seed=step)

        def closure(batch: tuple = batch, step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(*batch)
            if step == 30:
                loss.register_hook(lambda grad: grad * 100.0)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)))
            return loss

        monitor.step(closure)
    assert [(e.step, e.reason) for e in monitor.events] == [(30, "grad_norm_spike")]
    assert scales[30] == 2.0**17  # grown at every 4th step; the monitor never stepped the scaler twice
    for step in range(22, 31):
        assert monitor.triggers.grad_norm(step) == pytest.approx(norms[step], rel=1e-5)
    records = torchdebug.load(monitor.events[0].window).ranks[0].records()
    kept = sorted({r.step for r in records})
    assert [r.stats["mean"] for r in records if r.name == "backward/-/monitor.loss_scale#0/output"] == [scales[s] for s in kept]
    gradient = next(r for r in records if r.step == 30 and r.name == _FC0_GRADIENT)
    assert gradient.stats["norm"] < norms[30]


def test_scaler_false_is_no_scaler(monitors, tmp_path: Path) -> None:
    """``scaler=False`` (a flag a loop passes through, as ``use_amp``) steps the optimizer itself."""
    model, optimizer = _gpt()
    monitor = monitors(model, optimizer, dump_path=tmp_path, scaler=False)
    before = model.layers[0].mlp.fc.weight.detach().clone()
    monitor.step(_closure(model, optimizer, 0))
    assert monitor.scaler is None and not torch.equal(before, model.layers[0].mlp.fc.weight)


def _clipping_scaled_run(monitors, steps: int, watch: dict | None):  # noqa: ANN001
    """``steps`` steps of the small GPT whose closure scales the loss, unscales and clips (a
    monitor of the options ``watch`` given the scaler steps it; ``None``: the loop's own steps).
    Returns the model, the scaler and the monitor."""
    model, optimizer = _gpt()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    monitor = None if watch is None else monitors(model, optimizer, scaler=scaler, **watch)
    for step in range(steps):
        batch = make_batch(CONFIG, batch=2, seed=step)

        def closure(batch: tuple = batch) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(*batch)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-2)
            return loss

        if monitor is not None:
            monitor.step(closure)
            continue
        closure()
        scaler.step(optimizer)
        scaler.update()
    return model, scaler, monitor


def test_the_replay_of_a_closure_that_unscales_runs_and_leaves_the_steps_scaler_state(monitors, tmp_path: Path) -> None:
    """The replay runs the closure again, whose ``unscale_`` the scaler would refuse a second time in
    the step: it gets a fresh state for the replay and the step's own back after, so the replay
    reproduces the step and the run trains exactly as the plain loop does."""
    plain, plain_scaler, _ = _clipping_scaled_run(monitors, steps=4, watch=None)
    fire_at_2 = lambda summary: "asked for" if summary.step == 2 else None  # noqa: E731
    model, scaler, monitor = _clipping_scaled_run(monitors, steps=4, watch={"dump_path": tmp_path, "predicate": fire_at_2})
    assert [(e.step, e.reason) for e in monitor.events] == [(2, "predicate")]
    assert monitor.events[0].replay is not None and monitor.events[0].replay.reproduced
    assert scaler.get_scale() == plain_scaler.get_scale()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_the_device_table_path_through_the_triton_kernel_equals_the_cpu_kernel():
    """The comparison above with the Triton kernel, in Triton's interpreter: a step's gradients, and
    then its parameters, take one launch each through the kernel's directory."""
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    test = f"{Path(__file__).resolve()}::test_the_device_table_path_fills_the_ring_as_the_cpu_kernel_does_and_catches_a_nan"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        env=interpreter_env(),
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_raised_anomaly_leaves_the_scaler_ready_for_the_next_step(monitors, tmp_path: Path) -> None:
    """on_anomaly="raise" under a scaler: the step's unscale_ is followed by the scaler's update, so a
    loop that catches the error goes on."""
    model, optimizer = _gpt()
    scaler = torch.amp.GradScaler("cpu")
    fire_at_2 = lambda summary: "asked for" if summary.step == 2 else None  # noqa: E731
    monitor = monitors(model, optimizer, dump_path=tmp_path, scaler=scaler, predicate=fire_at_2, on_anomaly="raise", replay="off")
    raised = []
    for step in range(4):
        batch = make_batch(CONFIG, batch=2, seed=step)

        def closure(batch: tuple = batch) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(*batch)
            scaler.scale(loss).backward()
            return loss

        try:
            monitor.step(closure)
        except AnomalyError as error:
            raised.append(error.event.step)
    assert raised == [2] and monitor.events[0].reason == "predicate"
