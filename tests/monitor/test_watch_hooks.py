"""The flight recorder watches what a module returned: its output after the module's own forward
hooks, which run after the monitor's global ones (a user's hook that writes a NaN into a block's
output is that block's, not the next module's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import torchdebug
from examples.gpt import GPT, GPTConfig, make_batch
from tests.monitor import test_monitor
from torchdebug._torch import forward_hooks
from torchdebug._torch.forward_hooks import LastForwardHooks, own_forward_hooks

CONFIG = GPTConfig(n_layer=3, d_model=16, n_head=2, seq_len=8, vocab=32)
NAN_AT = 3

monitors = test_monitor.monitors
"""The fixture building monitors closed after each test."""


def _gpt() -> tuple[GPT, torch.optim.Optimizer]:
    """Three blocks, so that a NaN in block 1's output has a block after it to show in."""
    torchdebug.seed_all(0)
    model = GPT(CONFIG)
    return model, torch.optim.SGD(model.parameters(), lr=1e-2)


def _nan_hook(armed: list[bool], how: str):  # noqa: ANN202
    """A user's forward hook that, once ``armed[0]`` (from step ``NAN_AT`` on), puts a NaN into the
    output: written into it (``in_place``) or in a new tensor it returns (``returned``)."""

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if not armed[0]:  # a flag, not the step: traced by Dynamo, a step number would recompile each step
            return None
        if how == "in_place":
            with torch.no_grad():
                output[0, 0, 0] = float("nan")
            return None
        return output + torch.nn.functional.pad(torch.full((1, 1, 1), float("nan")), (0, 15, 0, 7, 0, 1))

    return hook


def _train(
    monitor: torchdebug.Monitor, model: nn.Module, optimizer: torch.optim.Optimizer, armed: list[bool], steps: range = range(5)
) -> None:
    """``steps`` through ``monitor.step(closure)``, ``armed[0]`` set from step ``NAN_AT`` on."""
    for step in steps:
        armed[0] = step >= NAN_AT

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(*make_batch(CONFIG, batch=2, seed=step))
            loss.backward()
            return loss

        monitor.step(closure)


@pytest.mark.parametrize("how", ["in_place", "returned"])
def test_a_nan_a_blocks_own_forward_hook_puts_into_its_output_names_that_block(monitors, tmp_path: Path, how: str) -> None:
    """The monitor's global hook sees block 1 return before block 1's own hook runs; the output is
    watched once that hook ran, so the event names block 1 (it named ``layers.2.ln1`` before)."""
    model, optimizer = _gpt()
    armed = [False]
    model.layers[1].register_forward_hook(_nan_hook(armed, how))
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    _train(monitor, model, optimizer, armed)
    event = monitor.events[0]
    assert (event.step, event.slot, event.module) == (NAN_AT, "forward/layers.1/module#0/output.0", "layers.1")
    records = torchdebug.load(event.window).ranks[0].records()
    (bad,) = [r for r in records if r.step == NAN_AT and r.name == event.slot]
    assert bad.stats["nan"] == 1
    assert event.replay is not None and event.replay.reproduced and "layers.1/" in event.replay.origin


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_eager_hooked_block_between_compiled_blocks_is_named_without_graph_breaks_or_recompiles(
    monitors, tmp_path: Path, wrapped: bool
) -> None:
    """Blocks 0 and 2 compiled (``block.compile()``, or ``torch.compile(block)``'s wrapper), block 1
    eager with a user's hook: the event names block 1, not compiled block 2 whose output showed the
    NaN first before; the hook placed on block 1 breaks no graph and compiles nothing again."""
    torch._dynamo.reset()
    counters.clear()
    model, optimizer = _gpt()
    counter = CompileCounterWithBackend("aot_eager")
    for index in (0, 2):
        if wrapped:
            model.layers[index] = torch.compile(model.layers[index], backend=counter)
        else:
            model.layers[index].compile(backend=counter)
    armed = [False]
    model.layers[1].register_forward_hook(_nan_hook(armed, "in_place"))
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    _train(monitor, model, optimizer, armed, range(NAN_AT))
    frames = counter.frame_count
    _train(monitor, model, optimizer, armed, range(NAN_AT, 5))
    assert not counters["graph_break"] and counter.frame_count == frames
    event = monitor.events[0]
    assert (event.step, event.module) == (NAN_AT, "layers.1")
    assert event.replay is not None and event.replay.reproduced
    torch._dynamo.reset()


def test_the_hooks_the_monitor_places_on_blocks_compiled_in_place_are_never_compiled(monitors, tmp_path: Path) -> None:
    """``block.compile()`` has Dynamo compile each frame its ``_call_impl`` calls, the hook the
    monitor places after a block's own hooks too: it is run as Python (``never_compiled_as_a_frame``),
    so monitored steps compile no frame that plain ones did not."""
    from tests.blocks import MLPBlock

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(*(MLPBlock() for _ in range(10)))
    for block in model:
        block.register_forward_hook(lambda module, args, output: None)
        block.compile(backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(2, 8)
    model(x).sum().backward()  # compiles the blocks' forward and their own hooks
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    counters.clear()
    for _ in range(3):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).sum()
            loss.backward()
            return loss

        monitor.step(closure)
    assert not counters["frames"]
    torch._dynamo.reset()


