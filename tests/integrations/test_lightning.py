"""The Lightning callback: a Lightning run dumps what an equivalent plain loop dumps."""

import contextlib
import errno
import json
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdebug

L = pytest.importorskip("lightning.pytorch")
from tests.integrations.compiled_step import check_a_compiled_step_dump  # noqa: E402
from torchdebug.integrations.lightning import TorchDebugCallback  # noqa: E402 - after the skip
from torchdebug.store._faults import failing_writes  # noqa: E402


class LitNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _batches(n=4):
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(n)]


def _model():
    torch.manual_seed(0)
    return LitNet()


def _trainer(tmp_path, callback, **options):
    defaults = dict(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**{"callbacks": [callback], **defaults, **options})


def _fit(tmp_path, callback, **options):
    model = _model()
    _trainer(tmp_path, callback, **options).fit(model, torch.utils.data.DataLoader(_batches(), batch_size=None))
    return model


def _plain_loop(dump_path, steps, **options):
    model = _model()
    optimizer = model.configure_optimizers()
    with torchdebug.Debugger(dump_path, **options) as debugger:
        for index, batch in enumerate(_batches()[:steps]):
            debugger.start(model)
            optimizer.zero_grad()
            model.training_step(batch, index).backward()
            optimizer.step()
            debugger.step()
    return model


def test_a_lightning_run_compares_with_a_plain_loop_as_all_pass(tmp_path):
    _fit(tmp_path / "lit", TorchDebugCallback(tmp_path / "lit_dump", step="1-2"))
    _plain_loop(tmp_path / "plain_dump", 3, step="1-2")
    result = torchdebug.compare(tmp_path / "lit_dump", tmp_path / "plain_dump")
    counts = result.counts()
    assert counts["error"] == 0 and counts["warning"] == 0
    assert not [row for row in result.rows if row.match == "only_b"]  # every row of the plain loop is in Lightning's
    # Lightning's own ops (the loss divided by accumulate_grad_batches, detached for logging) are its alone
    assert counts["pass"] >= 0.9 * len(result.rows)
    matched = [row for row in result.rows if row.matched]
    assert {row.step for row in matched} == {1, 2}
    assert {row.phase for row in matched} == {"forward", "backward", "optimizer"}
    assert {row.module for row in matched if row.phase == "forward"} >= {"fc1", "fc2", "-"}


def _hooks_in_place():
    """How many global module and optimizer hooks and dispatch modes are installed (torch internals)."""
    from torch.nn.modules import module
    from torch.optim import optimizer
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return (
        len(module._global_forward_pre_hooks),
        len(module._global_forward_hooks),
        len(optimizer._global_optimizer_pre_hooks),
        len(optimizer._global_optimizer_post_hooks),
        len(_get_current_dispatch_mode_stack()),
    )


def test_steps_are_global_steps_and_accumulated_batches_join_their_step(tmp_path):
    callback = TorchDebugCallback(step=[1], task="structure")
    _fit(tmp_path, callback, accumulate_grad_batches=2, max_steps=2)
    records = torchdebug.load(callback.run_dir).ranks[0].records()
    assert {r.step for r in records} == {1}
    forwards = [
        r for r in records if r.phase == "forward" and r.module == "fc1" and r.op == "aten.addmm.default" and r.io == "output"
    ]
    assert len(forwards) == 2  # two batches accumulate into step 1
    assert callback.run_dir.parent == tmp_path / "torchdebug"  # default: under trainer.log_dir


def test_nothing_stays_hooked_after_training_and_the_dump_is_complete(tmp_path):
    before = _hooks_in_place()
    callback = TorchDebugCallback(tmp_path / "dump", step=[0])
    _fit(tmp_path, callback)
    assert _hooks_in_place() == before
    assert (next(callback.run_dir.iterdir()) / "complete.json").is_file()


