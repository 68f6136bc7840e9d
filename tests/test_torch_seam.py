"""Every seam in ``torchdebug._torch`` works on the running torch: each test runs the seam, so a
torch release that moves or changes what it wraps fails here, by name, before any feature test."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.torch_version import TorchVersion

import torchdebug._torch as seam
from tests.blocks import MLPBlock
from torchdebug._torch import amp, autograd, dispatch, dynamo, frames, inductor, pytree
from torchdebug._torch.compiling import CompileEvents, frame_callback_setter
from torchdebug._torch.custom_ops import DispatcherCalls
from torchdebug._torch.global_hooks import GlobalForwardHooks, forward_raised, never_compiled_as_a_frame
from torchdebug._torch.nn import (
    compiled_modules,
    compiles_a_wrapper,
    is_compiled_wrapper,
    module_hooks,
    named_module_list,
    parameters_and_hooked,
    unwrap_compiled,
)

# -- versions -------------------------------------------------------------------------------------


def test_the_running_torch_is_a_supported_release():
    assert seam.at_least(seam.MINIMUM_TORCH)
    assert seam.TORCH_VERSION >= seam.MINIMUM_TORCH and isinstance(seam.TORCH_VERSION, TorchVersion)


def test_versions_compare_as_versions_not_strings(monkeypatch):
    assert seam.at_least("2.11")  # the running release's answer first: a remembered one must not outlive it
    monkeypatch.setattr(seam, "TORCH_VERSION", TorchVersion("2.10.0"))
    assert seam.at_least("2.9")  # "2.10" > "2.9" as versions, though not as strings
    assert not seam.at_least("2.11")


def test_require_raises_one_line_naming_both_versions(monkeypatch):
    monkeypatch.setattr(seam, "TORCH_VERSION", TorchVersion("2.6.0"))
    with pytest.raises(seam.TorchVersionError, match=r"^torchdebug needs torch >= 2\.11 for eager capture, found ") as raised:
        seam.require("eager capture")
    assert "\n" not in str(raised.value) and isinstance(raised.value, ImportError)


def test_every_version_difference_names_a_release_and_the_function_that_handles_it():
    for difference in seam.VERSION_DIFFERENCES:
        assert TorchVersion(difference.since) > seam.MINIMUM_TORCH, difference
        module, _, name = difference.handled_by.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), difference.handled_by


_OLD_TORCH = """
import torch
torch.__version__ = "2.6.0"
import torchdebug
assert torchdebug.__version__
try:
    torchdebug.{feature}
except ImportError as error:
    print(type(error).__name__, str(error))