@pytest.mark.parametrize("how", ["block.compile", "torch.compile"])
def test_a_compiled_hooked_block_is_still_watched_after_its_hooks_from_outside_its_compiled_call(
    monitors, tmp_path: Path, how: str
) -> None:
    """The hooked block compiled itself: its hook runs inside the compiled call, whose output the
    monitor watches from outside, so nothing is placed on it (a hook placed there would never run,
    and its output would go unwatched)."""
    torch._dynamo.reset()
    counters.clear()
    model, optimizer = _gpt()
    armed = [False]
    model.layers[1].register_forward_hook(_nan_hook(armed, "in_place"))
    if how == "torch.compile":
        model.layers[1] = torch.compile(model.layers[1], backend="aot_eager")
    else:
        model.layers[1].compile(backend="aot_eager")
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    _train(monitor, model, optimizer, armed)
    assert not counters["graph_break"]
    event = monitor.events[0]
    assert (event.step, event.slot) == (NAN_AT, "forward/layers.1/module#0/output.0")
    torch._dynamo.reset()


def test_a_model_compiled_after_eager_steps_traces_the_placed_hook_without_a_graph_break(monitors, tmp_path: Path) -> None:
    """Eager steps placed the monitor's hook on block 1; the model then compiled whole traces it
    (it returns at once under Dynamo): no graph break, nothing compiled again from step to step,
    and the NaN still fires at its step, in the model's output."""
    torch._dynamo.reset()
    counters.clear()
    model, optimizer = _gpt()
    armed = [False]
    model.layers[1].register_forward_hook(_nan_hook(armed, "in_place"))
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    _train(monitor, model, optimizer, armed, range(2))
    assert len(model.layers[1]._forward_hooks) == 2  # the user's, then the monitor's
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    _train(monitor, compiled, optimizer, armed, range(2, NAN_AT + 1))  # the user's hook armed: compiled again
    frames = counter.frame_count
    _train(monitor, compiled, optimizer, armed, range(NAN_AT + 1, 6))
    assert not counters["graph_break"] and counter.frame_count == frames
    event = monitor.events[0]
    assert (event.step, event.module) == (NAN_AT, "<root>")
    torch._dynamo.reset()


def test_a_hook_the_user_adds_later_runs_before_the_monitors_and_only_hooked_modules_get_one(monitors, tmp_path: Path) -> None:
    """The monitor's hook is placed on the modules with hooks of their own only, and moved last when
    the user adds one after it (here the one writing the NaN); close takes it out."""
    model, optimizer = _gpt()
    armed = [False]
    block = model.layers[1]
    block.register_forward_hook(lambda module, args, output: None)
    monitor = monitors(model, optimizer, dump_path=tmp_path, window=4)
    _train(monitor, model, optimizer, armed, range(2))
    assert len(block._forward_hooks) == 2
    assert [name for name, module in model.named_modules() if module._forward_hooks] == ["layers.1"]
    block.register_forward_hook(_nan_hook(armed, "in_place"))
    for step in range(2, 5):
        armed[0] = step >= NAN_AT
        loss = model(*make_batch(CONFIG, batch=2, seed=step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(loss=loss)
    assert (monitor.events[0].step, monitor.events[0].module) == (NAN_AT, "layers.1")
    monitor.close()
    assert len(block._forward_hooks) == 2


def test_a_forward_hook_added_while_a_call_runs_runs_in_it_after_the_modules_own():
    """The seam's premise on the running torch: ``_call_impl`` reads a module's forward hooks once
    its ``forward`` returned."""
    assert forward_hooks.hooks_read_after_forward() and forward_hooks.HOOKS_READ_AFTER_FORWARD
    seen: list[tuple[str, torch.Tensor]] = []
    linear = nn.Linear(2, 2)
    last = LastForwardHooks(lambda module, args, kwargs, output: seen.append(("last", output)))
    assert not own_forward_hooks(linear) and not last.place(linear)
    linear.register_forward_hook(lambda module, args, output: output * 0)
    assert own_forward_hooks(linear) and last.place(linear)
    output = linear(torch.ones(1, 2))
    assert len(seen) == 1 and seen[0][1] is output and not output.any()
    linear.register_forward_hook(lambda module, args, output: output + 1)  # after the placed hook: moved last
    assert last.place(linear)
    output = linear(torch.ones(1, 2))
    assert len(seen) == 2 and seen[1][1] is output and (output == 1).all()
    last.remove()
    assert len(linear._forward_hooks) == 2
