"""The Hugging Face Trainer callback: steps, module paths, and a dump that matches a plain loop."""

import contextlib
import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdebug

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from tests.global_hooks import global_module_hooks  # noqa: E402
from tests.integrations.compiled_step import check_a_compiled_step_dump  # noqa: E402
from torchdebug.integrations.transformers import TorchDebugCallback  # noqa: E402 - after the skip
from torchdebug.store._faults import failing_writes  # noqa: E402


class RegressionNet(nn.Module):
    """A plain module as the Trainer takes it: keyword inputs, a dict with ``loss`` out. It keeps
    the batches it saw, so that a plain loop can replay the Trainer's (shuffled) order."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 2)
        self.batches = []

    def forward(self, x, labels):
        self.batches.append({"x": x, "labels": labels})
        return {"loss": F.mse_loss(self.fc2(torch.relu(self.fc1(x))), labels)}


def _rows(n=8):
    generator = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=generator), "labels": torch.randn(2, generator=generator)} for _ in range(n)]


def _args(tmp_path, **options):
    defaults = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    return transformers.TrainingArguments(**{**defaults, **options})


def _train(tmp_path, model, callback, data, **options):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, **options),
        train_dataset=data,
        callbacks=[callback],
        optimizers=(optimizer, scheduler),
    )
    trainer.train()
    return trainer


def _regression_model():
    torch.manual_seed(0)
    return RegressionNet()


def test_a_trainer_run_compares_with_a_plain_loop_as_all_pass(tmp_path):
    trained = _regression_model()
    _train(tmp_path / "hf", trained, TorchDebugCallback(tmp_path / "hf_dump", step="1-2"), _rows())
    model = _regression_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.Debugger(tmp_path / "plain_dump", step="1-2") as debugger:
        for batch in trained.batches:
            debugger.start(model)
            model(**batch)["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            model.zero_grad()
            debugger.step()
    result = torchdebug.compare(tmp_path / "hf_dump", tmp_path / "plain_dump")
    counts = result.counts()
    assert counts["error"] == 0 and counts["warning"] == 0
    assert not [row for row in result.rows if row.match == "only_b"]  # every row of the plain loop is in the Trainer's
    # the Trainer's own ops (loss scaling by the accumulation steps, its NaN filter) are its alone
    assert counts["pass"] >= 0.8 * len(result.rows)
    assert {row.phase for row in result.rows if row.matched} == {"forward", "backward", "optimizer"}


def test_steps_are_global_steps_and_micro_batches_join_their_step(tmp_path):
    callback = TorchDebugCallback(step=[1], task="structure")
    _train(tmp_path, _regression_model(), callback, _rows(16), gradient_accumulation_steps=2)
    records = torchdebug.load(callback.run_dir).ranks[0].records()
    assert {r.step for r in records} == {1}
    forwards = [
        r for r in records if r.phase == "forward" and r.module == "fc1" and r.op == "aten.addmm.default" and r.io == "output"
    ]
    assert len(forwards) == 2  # two micro-batches accumulate into step 1
    assert callback.run_dir.parent == tmp_path / "torchdebug"  # default: under args.output_dir


def test_a_tiny_gpt2_is_dumped_with_module_paths_in_every_phase(tmp_path):
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (4, 8), generator=generator)]
    callback = TorchDebugCallback(tmp_path / "dump", step=[1], task="structure")
    _train(tmp_path, model, callback, data, max_steps=2)
    records = torchdebug.load(callback.run_dir).ranks[0].records()
    assert {r.phase for r in records} == {"forward", "backward", "optimizer"}
    assert any(r.module == "transformer.h.0.attn.c_attn" for r in records if r.phase == "forward")
    assert any(r.module == "transformer.h.0.attn.c_attn" for r in records if r.phase == "backward")


def test_a_modules_model_output_is_recorded_by_key(tmp_path):
    """Hugging Face models return ``ModelOutput`` dicts: a module-level dump records each of their
    tensors under its key, forward and (the gradients reaching them) backward."""
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with torchdebug.Debugger(tmp_path, level="module", task="statistics") as debugger:
        debugger.start(model)
        model(input_ids=ids, labels=ids).loss.backward()
        debugger.stop()
    records = torchdebug.load(debugger.run_dir).ranks[0].records()
    forward = {(r.module, r.arg) for r in records if r.phase == "forward" and r.io == "output"}
    assert {("<root>", "loss"), ("<root>", "logits"), ("transformer", "last_hidden_state")} <= forward
    backward = {(r.module, r.arg) for r in records if r.phase == "backward" and r.io == "input"}
    assert {("<root>", "loss"), ("transformer", "last_hidden_state")} <= backward


class _SpikingNet(RegressionNet):
    """Its loss jumps ``factor``-fold on the calls of one optimizer step (from the Trainer's state,
    the last one remembered)."""

    def __init__(self, state_of: list, step: int, factor: float = 1000.0) -> None:
        super().__init__()
        self.state_of, self.spike_step, self.factor = state_of, step, factor

    def forward(self, x, labels):
        out = super().forward(x, labels)
        if self.state_of and self.state_of[-1].global_step == self.spike_step:
            out["loss"] = out["loss"] * self.factor
        return out


def _remember_state():
    """A list that holds the Trainer's state once training begins (models read the step from it),
    and the callback that puts it there."""
    state_of: list = []

    class Remember(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            state_of.append(state)

    return state_of, Remember()


def test_the_monitor_catches_a_loss_spike_and_replays_its_step(tmp_path):
    state_of, remember = _remember_state()
    torch.manual_seed(0)
    model = _SpikingNet(state_of, 20)
    callback = TorchDebugCallback(monitor={"history": 8})
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=24, gradient_accumulation_steps=2, max_grad_norm=0.0),
        train_dataset=_rows(48),
        callbacks=[remember, callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    )
    trainer.train()
    (event,) = callback.events
    assert (event.step, event.reason) == (20, "loss_spike")
    assert event.window.parent == tmp_path / "torchdebug-monitor"
    assert event.replay is not None and event.replay.reproduced and event.replay.loss > 100
    replayed = torchdebug.load(event.replay.dump).ranks[0].records()
    assert {r.step for r in replayed} == {20}
    assert len([r for r in replayed if r.module == "fc1" and r.op == "aten.addmm.default" and r.io == "output"]) == 2


def test_the_monitors_raise_leaves_nothing_on_once_it_leaves_the_trainer(tmp_path):
    """``on_anomaly="raise"``: :class:`~torchdebug.errors.AnomalyError` leaves ``train()``, and the
    Trainer has no exception hook, so the callback closes what it runs first: no global module hook
    nor dispatch mode stays (the monitor's watch, capture of the dumped step under way), the dump
    keeps the steps up to the raise, and the event names the step."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from torchdebug.errors import AnomalyError

    state_of, remember = _remember_state()
    torch.manual_seed(0)
    model = _SpikingNet(state_of, 3, float("inf"))
    callback = TorchDebugCallback(tmp_path / "dump", step="0-5", monitor={"window": 4, "on_anomaly": "raise"})
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=6),
        train_dataset=_rows(24),
        callbacks=[remember, callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    )
    with pytest.raises(AnomalyError, match="step 3"):
        trainer.train()
    assert not global_module_hooks()
    assert _get_current_dispatch_mode() is None
    (event,) = callback.events
    assert (event.step, event.reason) == (3, "nonfinite")
    assert {r.step for r in torchdebug.load(callback.run_dir).ranks[0].records()} == {0, 1, 2, 3}
    assert _status(callback.run_dir) == "interrupted"