def test_an_exception_in_training_unhooks_and_closes_the_dump(tmp_path):
    class Failing(LitNet):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if batch_idx == 1:
                raise RuntimeError("planted")
            return loss

    before = _hooks_in_place()
    callback = TorchDebugCallback(tmp_path / "dump")
    with pytest.raises(RuntimeError, match="planted"):
        _trainer(tmp_path, callback).fit(Failing(), torch.utils.data.DataLoader(_batches(), batch_size=None))
    assert _hooks_in_place() == before
    assert {r.step for r in torchdebug.load(callback.run_dir).ranks[0].records()} == {0, 1}
    assert json.loads((next(callback.run_dir.iterdir()) / "complete.json").read_text())["status"] == "interrupted"


def test_bad_options_fail_when_the_callback_is_built():
    with pytest.raises(torchdebug.ConfigError, match="task"):
        TorchDebugCallback(task="everything")
    with pytest.raises(torchdebug.ConfigError, match=r"^monitor: got 'yes', expected True, a dict of Monitor options"):
        TorchDebugCallback(monitor="yes")
    with pytest.raises(torchdebug.ConfigError, match=r"^window: got 1, expected an integer >= 2$"):
        TorchDebugCallback(monitor={"window": 1})


class _PoisonedAt(LitNet):
    """Takes the log of a negative number in the forward of one optimizer step."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.poisoned_step = step

    def forward(self, x):
        out = super().forward(x)
        if self.trainer.global_step == self.poisoned_step:
            out = torch.log(-1 - out.abs())  # POISON
        return out


def test_the_monitor_catches_a_nan_and_replays_its_step(tmp_path):
    before = _hooks_in_place()
    callback = TorchDebugCallback(monitor={"window": 4, "on_anomaly": "skip"})
    torch.manual_seed(0)
    model = _PoisonedAt(5)
    _trainer(tmp_path, callback, max_steps=8, accumulate_grad_batches=2).fit(
        model, torch.utils.data.DataLoader(_batches(16), batch_size=None)
    )
    assert callback.run_dir is None  # monitor= alone: no step dumped by the debugger
    (event,) = callback.events
    assert (event.step, event.reason, event.slot) == (5, "nonfinite", "forward/<root>/module#0/output.0")
    assert event.window.parent == tmp_path / "torchdebug-monitor"
    assert sorted({r.step for r in torchdebug.load(event.window).ranks[0].records()}) == [2, 3, 4, 5]
    assert event.replay is not None and event.replay.reproduced
    assert "aten.log.default" in event.replay.origin and "test_lightning.py" in event.replay.origin
    replayed = torchdebug.load(event.replay.dump).ranks[0].records()
    assert len([r for r in replayed if r.op == "aten.log.default" and r.io == "output"]) == 2  # both micro-batches
    assert all(torch.isfinite(p).all() for p in model.parameters())  # on_anomaly="skip": the NaN step was not taken
    assert _hooks_in_place() == before


def test_a_second_fit_resumed_from_a_checkpoint_is_watched_and_numbered_as_the_trainer_numbers_it(tmp_path):
    """One callback, two ``fit`` calls, the second resumed from a checkpoint of the first at step 4:
    the monitor, closed at the end of the first fit, watches the second, and its event, window
    and replay carry the trainer's steps (a NaN at step 6), not steps counted from 0."""
    callback = TorchDebugCallback(monitor={"window": 8})
    torch.manual_seed(0)
    model = _PoisonedAt(6)
    loader = torch.utils.data.DataLoader(_batches(16), batch_size=None)
    first = _trainer(tmp_path, callback, max_steps=4)
    first.fit(model, loader)
    first.save_checkpoint(tmp_path / "step4.ckpt")
    _trainer(tmp_path, callback, max_steps=8).fit(model, loader, ckpt_path=tmp_path / "step4.ckpt")
    (event,) = callback.events
    assert (event.step, event.reason) == (6, "nonfinite")
    assert sorted({r.step for r in torchdebug.load(event.window).ranks[0].records()}) == [4, 5, 6]
    assert {r.step for r in torchdebug.load(event.replay.dump).ranks[0].records()} == {6}
    assert event.replay.reproduced