"""


@pytest.mark.parametrize("feature", ["Debugger", "get_backend"])
def test_on_an_older_torch_import_works_and_the_first_use_names_the_version(feature):
    code = _OLD_TORCH.format(feature=feature)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("TorchVersionError torchdebug needs torch >= 2.11 for ") and "found 2.6.0" in line, line


# -- autograd -------------------------------------------------------------------------------------


def test_backward_ops_see_the_autograd_node_whose_sequence_number_their_forward_op_took():
    seen: dict[str, object] = {}

    class Mode(dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            node = autograd.current_autograd_node()
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.mul.Tensor and node is None:
                seen["forward"] = autograd.next_sequence_nr() - 1
            elif node is not None and "Mul" in type(node).__name__:
                seen["backward"] = autograd.node_sequence_nr(node)
            return out

    x = torch.randn(3, requires_grad=True)
    with Mode():
        (x * 2).sum().backward()
    assert autograd.current_autograd_node() is None
    assert seen["forward"] == seen["backward"]


def test_after_backward_runs_once_the_final_callbacks_queued_in_the_backward_have_run():
    """As FSDP2 and DDP do, a final callback queued as the backward starts sets a gradient; ours,
    queued before it, still sees the gradient set."""
    from torch.autograd import Variable

    weight = torch.ones(3, requires_grad=True)
    seen: list = []

    def late() -> None:
        seen.append("theirs")
        weight.grad = weight.grad * 10

    def hook(grad: torch.Tensor) -> torch.Tensor:
        autograd.after_backward(lambda: seen.append(weight.grad.tolist()))
        Variable._execution_engine.queue_callback(late)
        return grad

    doubled = weight * 2
    doubled.register_hook(hook)
    doubled.sum().backward()
    assert seen == ["theirs", [20.0, 20.0, 20.0]]


# -- amp ----------------------------------------------------------------------------------------------


def test_a_grad_scalers_scale_tensor_and_unscaled_stage_are_read_without_stepping_it():
    weight = torch.ones(3, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    read = amp.scale_reader(scaler)
    assert read is not None and read() is None  # no loss scaled yet
    scaler.scale((weight * 2).sum()).backward()
    assert read().item() == 8.0 and weight.grad.tolist() == [16.0] * 3
    assert not amp.unscaled(scaler, optimizer)
    scaler.unscale_(optimizer)
    assert amp.unscaled(scaler, optimizer) and weight.grad.tolist() == [2.0] * 3
    step_state = scaler._per_optimizer_states[id(optimizer)]
    with amp.unscaling_again(scaler, optimizer):  # a replay of the step's closure
        assert not amp.unscaled(scaler, optimizer)
        scaler.unscale_(optimizer)
    assert scaler._per_optimizer_states[id(optimizer)] is step_state
    scaler.step(optimizer)
    scaler.update()
    assert not amp.unscaled(scaler, optimizer)
    assert amp.scale_reader(torch.amp.GradScaler("cpu", enabled=False))() is None
    assert amp.scale_reader(object()) is None and not amp.unscaled(object(), optimizer)


def test_tensor_version_counts_in_place_writes():
    x = torch.zeros(2)
    before = autograd.tensor_version(x)
    x.add_(1)
    assert autograd.tensor_version(x) == before + 1
    with torch.inference_mode():
        made = torch.zeros(2)
    assert autograd.tensor_version(made) is None  # an inference tensor keeps none (its _version raises)


# -- dispatch -------------------------------------------------------------------------------------


def test_op_overloads_and_their_schemas():
    assert isinstance(torch.ops.aten.mm.default, dispatch.OpOverload)
    assert isinstance(torch.ops.aten.mm, dispatch.OpOverloadPacket)
    assert dispatch.op_schema(torch.ops.aten.add_.Tensor).is_mutable
    assert not dispatch.op_schema(torch.ops.aten.add.Tensor).is_mutable
    assert [a.name for a in dispatch.op_schema(torch.ops.aten.mm.default).arguments] == ["self", "mat2"]


@torch.library.custom_op("torchdebug_seam::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _custom_op_recorded() -> bool:
    """Whether an ``at::RecordFunction`` callback (the profiler's) sees the custom op's call."""
    with torch.autograd.profiler.profile() as profile:
        _twice(torch.ones(2))
    return any(event.name == "torchdebug_seam::twice" for event in profile.function_events)


def test_custom_ops_reach_record_function_callbacks_while_dispatcher_calls_are_entered():
    calls = DispatcherCalls()
    calls.enter()
    try:
        assert _custom_op_recorded()
    finally:
        calls.exit()
    # torch 2.14's PyObject dispatch skips the dispatcher's call again once exited
    assert _custom_op_recorded() is not seam.at_least("2.14")


def test_ops_whose_writes_move_no_version_are_told_by_their_kernels() -> None:
    """``moves_versions``: in-place and ``out=`` ops move the versions of what they write; BatchNorm's
    kernel (running statistics), a fused optimizer and ``_foreach_*_`` under a dispatch mode do not."""
    for op in (torch.ops.aten.add_.Tensor, torch.ops.aten.copy_.default, torch.ops.aten.mm.out):
        assert dispatch.moves_versions(op)
    for op in (torch.ops.aten.native_batch_norm.default, torch.ops.aten._fused_adam_.default, torch.ops.aten._foreach_add_.List):
        assert not dispatch.moves_versions(op)
    statistics = torch.zeros(3)
    before = statistics._version
    torch.ops.aten.native_batch_norm.default(torch.randn(4, 3), None, None, statistics, torch.ones(3), True, 0.1, 1e-5)
    assert statistics._version == before and statistics.any()  # written, no version moved


def test_a_dispatch_mode_that_ignores_compile_internals_leaves_compiled_code_compiled():
    torch._dynamo.reset()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    class Mode(dispatch.TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    fn = torch.compile(lambda x: x.sin() + 1, backend=backend)
    fn(torch.randn(4))
    with Mode():
        fn(torch.randn(4))
    assert len(compiles) == 1
    torch._dynamo.reset()


# -- nn -------------------------------------------------------------------------------------------


_WALKS_BEFORE_DYNAMO = """
import sys
from torch import nn
import torchdebug._torch.nn as seam

walks = []
walk = seam.named_module_list
seam.named_module_list = lambda root: walks.append(root) or walk(root)

model = nn.Sequential(nn.Linear(2, 2))
assert "torch._dynamo" not in sys.modules
assert list(seam.compiled_modules(model)) == []
print(len(walks))
model.compile(backend="eager")
print([path for path, _ in seam.compiled_modules(model)], len(walks))
"""


def test_compiled_modules_walk_no_module_before_dynamo_is_loaded():
    """A capture asks at each step's stop whether the model ran compiled code: before anything
    imported Dynamo nothing can have compiled, and a 256-layer model's walk is not paid for that."""
    run = subprocess.run([sys.executable, "-c", _WALKS_BEFORE_DYNAMO], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["0", "[''] 1"]


def test_a_walk_of_the_modules_is_named_modules_shared_and_missing_children_included():
    shared = nn.Linear(3, 3)
    inner = nn.Sequential(shared, nn.LayerNorm(3))
    inner.add_module("gone", None)
    model = nn.Sequential(nn.Linear(2, 3), shared, nn.ModuleDict({"b": inner, "a": nn.ReLU()}), inner)
    walked = named_module_list(model)
    assert [(path, id(module)) for path, module in walked] == [(path, id(module)) for path, module in model.named_modules()]
    assert [path for path, _ in walked] == ["", "0", "1", "2", "2.b", "2.b.1", "2.a"]  # (each module at its first path)


def test_compiled_modules_are_the_wrappers_and_the_modules_compiled_in_place_outer_first():
    block = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model = nn.Sequential(torch.compile(nn.Linear(2, 2), backend="eager"), block)
    block[0].compile(backend="eager")
    found = [(path, type(module).__name__) for path, module in compiled_modules(model)]
    assert found == [("0", "OptimizedModule"), ("1.0", "Linear")]


def test_one_walk_gives_the_models_parameters_in_order_and_the_modules_with_their_own_forward_hooks():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(nn.Linear(2, 3), shared, nn.Sequential(shared, nn.LayerNorm(3)), nn.ReLU())
    model[0].register_parameter("bias", None)
    model.register_buffer("scale", torch.ones(1))
    model[2][1].register_forward_hook(lambda *_: None)
    model[3].register_forward_pre_hook(lambda *_: None)  # a pre-hook only: not a forward hook
    parameters, hooked = parameters_and_hooked(model)
    assert [id(p) for p in parameters] == [id(p) for p in model.parameters()]
    assert hooked == [model[2][1]]


def test_a_hook_never_compiled_as_a_frame_runs_as_python_under_a_module_compiled_in_place_and_is_traced_inline():
    """``module.compile()`` compiles the frames its ``_call_impl`` calls, hooks included, unless the
    hook's code says Dynamo runs it as Python; a compiled function calling the module traces it."""
    seen = []

    def hook(module: nn.Module, args: tuple) -> None:
        seen.append(torch.compiler.is_compiling())

    torch._dynamo.reset()
    assert never_compiled_as_a_frame(hook) is hook
    block, outer = MLPBlock(), MLPBlock()  # a module of the user's (torch 2.14 traces an nn.Linear's _call_impl)
    block.register_forward_pre_hook(hook)
    outer.register_forward_pre_hook(hook)
    block.compile(backend="eager")
    block(torch.ones(1, 8))
    torch.compile(lambda x: outer(x), backend="eager")(torch.ones(1, 8))
    assert seen == [False, True]
    torch._dynamo.reset()


def test_compile_events_say_when_a_compilation_starts_and_ends_while_entered():
    seen: list[bool] = []
    events = CompileEvents(seen.append)
    torch._dynamo.reset()
    events.enter()
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    events.exit()
    torch.compile(lambda x: x + 2, backend="eager")(torch.ones(2))
    assert seen == [True, False]
    events.enter()
    torch._dynamo.reset()  # clears Dynamo's callbacks: leaving finds none to take out
    events.exit()
    torch.compile(lambda x: x + 3, backend="eager")(torch.ones(2))
    assert seen == [True, False]
    torch._dynamo.reset()


def test_the_frame_callback_setter_turns_dynamo_off_for_the_frames_that_start_and_puts_it_back():
    """Inside a frame Dynamo runs eagerly (one its backend failed to compile) its callback is on, and
    a Python frame starting there would be compiled: the setter turns it off and back, as
    ``torch.compiler.disable`` does (the native observer's hooks run so)."""
    setter = frame_callback_setter()
    assert setter is not None
    seen = []

    def inside(x: torch.Tensor) -> torch.Tensor:
        before = setter(None)
        seen.append((before is not None, torch._C._dynamo.eval_frame.get_eval_frame_callback()))
        assert setter(before) is None
        seen.append(torch._C._dynamo.eval_frame.get_eval_frame_callback() is before)
        return x + 1

    def failing(gm, example_inputs):  # noqa: ANN001, ANN202
        raise RuntimeError("a backend that cannot compile")

    torch._dynamo.reset()
    with torch._dynamo.config.patch(suppress_errors=True):
        torch.compile(lambda x: inside(x), backend=failing)(torch.ones(2))
    assert seen == [(True, None), True]
    torch._dynamo.reset()


def test_global_hooks_see_each_module_call_once_and_silence_only_while_registered():
    """Each call reaches the hooks once, told whether Dynamo traces it (the compiled call's are, an
    eager call's are not), and torch's warning about the wrapper is silenced while they are registered."""
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    compiled = torch.compile(model, backend="eager")
    assert is_compiled_wrapper(compiled) and unwrap_compiled(compiled) is model and unwrap_compiled(model) is model
    entered, exited = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooks = GlobalForwardHooks(
            lambda m, args, traced: entered.append((m, traced)), lambda m, args, kwargs, out, traced: exited.append((m, traced))
        )
        compiled(torch.randn(1, 2))
        model(torch.randn(1, 2))
        hooks.remove()
        hooks.remove()  # twice is harmless
        compiled(torch.randn(1, 2))
    calls = [model, model[0], model[1]]
    assert entered == [(m, True) for m in calls] + [(m, False) for m in calls]
    assert sorted((id(m), traced) for m, traced in exited) == sorted((id(m), traced) for m, traced in entered)
    assert len([w for w in caught if "global hooks" in str(w.message)]) == 0
    assert not torch.nn.modules.module._has_any_global_hook(), "a hook id was left in torch's global dicts"
    torch._dynamo.reset()


def test_a_forward_that_raises_reaches_the_raised_callback_not_the_exit_one_and_torch_does_not_warn():
    """torch 2.11 through 2.14 call an always-called global hook without its kwargs when the forward
    raised (``forward_raised``): the hooks hand that call to ``raised``, and torch sees no failing hook."""

    class Failing(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("on purpose")

    failing, seen = Failing(), []
    hooks = GlobalForwardHooks(
        lambda m, args, traced: seen.append(("enter", m)),
        lambda m, args, kwargs, out, traced: seen.append(("exit", m)),
        lambda m, traced: seen.append(("raised", m)),
    )
    try:
        with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="on purpose"):
            warnings.simplefilter("always")
            failing(torch.randn(1, 2))
    finally:
        hooks.remove()
    assert seen == [("enter", failing), ("raised", failing)]
    assert [str(w.message) for w in caught] == []
    assert forward_raised((None,)) and not forward_raised(({}, None))


@pytest.mark.parametrize("outside_compiled", [False, True])
def test_paused_global_hooks_stay_registered_and_report_nothing_until_resumed_from_a_clean_slate(outside_compiled):
    """Paused, the hooks stay in torch's global dicts (compiled code guards on them) and report no
    call; resumed, they report again. A ``KeyboardInterrupt`` inside a compiled wrapper's call
    skips torch's always-called hook, so the wrapper would stand for its module's later calls:
    the resume forgets it."""

    class Interrupted(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    torch._dynamo.reset()
    model, interrupted = nn.Linear(2, 2), Interrupted()
    compiled = torch.compile(interrupted, backend="eager")
    calls = []
    hooks = GlobalForwardHooks(
        lambda m, args, traced: calls.append(("enter", m)),
        lambda m, args, kwargs, out, traced: calls.append(("exit", m)),
        outside_compiled=outside_compiled,
    )
    try:
        hooks.pause()
        model(torch.randn(1, 2))
        assert calls == [] and torch.nn.modules.module._has_any_global_hook()
        hooks.resume()
        model(torch.randn(1, 2))
        assert calls == [("enter", model), ("exit", model)]
        with torch.compiler.set_stance("force_eager"), pytest.raises(KeyboardInterrupt):
            compiled(torch.randn(1, 2))
        assert hooks.stands_in(interrupted) == outside_compiled  # the wrapper's call never seen to end
        hooks.pause()
        hooks.resume()
        assert not hooks.stands_in(interrupted) and hooks.called_as(interrupted) is interrupted
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            interrupted(torch.randn(1, 2))
        assert calls == [("enter", interrupted)]  # its own call is reported, not taken for the wrapper's
    finally:
        hooks.remove()
    assert not torch.nn.modules.module._has_any_global_hook()
    torch._dynamo.reset()


def test_outside_compiled_a_compiled_wrappers_call_stands_for_its_modules_call_once():
    """With ``outside_compiled`` the hooks never see the calls inside compiled code; the call of
    ``torch.compile(module)``'s wrapper is reported as its module's (through any wrapper it holds),
    once, also when the module's call runs eagerly under the ``force_eager`` stance."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    compiled = torch.compile(checkpoint_wrapper(model), backend="eager")
    calls, outputs, called_as = [], [], []
    hooks = GlobalForwardHooks(
        lambda m, args, traced: (calls.append(("enter", m)), called_as.append(hooks.called_as(m))),
        lambda m, args, kwargs, out, traced: (calls.append(("exit", m)), outputs.append(out)),
        outside_compiled=True,
    )
    try:
        output = compiled(torch.randn(3, 2))
        assert calls == [("enter", model), ("exit", model)] and outputs == [output]
        assert called_as == [compiled] and hooks.called_as(model) is model  # the wrapper, while its call runs
        calls.clear()
        with torch.compiler.set_stance("force_eager"):
            compiled(torch.randn(3, 2))
    finally:
        hooks.remove()
    linear, relu = model
    assert calls == [("enter", model), ("enter", linear), ("exit", linear), ("enter", relu), ("exit", relu), ("exit", model)]
    torch._dynamo.reset()


def test_outside_compiled_the_outermost_wrapper_is_what_a_modules_call_was_made_on():
    """``DataParallel`` (on the CPU it calls its module) holds its module as ``module``: its call
    reaches the hooks as a call of its own, and the module's call inside it was made on it, also
    through a compiled wrapper and a checkpoint wrapper (``DataParallel(torch.compile(
    checkpoint_wrapper(model)))``); not once it has returned. A module wrapper alone (FSDP1's, a
    checkpoint's: its call is skipped) is what its module's call was made on too."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    def called_as(wrapper: nn.Module) -> tuple[dict[nn.Module, nn.Module], GlobalForwardHooks]:
        """What each module's call was made on, asked as it started, in a call of ``wrapper``."""
        seen: dict[nn.Module, nn.Module] = {}
        hooks = GlobalForwardHooks(
            lambda m, args, traced: seen.setdefault(m, hooks.called_as(m)), lambda *a: None, outside_compiled=True
        )
        try:
            wrapper(torch.randn(3, 2))
        finally:
            hooks.remove()
        return seen, hooks

    torch._dynamo.reset()
    model = nn.Linear(2, 2)
    for inner in (model, torch.compile(model, backend="eager"), torch.compile(checkpoint_wrapper(model), backend="eager")):
        wrapper = nn.DataParallel(inner)
        seen, hooks = called_as(wrapper)
        assert seen == {wrapper: wrapper, model: wrapper} and hooks.called_as(model) is model
    checkpointed = checkpoint_wrapper(model)
    assert called_as(checkpointed)[0] == {model: checkpointed}
    torch._dynamo.reset()


# -- pytree ---------------------------------------------------------------------------------------


def test_tree_leaves_flattens_nested_outputs():
    a, b, c = torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)
    assert [t.item() for t in pytree.tree_leaves((a, {"x": [b, (c,)]}))] == [1.0, 0.0, 2.0]


# -- dynamo ---------------------------------------------------------------------------------------


def test_graph_breaks_recompiles_and_compile_ids_are_read_from_what_dynamo_hands_a_backend():
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append(
            (
                dynamo.compile_id(gm),
                dynamo.graph_break_reason(gm),
                dynamo.recompile_reason(),
                dynamo.detect_fake_mode(example_inputs),
            )
        )
        return gm.forward

    def fn(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    compiled = torch.compile(fn, backend=backend)
    compiled(torch.randn(3))
    compiled(torch.randn(3, dtype=torch.float64))  # a recompile
    ids = [s[0] for s in seen]
    assert ids[0] == "0/0" and any(i.endswith("/1") for i in ids), ids
    reason, frames = seen[0][1]
    assert "graph_break" in reason and frames and frames[-1]["function"] == "fn", (reason, frames)
    assert seen[0][2] is None and any(s[2] for s in seen[2:]), [s[2] for s in seen]
    assert all(s[3] is not None for s in seen)
    torch._dynamo.reset()


def test_a_backward_traced_by_compiled_autograd_is_told_while_dynamo_compiles_it():
    from torchdebug._torch import guards

    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append(guards.compiling_compiled_autograd())
        return gm.forward

    weight = torch.randn(3, requires_grad=True)
    loss = torch.compile(lambda x: (x * weight).sin().sum(), backend=backend)(torch.randn(3))
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend)):
        loss.backward()
    assert seen[0] is False and seen[-1] is True and weight.grad is not None, seen
    assert not guards.compiling_compiled_autograd()
    torch._dynamo.reset()


def test_aot_autograd_with_boxed_eager_compilers_runs_forward_and_backward():
    torch._dynamo.reset()
    phases = []

    def compiler(phase):
        def compile_graph(gm, inputs):
            phases.append(phase)
            return dynamo.make_boxed_func(gm.forward)

        return compile_graph

    backend = dynamo.aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        partition_fn=dynamo.min_cut_rematerialization_partition,
    )
    x = torch.randn(4, requires_grad=True)
    torch.compile(lambda t: (t.sin() * t).sum(), backend=backend)(x).backward()
    assert phases == ["forward", "backward"] and torch.allclose(x.grad, x.cos() * x + x.sin())
    torch._dynamo.reset()


def test_with_caches_disabled_a_compile_seen_before_misses_the_fx_graph_cache():
    from torch._dynamo.utils import counters

    def compile_once() -> None:
        torch._dynamo.reset()
        torch.compile(lambda t: t.sin() * 3, backend="inductor")(torch.randn(8))

    compile_once()  # the graph is in inductor's cache now
    hits = counters["inductor"]["fxgraph_cache_hit"]
    compile_once()
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1, "the cache was expected to serve a repeat compile"
    with dynamo.caches_disabled():
        compile_once()
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1
    torch._dynamo.reset()


def test_with_caches_disabled_inductor_still_reuses_the_kernels_it_built(tmp_path, monkeypatch):
    # the graph is compiled again (our passes run) but its C++ kernel, keyed by its source, is not
    from torch._inductor import codecache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    built = []
    original = codecache.CppCodeCache.load_async.__func__

    def counting(cls, source, *args, **kwargs):
        built.append(source)
        return original(cls, source, *args, **kwargs)

    def compile_once() -> None:
        torch._dynamo.reset()
        torch.compile(lambda t: t.cos() * 5, backend="inductor")(torch.randn(8))

    with dynamo.caches_disabled():
        compile_once()
        kernels = set(tmp_path.rglob("*.so"))
        monkeypatch.setattr(codecache.CppCodeCache, "load_async", classmethod(counting))
        compile_once()
    assert built, "the graph was compiled again, not served by the FX graph cache"
    assert kernels and set(tmp_path.rglob("*.so")) == kernels, "no kernel rebuilt in a new folder"
    torch._dynamo.reset()


def test_debug_dir_config_string_and_structured_artifacts():
    assert isinstance(dynamo.get_debug_dir(), str)
    assert "import torch" in dynamo.generate_config_string()
    dynamo.emit_artifact("torchdebug_seam_test", "text")  # a no-op without TORCH_TRACE, and no error


# -- inductor -------------------------------------------------------------------------------------


class _Recorder(inductor.CustomGraphPass):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.log.append(self.name)

    def uuid(self) -> str:
        return f"seam-test-{self.name}"


@pytest.mark.parametrize("first", [True, False], ids=["first", "last"])
@pytest.mark.parametrize("slot", inductor.CUSTOM_PASS_SLOTS)
def test_our_pass_runs_beside_the_users_pass_in_every_custom_pass_slot(slot, first):
    torch._dynamo.reset()
    log: list[str] = []

    def backend(gm, example_inputs):
        patches = inductor.custom_pass_patch(slot, _Recorder("ours", log), first=first)
        return inductor.compile_fx(gm, example_inputs, config_patches=patches)

    x = torch.randn(8, requires_grad=True)
    with inductor.config_patched({slot: _Recorder("user", log)}), dynamo.caches_disabled():
        torch.compile(lambda t: (t.relu() * 2).sum(), backend=backend)(x).backward()
    assert log[:2] == (["ours", "user"] if first else ["user", "ours"]), log
    torch._dynamo.reset()


def test_chained_passes_run_in_order_and_have_a_cache_id_only_when_every_member_has_one():
    log: list[str] = []
    chain = inductor.ChainedPasses([_Recorder("a", log), _Recorder("b", log)])
    chain(torch.fx.Graph())
    assert log == ["a", "b"]
    assert chain.uuid() == ("torchdebug.ChainedPasses", "seam-test-a", "seam-test-b")
    assert inductor.ChainedPasses([_Recorder("a", log), lambda graph: None]).uuid() is None


def test_custom_pass_patch_rejects_a_slot_inductor_does_not_have():
    with pytest.raises(ValueError, match=r"^slot: got 'post_grad_pass', expected one of 'joint_custom_pre_pass'"):
        inductor.custom_pass_patch("post_grad_pass", _Recorder("x", []), first=True)


def test_config_keys_exist_in_inductor():
    with inductor.config_patched({**inductor.mode_patches("max-autotune"), **inductor.debug_dir_patch("elsewhere")}):
        from torch._inductor import config

        assert config.triton.cudagraphs is True and config.max_autotune is True and config.trace.debug_dir == "elsewhere"
    assert inductor.mode_patches("reduce-overhead") == {inductor.CUDAGRAPHS: True}
    assert inductor.mode_patches("default") == inductor.mode_patches(None) == {}


def test_observer_reports_inductor_passes_and_is_restored_after():
    import torch.fx.passes.graph_transform_observer as observer_module

    torch._dynamo.reset()
    original = observer_module.GraphTransformObserver
    names: list[str] = []
    finished: list[str] = []
    with inductor.observe_inductor_passes(lambda gm, name: names.append(name) or name, finished.append):
        with inductor.observe_inductor_passes(lambda gm, name: None, lambda token: None):
            assert observer_module.GraphTransformObserver is not original
        with dynamo.caches_disabled():
            torch.compile(lambda t: (t.relu() * 2).sum(), backend="inductor")(torch.randn(8))
    assert observer_module.GraphTransformObserver is original
    assert names and finished == names, names
    torch._dynamo.reset()


def test_decompositions_are_inductors():
    assert torch.ops.aten.gelu.default in inductor.select_decomp_table()


def test_fsdp2_parameter_groups_have_what_the_collective_owners_read():
    from torchdebug._torch import fsdp

    groups = importlib.import_module(fsdp._MODULE)
    for name in ("FORWARD", "PRE_BACKWARD", "POST_BACKWARD"):
        assert hasattr(groups.TrainingState, name)
    for method in ("unshard", "post_backward"):
        assert inspect.unwrap(getattr(groups.FSDPParamGroup, method)).__code__.co_filename == groups.__file__
    init = inspect.getsource(groups.FSDPParamGroup.__init__)
    assert "self.modules" in init and "self._training_state" in init and "self.fsdp_params" in init
    # what unshard_buffers reads: each parameter's all-gather buffers, resized (not replaced) by an unshard
    params = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_param")
    assert "self.all_gather_outputs" in inspect.getsource(params.FSDPParam.__init__)
    assert "alloc_storage(tensor)" in inspect.getsource(params.FSDPParam.alloc_all_gather_outputs)
    assert fsdp.unshard_buffers(None) == []  # no group running


def test_async_collective_tensors_have_what_capture_reads_and_a_wait_without_work_returns():
    from torchdebug._torch import funcol

    module = importlib.import_module(funcol._MODULE)
    assert funcol.async_tensor_class() is module.AsyncCollectiveTensor
    plain = torch.arange(4.0)
    wrapped = module.AsyncCollectiveTensor(plain)
    assert funcol.inner_tensor(wrapped) is plain and funcol.unwaited(wrapped, module.AsyncCollectiveTensor) == [wrapped]
    funcol.waits_before(wrapped)  # no collective writes into it: returns at once
    assert wrapped.completed and funcol.unwaited(wrapped, module.AsyncCollectiveTensor) == []
    funcol.wait_tensor(plain)
    assert isinstance(funcol.pending_works(), int)


def test_a_compiled_graphs_frame_holds_its_module_and_the_module_the_user_compiled():
    from torchdebug._torch import frames

    seen = []

    @torch.compiler.disable  # a graph break inside the inner module's forward
    def look() -> None:
        frame = frames.running_frame(__file__, "forward")
        seen.append((frames.local_module(frame, "self"), frames.enclosing_module(frame), frames.outermost_compiled_module(frame)))

    class Inner(nn.Module):
        def forward(self, x):
            look()
            return x * 2

    inner = Inner()
    outer = nn.Sequential(nn.Identity(), inner)
    torch._dynamo.reset()
    torch.compile(outer, backend="eager")(torch.ones(2))
    assert seen == [(inner, inner, outer)]
    assert frames.running_frame(__file__, "no_such_function") is None


def test_ops_in_a_frame_dynamo_compiled_and_in_its_graphs_backward_are_told_as_compiled_code():
    """Its graph's ops (aot_eager runs them), an op called eagerly at a graph break inside the
    frame, and the backward graph's ops are compiled code; ops before and after the call, and the
    backward of an eager op, are not."""
    seen = []

    class Mode(dispatch.TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            node = autograd.current_autograd_node()
            seen.append((func.__name__, node is not None, frames.in_compiled_code(node)))
            return func(*args, **(kwargs or {}))

    @torch.compiler.disable
    def eager_part(x):
        return x.cos()

    def fn(x):
        y = x.sin()
        return eager_part(y) * y

    compiled = torch.compile(fn, backend="aot_eager")
    x = torch.randn(4, requires_grad=True)
    compiled(x).sum().backward()
    with Mode():
        out = compiled(x.exp())
        out.sum().backward()
    compiled_forward = {name for name, backward, told in seen if told and not backward}
    assert {"sin.default", "cos.default", "mul.Tensor"} <= compiled_forward
    assert ("exp.default", False, False) in seen and ("sum.default", False, False) in seen
    assert any(told for _, backward, told in seen if backward)  # the backward graph's
    assert ("mul.Tensor", True, False) in seen  # exp's backward, eager
    torch._dynamo.reset()


def test_a_graph_input_inductor_writes_in_place_moves_its_version():
    """What capture's rule for compiled code relies on: inductor's kernels write their own buffers
    unseen, but an input the compiled code writes moves its version once per call (AOT autograd
    counts it), so a read of it from before the call is not taken for one after."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.mul_(2).add_(1), backend="inductor")
    x = torch.ones(4)
    with torch.no_grad():
        compiled(x)
        before = x._version
        compiled(x)
    assert x._version == before + 1 and torch.equal(x, torch.full((4,), 7.0))
    torch._dynamo.reset()


def test_the_call_of_a_block_in_a_checkpoint_wrapper_compiled_is_traced_and_its_hooks_never_run():
    """torch's modules are not skipped by Dynamo: a ``checkpoint_wrapper`` compiled in place (or
    wrapped by ``torch.compile``) traces its block's call, so a global hook registered after it
    compiled sees the wrapper's call, never the block's (``compiles_a_wrapper`` tells such wrappers;
    a block of the user's class compiled in place runs its hooks as Python)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    torch._dynamo.reset()
    wrapped, plain = checkpoint_wrapper(MLPBlock()), MLPBlock()
    wrapped.compile(backend="aot_eager")
    plain.compile(backend="aot_eager")
    x = torch.randn(2, 8)
    wrapped(x), plain(x)
    seen = []
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: seen.append(type(module).__name__))
    try:
        wrapped(x)
        plain(x)
    finally:
        handle.remove()
    assert seen.count("CheckpointWrapper") == 1 and seen.count("MLPBlock") == 1  # the plain block's
    assert compiles_a_wrapper(wrapped) and compiles_a_wrapper(torch.compile(checkpoint_wrapper(MLPBlock())))
    assert not compiles_a_wrapper(plain) and not compiles_a_wrapper(torch.compile(MLPBlock()))
    assert not compiles_a_wrapper(checkpoint_wrapper(MLPBlock()))
    torch._dynamo.reset()


def test_module_hooks_counts_each_kind_of_hook_a_module_and_its_children_hold() -> None:
    """``nn.Module``'s private hook dicts, which ``module_hooks`` reads: one hook of each kind
    registered through the public API is counted in its place, on each torch release tested."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
    assert module_hooks(model) == ()
    model[1][0].register_forward_pre_hook(lambda module, args: None)
    model[1][0].register_forward_hook(lambda module, args, output: None)
    model[0].register_full_backward_pre_hook(lambda module, grad_output: None)
    model[0].register_full_backward_hook(lambda module, grad_input, grad_output: None)
    assert module_hooks(model) == (("0", 0, 0, 1, 1), ("1.0", 1, 1, 0, 0))