def _status(run_dir: Path) -> str:
    """The ``status`` of a one-rank run's completion marker."""
    return json.loads((next(run_dir.iterdir()) / "complete.json").read_text())["status"]


class _FailingNet(_SpikingNet):
    """Its forward raises on the first call of one optimizer step (from the Trainer's state); its
    loss is infinite at ``spike_step`` (none at first)."""

    def __init__(self, state_of: list, step: int) -> None:
        super().__init__(state_of, None, float("inf"))
        self.fail_step = step

    def forward(self, x, labels):
        if self.state_of and self.state_of[-1].global_step == self.fail_step:
            self.fail_step = None
            raise RuntimeError("the data loader's worker died")
        return super().forward(x, labels)


def test_a_training_after_one_that_raised_starts_clean(tmp_path):
    """A ``train()`` that raised inside a dumped step (the Trainer has no exception hook: capture
    stays on) and, in the same process, a second ``train()`` with the same callback: the second
    closes what the first left open, so its dump is a run of its own, numbered from its steps, and
    its monitor numbers the steps as the Trainer does (an infinite loss at its step 1: the event
    says step 1); at its end nothing stays on."""
    state_of, remember = _remember_state()
    torch.manual_seed(0)
    model = _FailingNet(state_of, 2)
    callback = TorchDebugCallback(tmp_path / "dump", step="0-5", monitor={"window": 4})
    runs = []
    for max_steps in (4, 3):
        trainer = transformers.Trainer(
            model=model,
            args=_args(tmp_path, max_steps=max_steps),
            train_dataset=_rows(24),
            callbacks=[remember, callback],
            optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
        )
        if not runs:
            with pytest.raises(RuntimeError, match="worker died"):
                trainer.train()
        else:
            model.spike_step = 1
            trainer.train()
        runs.append(callback.run_dir)
    assert runs[0] != runs[1]
    assert {r.step for r in torchdebug.load(runs[0]).ranks[0].records()} == {0, 1, 2}
    assert {r.step for r in torchdebug.load(runs[1]).ranks[0].records()} == {0, 1, 2}
    assert [_status(run) for run in runs] == ["interrupted", "complete"]
    assert [(event.step, event.reason) for event in callback.events] == [(1, "nonfinite")]
    assert not global_module_hooks()