class _ManualNet(LitNet):
    """Manual optimization with ``optimizers`` SGD optimizers, one per layer, each stepped in turn
    (Lightning's ``global_step`` counts every one of their steps); the log of a negative number in
    the forward of the batch that starts at ``poisoned_step``."""

    def __init__(self, poisoned_step: int, optimizers: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.poisoned_step, self.count = poisoned_step, optimizers

    def forward(self, x):
        out = super().forward(x)
        return torch.log(-1 - out.abs()) if self.trainer.global_step == self.poisoned_step else out

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizers = self.optimizers()
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            loss = F.mse_loss(self(x), y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def configure_optimizers(self):
        if self.count == 1:
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return [torch.optim.SGD(self.fc1.parameters(), lr=0.1), torch.optim.SGD(self.fc2.parameters(), lr=0.1)]


def test_under_manual_optimization_a_nan_is_caught_skipped_and_not_replayed(tmp_path):
    """``training_step`` steps the optimizer itself: the step is judged at its ``optimizer.step()``
    (the gradients dropped: ``skip``), and not replayed, which the event says (a replay ran
    ``training_step`` inside itself, and its backward failed: training crashed)."""
    callback = TorchDebugCallback(monitor={"window": 4, "on_anomaly": "skip"})
    torch.manual_seed(0)
    model = _ManualNet(5, optimizers=1)
    _trainer(tmp_path, callback, max_steps=8).fit(model, torch.utils.data.DataLoader(_batches(16), batch_size=None))
    (event,) = callback.events
    assert (event.step, event.reason, event.slot) == (5, "nonfinite", "forward/<root>/module#0/output.0")
    assert event.replay is None and "manual optimization" in event.no_replay and "manual optimization" in str(event)
    assert sorted({r.step for r in torchdebug.load(event.window).ranks[0].records()}) == [2, 3, 4, 5]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_under_manual_optimization_skip_drops_the_update_of_every_optimizer_of_the_step(tmp_path):
    """Two optimizers stepped in one ``training_step`` (the second after a forward of its own, which
    is finite): ``skip`` leaves every parameter as the batch found it, not only the first
    optimizer's, and the next batch trains again."""
    snapshots = []

    class Snapshots(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            snapshots.append([p.detach().clone() for p in pl_module.parameters()])

        on_train_end = lambda self, trainer, pl_module: self.on_train_batch_start(trainer, pl_module, None, -1)  # noqa: E731

    callback = TorchDebugCallback(monitor={"window": 4, "on_anomaly": "skip"})
    torch.manual_seed(0)
    model = _ManualNet(10, optimizers=2)
    _trainer(tmp_path, callback, max_steps=14, callbacks=[callback, Snapshots()]).fit(
        model, torch.utils.data.DataLoader(_batches(16), batch_size=None)
    )
    assert [(event.step, event.reason) for event in callback.events] == [(10, "nonfinite")]
    changed = [any(not torch.equal(a, b) for a, b in zip(before, after)) for before, after in zip(snapshots, snapshots[1:])]
    assert changed == [True] * 5 + [False] + [True]  # batch 5 (step 10) skipped by both optimizers


def test_under_manual_optimization_with_two_optimizers_events_carry_the_trainers_step(tmp_path):
    """Two optimizers stepped per batch: Lightning's ``global_step`` goes 0, 2, 4, ...; the window
    and the event carry those numbers and keep the last ``window`` batches."""
    callback = TorchDebugCallback(monitor={"window": 4})
    torch.manual_seed(0)
    model = _ManualNet(10, optimizers=2)
    trainer = _trainer(tmp_path, callback, max_steps=14)
    trainer.fit(model, torch.utils.data.DataLoader(_batches(16), batch_size=None))
    assert trainer.global_step == 14
    event = callback.events[0]
    assert (event.step, event.reason) == (10, "nonfinite")
    assert sorted({r.step for r in torchdebug.load(event.window).ranks[0].records()}) == [4, 6, 8, 10]


def test_a_step_of_a_compiled_model_is_dumped_eagerly_with_compiled_code_eager(tmp_path, caplog):
    """``trainer.fit(torch.compile(model))``, step 1 dumped (see ``check_a_compiled_step_dump``).
    By default torch 2.11 and 2.14 compile ``training_step`` again for the dumped step: its Dynamo
    guards on the global module hooks being none, and capture adds some."""

    def train(compiled_code: str):
        callback = TorchDebugCallback(tmp_path / compiled_code, step=[1], compiled_code=compiled_code)
        _trainer(tmp_path, callback).fit(
            torch.compile(_model(), backend="aot_eager"), torch.utils.data.DataLoader(_batches(), batch_size=None)
        )
        return callback.run_dir

    check_a_compiled_step_dump(train, caplog, recompiles_as_run=True)


def test_dumping_many_steps_of_a_compiled_model_compiles_training_step_at_most_twice_more(tmp_path):
    """Lightning compiles ``training_step``, which traces the model's call, global hooks included;
    torch 2.11 and 2.14 guard on the hooks' registration ids. Nine steps dumped, in a row and apart:
    three graphs at most (no hooks, capturing, idle between dumped steps), where new hooks at each
    step would have reached Dynamo's recompile limit and run ``training_step`` eagerly."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    dumped = [1, 2, 3, 4, 5, 7, 9, 11, 13]
    callback = TorchDebugCallback(tmp_path / "dump", step=dumped)
    _trainer(tmp_path, callback, max_steps=15).fit(
        torch.compile(_model(), backend="aot_eager"), torch.utils.data.DataLoader(_batches(15), batch_size=None)
    )
    assert counters["stats"]["unique_graphs"] <= 3
    assert not counters["recompile_limit"]
    assert {r.step for r in torchdebug.load(callback.run_dir).ranks[0].records()} == set(dumped)
    torch._dynamo.reset()


def test_the_monitor_counts_the_overflows_a_16_mixed_run_skips(tmp_path):
    """Precision "16-mixed" runs a GradScaler, which skips the steps whose gradients overflow: the
    monitor finds it and counts them instead of firing. (fp16 autocast on the CPU; a first scale
    of 2**127 overflows float32's gradients until it has come down, as fp16's do.)"""
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)
    callback = TorchDebugCallback(monitor={"window": 4})
    torch.manual_seed(0)
    _trainer(tmp_path, callback, max_steps=6, plugins=[MixedPrecision("16-mixed", "cpu", scaler)]).fit(
        LitNet(), torch.utils.data.DataLoader(_batches(6), batch_size=None)
    )
    assert callback.events == []
    assert callback._monitor.monitor.overflows == round(math.log2(2.0**127 / scaler.get_scale())) >= 1  # its halvings


class _GradientNorms(L.Callback):
    """The total gradient norm Lightning hands the optimizer, unscaled and not yet clipped."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad.double() for p in pl_module.parameters()]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())


def test_under_16_mixed_the_gradients_are_watched_scaled_and_divided_by_the_scale(tmp_path):
    """The callback hands the monitor Lightning's GradScaler: the gradients are watched as the
    backward leaves them, times the scale (2**16), and the window divides them by the scale staged
    with them, so each step's gradient norm is the one the optimizer step is given."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    norms = _GradientNorms()
    callback = TorchDebugCallback(monitor={"window": 8})
    torch.manual_seed(0)
    plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=2.0**16))]
    _trainer(tmp_path, callback, max_steps=4, plugins=plugins, callbacks=[callback, norms]).fit(
        LitNet(), torch.utils.data.DataLoader(_batches(4), batch_size=None)
    )
    monitor = callback._monitor.monitor
    assert callback.events == [] and monitor.overflows == 0
    assert any(slot.op == "monitor.loss_scale" for slot in monitor.ring.slots)
    assert [monitor.triggers.grad_norm(step) for step in range(4)] == pytest.approx(norms.norms, rel=1e-5)


def test_a_full_disk_leaves_the_training_as_it_was_and_the_dump_and_event_say_why(tmp_path, caplog):
    """Every records file fails to write: the fit runs to the end with the parameters of a fit
    without faults, the monitor keeps its event (and skips the NaN step), the dump is truncated."""

    def fit(path, faults):
        callback = TorchDebugCallback(dump_path=path / "dump", step=[2, 3], monitor={"window": 4, "on_anomaly": "skip"})
        torch.manual_seed(0)
        model = _PoisonedAt(5)
        with faults:
            _trainer(path, callback, max_steps=8).fit(model, torch.utils.data.DataLoader(_batches(8), batch_size=None))
        return callback, model

    caplog.set_level(logging.INFO)
    healthy, reference = fit(tmp_path / "healthy", contextlib.nullcontext())
    callback, model = fit(tmp_path / "full", failing_writes(0, errno.ENOSPC, files="records.arrows"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    (event,) = callback.events
    assert event.step == 5 and "No space left on device" in event.write_error and healthy.events[0].write_error is None
    dump = torchdebug.load(callback.run_dir).ranks[0]
    assert "No space left on device" in dump.write_fault["error"] and dump.records() == []
    assert any(f"dump written to {callback.run_dir}, truncated: writing" in r.getMessage() for r in caplog.records)


def test_lightnings_compile_wrapper_keeps_the_one_backend_and_its_dump(tmp_path):
    """Importing Lightning wraps ``torch.compile``: compiling a module deep-copies the arguments, to
    compile again in ``Fabric.setup``. The copy of the backend is the backend: one dump, and a
    backend that holds its dump (a lock) compiles another module."""
    from tests.backends import dump_backend

    torch._dynamo.reset()
    backend = dump_backend(tmp_path, backend="aot_eager")
    first = torch.compile(nn.Linear(2, 2), backend=backend)
    first(torch.ones(1, 2))  # the backend holds its dump from here on
    second = torch.compile(nn.Linear(2, 2), backend=backend)
    second(torch.ones(1, 2))
    assert first._compile_kwargs["backend"] is backend and second._compile_kwargs["backend"] is backend
    backend.data_dump.close()
    torch._dynamo.reset()
    assert {r.op for r in torchdebug.load(backend.data_dump.run_dir).ranks[0].records()} == {
        "aten.addmm.default",
        "aten.t.default",
    }


def test_a_graph_dump_under_accumulate_grad_batches_counts_the_trainers_steps(tmp_path):
    """``trainer.fit(torch.compile(model, backend=...))`` with two batches a step: the graph dump's
    steps are the trainer's optimizer steps, each with both batches' calls (Lightning runs the last
    batch's forward inside ``optimizer.step(closure)``, before the step's post-hook)."""
    from tests.backends import dump_backend

    torch._dynamo.reset()
    backend = dump_backend(tmp_path / "graph", backend="aot_eager")
    model = _model()
    trainer = _trainer(tmp_path, None, callbacks=[], max_steps=2, accumulate_grad_batches=2)
    trainer.fit(torch.compile(model, backend=backend), torch.utils.data.DataLoader(_batches(), batch_size=None))
    backend.data_dump.close()
    torch._dynamo.reset()
    records = torchdebug.load(backend.data_dump.run_dir).ranks[0].records()
    assert trainer.global_step == 2
    assert {record.step for record in records} == {0, 1}
    for step in (0, 1):
        calls = {
            record.call
            for record in records
            if record.step == step and record.op == "aten.addmm.default" and record.phase == "forward"
        }
        assert calls == {0, 1}, calls  # fc1 and fc2, once for each batch