def test_a_second_training_resumed_from_a_checkpoint_is_watched_and_numbered_as_the_trainer_numbers_it(tmp_path):
    """One callback, two ``train()`` calls, the second resumed from the first's checkpoint at step
    4: the monitor, closed at the end of the first, watches the second too, and its event, window and
    replay carry the Trainer's steps (an infinite loss at step 6), not steps counted from 0."""
    state_of, remember = _remember_state()
    torch.manual_seed(0)
    model = _SpikingNet(state_of, 6, float("inf"))
    callback = TorchDebugCallback(monitor={"window": 8})
    for max_steps, resume in ((4, None), (8, str(tmp_path / "checkpoint-4"))):
        transformers.Trainer(
            model=model,
            args=_args(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=4),
            train_dataset=_rows(32),
            callbacks=[remember, callback],
            optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
        ).train(resume_from_checkpoint=resume)
    (event,) = callback.events
    assert (event.step, event.reason) == (6, "nonfinite")
    assert sorted({r.step for r in torchdebug.load(event.window).ranks[0].records()}) == [4, 5, 6]
    assert {r.step for r in torchdebug.load(event.replay.dump).ranks[0].records()} == {6}
    assert event.replay.reproduced


def _ddp_rank(rank: int, root: str) -> None:
    """The Trainer under DDP on 2 gloo ranks (the group made by ``gloo.spawn``; accelerate reads the
    environment and takes it): rank 1's forward makes a NaN at step 3; each rank's event as JSON."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    state_of, remember = _remember_state()

    class PoisonedOnRank1(RegressionNet):
        def forward(self, x, labels):
            hidden = self.fc1(x)
            if rank == 1 and state_of and state_of[-1].global_step == 3:
                hidden = torch.log(-1 - hidden.abs())  # POISON
            return {"loss": F.mse_loss(self.fc2(torch.relu(hidden)), labels)}

    torch.manual_seed(0)
    model = PoisonedOnRank1()
    callback = TorchDebugCallback(monitor={"window": 4})
    trainer = transformers.Trainer(
        model=model,
        args=_args(Path(root), max_steps=5, ddp_backend="gloo"),
        train_dataset=_rows(32),
        callbacks=[remember, callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    )
    trainer.train()
    assert isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
    (event,) = callback.events
    Path(root, f"event{rank}.json").write_text(json.dumps(event.to_dict()))


@pytest.mark.slow
def test_under_ddp_the_replay_calls_ddp_so_the_rank_the_nan_reached_names_the_all_reduce(tmp_path):
    """The Trainer calls DDP's wrapper, and so does the replay: its backward all-reduces the
    gradients as the step's did, so rank 0, which got rank 1's NaN through that all-reduce, names
    it (``from_another_rank``), and rank 1 names its own ``log``. (The replay called the model
    itself: rank 0's found no NaN at all.)"""
    from tests import gloo

    gloo.spawn(_ddp_rank, tmp_path, str(tmp_path))
    events = [json.loads((tmp_path / f"event{rank}.json").read_text()) for rank in (0, 1)]
    assert [(e["step"], e["ranks"]) for e in events] == [(3, [1, 0]), (3, [1, 0])]
    assert all(e["replay"]["reproduced"] for e in events)
    assert events[0]["replay"]["from_another_rank"] and "allreduce" in events[0]["replay"]["origin"]
    assert not events[1]["replay"]["from_another_rank"] and "aten.log.default" in events[1]["replay"]["origin"]


class _ScaledGradient(torch.autograd.Function):
    """The identity, whose gradient is ``factor`` times the one it gets."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _GradientScalingNet(RegressionNet):
    """Its gradients (not its loss) are ``factor`` times larger in one optimizer step (from the Trainer's state)."""

    def __init__(self, state_of: list, step: int, factor: float) -> None:
        super().__init__()
        self.state_of, self.scaled_step, self.factor = state_of, step, factor

    def forward(self, x, labels):
        hidden = self.fc1(x)
        if self.state_of and self.state_of[0].global_step == self.scaled_step:
            hidden = _ScaledGradient.apply(hidden, self.factor)
        return {"loss": F.mse_loss(self.fc2(torch.relu(hidden)), labels)}


def _train_scaling_gradients(tmp_path, step: int, factor: float, max_steps: int, callbacks=(), **options):
    """A model whose gradients are ``factor`` times larger at ``step``; the callback (after ``callbacks``)."""
    state_of, remember = _remember_state()
    torch.manual_seed(0)
    model = _GradientScalingNet(state_of, step, factor)
    callback = TorchDebugCallback(monitor={"replay": "off", "history": 8})
    transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=max_steps, **options),
        train_dataset=_rows(4 * max_steps),
        callbacks=[remember, *callbacks, callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    ).train()
    return callback


def _train_overflowing(tmp_path, **options):
    """Six steps of a model whose gradients overflow at step 3; the callback."""
    return _train_scaling_gradients(tmp_path, 3, float("inf"), 6, **options)


def test_a_gradient_spike_fires_though_the_trainer_clips_the_gradients(tmp_path):
    """The Trainer clips the gradients before its optimizer-step callback (here to a norm of 0.1,
    below every step's): the monitor watched them as the backward left them, before."""
    callback = _train_scaling_gradients(tmp_path, 20, 1000.0, 24, max_grad_norm=0.1)
    (event,) = callback.events
    assert (event.step, event.reason) == (20, "grad_norm_spike")
    assert event.slot == "backward/fc1/module#0/parameter_grad.weight"
    triggers = callback._monitor.monitor.triggers
    assert triggers.grad_norm(20) > 100 * max(triggers.grad_norm(19), 0.1)


def _logged_gradient_norms() -> tuple[dict[int, float], transformers.TrainerCallback]:
    """A dict that gets the gradient norm the Trainer logs for each step (its ``clip_grad_norm_``'s,
    before clipping), and the callback that fills it (log every step)."""
    norms: dict[int, float] = {}

    class GradNorms(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "grad_norm" in logs:  # not the summary at the end
                norms[state.global_step - 1] = logs["grad_norm"]

    return norms, GradNorms()


class _CompiledNet(RegressionNet):
    """RegressionNet without the list of batches, whose growth would recompile it at every call."""

    def forward(self, x, labels):
        return {"loss": F.mse_loss(self.fc2(torch.relu(self.fc1(x))), labels)}


def test_a_model_the_trainer_compiles_is_watched_before_it_clips_without_a_graph_break(tmp_path):
    """``torch_compile=True``: accelerate compiles the model whole, the Trainer calls the compiled
    wrapper and the callback gets the model. Nothing of the callback runs inside the compiled code
    (it broke the graph at each step's first call, to keep the random state), the window holds the
    model's output and each step's gradient norm as the Trainer measured it before clipping to 0.1,
    and a loss spike is replayed on the compiled wrapper, as the step ran, and reproduced."""
    from torch._dynamo.utils import counters

    norms, logged = _logged_gradient_norms()
    torch.manual_seed(0)
    model = _CompiledNet()

    class Spike(transformers.TrainerCallback):  # the weights of step 7 a hundredfold, put back after
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 7:
                with torch.no_grad():
                    model.fc2.weight.mul_(100.0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 8:  # the Trainer counts the step before this call
                with torch.no_grad():
                    model.fc2.weight.div_(100.0)

    callback = TorchDebugCallback(monitor={"history": 4})
    options = dict(
        torch_compile=True, torch_compile_backend="aot_eager", max_grad_norm=0.1, logging_steps=1, logging_strategy="steps"
    )
    counters.clear()
    trainer = transformers.Trainer(
        model=model,
        args=_args(tmp_path, max_steps=8, **options),
        train_dataset=_rows(32),
        callbacks=[logged, Spike(), callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    )
    trainer.train()
    monitor = callback._monitor.monitor
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1
    assert trainer.model_wrapped is not model and monitor.model is model
    assert "forward/<root>/module#0/output.loss" in {slot.name for slot in monitor.ring.slots}  # the wrapper's call, by key
    assert len(norms) == 8 and all(norm > 0.1 for norm in norms.values())
    assert {step: monitor.triggers.grad_norm(step) for step in range(7)} == pytest.approx(
        {s: norms[s] for s in range(7)}, rel=1e-5
    )
    (event,) = callback.events
    assert (event.step, event.reason) == (7, "loss_spike")
    assert event.replay.reproduced and event.replay.eager_loss is not None  # the compiled call again, then eagerly


def test_a_step_of_a_model_the_trainer_compiles_is_dumped_eagerly_with_compiled_code_eager(tmp_path, caplog):
    """``torch_compile=True``, step 1 dumped (see ``check_a_compiled_step_dump``)."""

    def train(compiled_code: str):
        torch.manual_seed(0)
        callback = TorchDebugCallback(tmp_path / compiled_code, step=[1], compiled_code=compiled_code)
        options = dict(torch_compile=True, torch_compile_backend="aot_eager", max_steps=3)
        _train(tmp_path, _CompiledNet(), callback, _rows(), **options)
        return callback.run_dir

    check_a_compiled_step_dump(train, caplog, recompiles_as_run=False)


class _GradScalerTrainer(transformers.Trainer):
    """fp16 as accelerate runs it on CUDA, on the CPU (where accelerate makes no scaler): a GradScaler
    scales the loss, unscales the gradients before the Trainer clips them, and steps the optimizer."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        self.accelerator.native_amp = True


def test_under_a_grad_scaler_the_window_holds_the_gradient_norm_the_trainer_clips(tmp_path):
    """The callback hands the monitor accelerate's GradScaler: the gradients are watched scaled, as
    the backward leaves them, and divided by the scale, so each step's norm is the one the Trainer's
    ``clip_grad_norm_`` measured once it had unscaled them (and clipped them to 0.1 after)."""
    norms, logged = _logged_gradient_norms()
    torch.manual_seed(0)
    model = RegressionNet()
    callback = TorchDebugCallback(monitor={"replay": "off"})
    _GradScalerTrainer(
        model=model,
        args=_args(tmp_path, max_steps=12, fp16=True, max_grad_norm=0.1, logging_strategy="steps", logging_steps=1),
        train_dataset=_rows(48),
        callbacks=[logged, callback],
        optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
    ).train()
    monitor = callback._monitor.monitor
    assert isinstance(monitor.scaler, torch.amp.GradScaler) and callback.events == []
    assert any(slot.op == "monitor.loss_scale" for slot in monitor.ring.slots)
    finite = {step: norm for step, norm in norms.items() if math.isfinite(norm)}  # the scaler's first overflows skipped
    assert len(finite) >= 6 and all(norm > 0.1 for norm in finite.values())
    assert {step: monitor.triggers.grad_norm(step) for step in finite} == pytest.approx(finite, rel=1e-5)


def test_overflowing_gradients_fire_where_no_loss_scaler_skips_them(tmp_path):
    """fp16 on the CPU runs no GradScaler (accelerate's optimizer holds none): nothing skips the step,
    so its infinite gradients fire."""
    callback = _train_overflowing(tmp_path, fp16=True)
    (event,) = callback.events
    assert (event.step, event.reason, event.slot) == (3, "nonfinite", "backward/fc1/module#0/parameter_grad.weight")


@pytest.mark.gpu
def test_a_loss_scalers_overflows_are_counted_not_fired_on_cuda(tmp_path):
    """fp16 on CUDA: accelerate's optimizer steps through a GradScaler, which skips each step whose
    gradients overflow: the planted one (step 3), and any its first scale (65536) overflows on its
    own (step 0 did on an H200). The monitor counts each skipped step once and fires for none."""
    skipped = []

    class Skipped(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            if optimizer.step_was_skipped:
                skipped.append(state.global_step - 1)  # the Trainer counts the step before this call

    callback = _train_overflowing(tmp_path, callbacks=[Skipped()], fp16=True, use_cpu=False)
    assert 3 in skipped and len(skipped) < 6
    assert callback.events == [] and callback._monitor.monitor.overflows == len(skipped)


def test_a_full_disk_leaves_the_training_as_it_was_and_the_dump_and_event_say_why(tmp_path):
    """Every records file fails to write: training runs to the end with the parameters of a run
    without faults, the monitor keeps its event (a NaN factor at step 4), the dump is truncated."""

    def train(path, faults):
        state_of, remember = _remember_state()
        torch.manual_seed(0)
        model = _SpikingNet(state_of, 4, factor=float("nan"))
        callback = TorchDebugCallback(dump_path=path / "dump", step=[1, 2], monitor={"window": 4, "on_anomaly": "skip"})
        trainer = transformers.Trainer(
            model=model,
            args=_args(path, max_steps=8, max_grad_norm=0.0),
            train_dataset=_rows(16),
            callbacks=[remember, callback],
            optimizers=(torch.optim.SGD(model.parameters(), lr=0.01), None),
        )
        with faults:
            trainer.train()
        return callback, model

    healthy, reference = train(tmp_path / "healthy", contextlib.nullcontext())
    callback, model = train(tmp_path / "full", failing_writes(0, errno.ENOSPC, files="records.arrows"))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    assert all(torch.isfinite(p).all() for p in model.parameters())  # on_anomaly="skip" applied
    (event,) = callback.events
    assert event.step == 4 and "No space left on device" in event.write_error and healthy.events[0].write_error is None
    dump = torchdebug.load(callback.run_dir).ranks[0]
    assert "No space left on device" in dump.write_fault["error"] and dump.records() == []
