"""A compiled function called while eager capture is on stays compiled, is not recompiled, and
its module calls are recorded once, without torch's warning about global hooks."""

import copy
import warnings

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import torchdebug
from tests.blocks import MLPBlock
from tests.global_hooks import global_module_hooks
from torchdebug.records import MODULE_OP


class _CountingBackend:
    """Counts compilations and runs of the compiled graph."""

    def __init__(self) -> None:
        self.compiles = 0
        self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.compiles += 1

        def run(*args):
            self.runs += 1
            return gm.forward(*args)

        return run


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_compiled_module_stays_compiled_under_capture(tmp_path, tiny, monkeypatch, native):
    """The module hooks capture sets are traced by Dynamo in the compiled module's call: on either
    path they add no op to a graph (the native path's module context is set outside compiled code)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    torch._dynamo.reset()
    backend = _CountingBackend()
    compiled = torch.compile(tiny, backend=backend)
    x = torch.randn(2, 4)
    expected = compiled(x)
    assert (backend.compiles, backend.runs) == (1, 1)
    with torchdebug.dump(tmp_path, model=tiny):
        got = compiled(x)
        got.sum().backward()
    assert backend.compiles == 1, "capture forced a recompilation"
    assert backend.runs == 2, "capture made the compiled function run eagerly"
    assert torch.equal(expected, got)
    torch._dynamo.reset()


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_capturing_more_blocks_compiled_in_place_than_the_recompile_limit_compiles_nothing_again(tmp_path, monkeypatch, native):
    """``block.compile()`` compiles the block's ``_call_impl``, a frame Dynamo skips, so Dynamo compiles
    the frames called there: capture's module hooks, run there, are plain Python
    (``never_compiled_as_a_frame``), the one the native path adds after a block's own hooks too. Ten
    blocks share one graph under capture as without it; compiled as frames, the hooks were compiled
    again for each block, and from the ninth Dynamo warned that it hit its recompile limit."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    torch._dynamo.reset()
    backend = _CountingBackend()
    model = torch.nn.Sequential(*(MLPBlock() for _ in range(10)))
    for block in model:
        block.register_forward_hook(lambda module, args, output: None)  # a hook of its own
        block.compile(backend=backend)
    x = torch.randn(2, 8)
    model(x).sum().backward()
    compiled = backend.compiles  # (the first block's input needs no gradient, the others' do)
    counters.clear()
    with torchdebug.Debugger(tmp_path, compiled_code="as_run") as debugger:
        for _ in range(2):
            debugger.start(model)
            model(x).sum().backward()
            debugger.step()
    assert backend.compiles == compiled and not counters["frames"]
    assert backend.runs == 30
    torch._dynamo.reset()


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_the_ops_a_compilation_runs_in_a_captured_step_are_not_recorded(tmp_path, monkeypatch, native):
    """Dynamo runs ops of its own while it compiles, with the dispatch modes taken off: AOT autograd
    copies the RNG state (``clone``) to restore it after tracing. Neither path records them, only the
    graph's ops (aot_eager runs them: no ``clone`` among the forward graph's; torch 2.11's backward
    graph has one)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    model = torch.nn.Sequential(MLPBlock())
    model[0].compile(backend="aot_eager")
    torch._dynamo.reset()
    with torchdebug.Debugger(tmp_path) as debugger:
        debugger.start(model)
        model(torch.randn(2, 8)).sum().backward()
        debugger.step()
    ops = {(record.phase, record.op) for record in torchdebug.load(tmp_path).ranks[0].records()}
    assert {("forward", "aten.addmm.default"), ("backward", "aten.threshold_backward.default")} <= ops
    assert ("forward", "aten.clone.default") not in ops
    torch._dynamo.reset()


def _dumped_statistics(folder, monkeypatch, native: str, model: torch.nn.Module, step) -> list:
    """The tensor records of one step of ``step`` dumped with statistics on one path, after a step
    that compiled it."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", native)
    step()
    with torchdebug.Debugger(folder, task="statistics", stack="none") as debugger:
        debugger.start(model)
        step()
        debugger.step()
    return [record for record in torchdebug.load(folder).ranks[0].records() if record.kind == "tensor"]


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_an_extern_kernels_input_that_inductor_wrote_in_place_has_the_statistics_of_what_it_holds(tmp_path, monkeypatch, native):
    """Inductor fuses the GELU after a linear layer into a kernel that overwrites the ``addmm``'s
    output in place (no aten op, no version moved), which the next ``addmm`` reads: its input holds
    the GELU's values, not those the first ``addmm`` wrote (which both paths recorded there before)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    compiled = torch.compile(model, backend="inductor")
    x = torch.randn(64, 16)

    def step() -> None:
        with torch.no_grad():
            compiled(x)

    records = _dumped_statistics(tmp_path, monkeypatch, native, model, step)
    first, second = (r for r in records if r.op == "aten.addmm.out" and r.io == "input" and r.arg == "1")
    written = next(r for r in records if r.op == "aten.addmm.out" and r.io == "output" and r.call == first.call)
    with torch.no_grad():
        hidden = model[0](x)
    assert first.stats["mean"] == pytest.approx(x.mean().item(), rel=1e-4)
    assert written.stats["mean"] == pytest.approx(hidden.mean().item(), rel=1e-4)
    assert second.stats["mean"] == pytest.approx(model[1](hidden).mean().item(), rel=1e-4)
    assert second.stats["norm"] == pytest.approx(model[1](hidden).norm().item(), rel=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize("native", ["1", "0"], ids=["native path", "dispatch mode"])
def test_a_saved_activation_the_backward_writes_in_place_has_the_statistics_of_what_it_holds(tmp_path, monkeypatch, native):
    """With the loss compiled in, AOT autograd lets inductor's backward write the loss's gradient
    into the memory of the logits it saved (a donated buffer: no aten op, no version moved): the
    ``mm`` that reads it for the last layer's input gradient holds the gradient's values, not the
    logits' (which both paths recorded there before)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))
    x, y = torch.randn(64, 16), torch.randint(0, 10, (64,))
    loss_of = torch.compile(lambda: torch.nn.functional.cross_entropy(model(x), y), backend="inductor")
    records = _dumped_statistics(tmp_path, monkeypatch, native, model, lambda: loss_of().backward())
    logits = model(x)
    logits.retain_grad()
    torch.nn.functional.cross_entropy(logits, y).backward()
    reads = [r for r in records if r.phase == "backward" and r.op == "aten.mm.out" and r.io == "input" and r.arg == "0"]
    gradients = [r for r in reads if sorted(r.shape) == [10, 64]]
    assert len(gradients) == 2  # the weight's gradient reads it transposed, the input's as it is
    for read in gradients:
        assert read.stats["norm"] == pytest.approx(logits.grad.norm().item(), rel=1e-4)
    torch._dynamo.reset()


def test_compiled_function_under_capture_is_not_recompiled_by_inductor(tmp_path):
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(lambda x: (x.sin() * 2).relu(), backend=counter)
    x = torch.randn(8)
    fn(x)
    with torchdebug.dump(tmp_path):
        y = fn(x)
        y.exp()
    assert counter.frame_count == 1
    records = torchdebug.load(tmp_path).ranks[0].records()
    assert "aten.exp.default" in {r.op for r in records}
    assert "aten.sin.default" not in {r.op for r in records}  # fused inside the compiled kernel
    torch._dynamo.reset()


def _module_calls(path) -> dict[str, set[int]]:
    """Module path -> call indices of its forward module-level records."""
    calls: dict[str, set[int]] = {}
    for record in torchdebug.load(path).ranks[0].records():
        if record.phase == "forward" and record.op == MODULE_OP:
            calls.setdefault(record.module, set()).add(record.call)
    return calls


@pytest.mark.parametrize("hand_over", ["compiled", "original", "none"])
def test_compiling_a_module_under_capture_warns_nothing_and_records_each_module_call_once(tmp_path, tiny, hand_over):
    torch._dynamo.reset()
    compiled = torch.compile(tiny, backend="eager")
    model = {"compiled": compiled, "original": tiny, "none": None}[hand_over]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torchdebug.dump(tmp_path, model=model, level="mix"):
            compiled(torch.randn(2, 4)).sum().backward()
        compiled(torch.randn(2, 4))  # no hooks left behind: still no warning
    assert not [w for w in caught if "global hooks" in str(w.message)]
    # one call each: the wrapper's call is not a second call of the model, nor named "_orig_mod"
    assert _module_calls(tmp_path) == {"<root>": {0}, "fc1": {0}, "fc2": {0}}
    torch._dynamo.reset()


def test_the_compiled_module_warning_comes_back_once_capture_stops(tmp_path, tiny):
    """The silenced warning is torch's own, and only while our hooks are registered."""
    torch._dynamo.reset()
    compiled = torch.compile(tiny, backend="eager")
    with torchdebug.dump(tmp_path):
        pass
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        with pytest.warns(UserWarning, match="global hooks"):
            compiled(torch.randn(2, 4))
    finally:
        handle.remove()
    torch._dynamo.reset()


def _compiled_step(model: torch.nn.Module, how: str):
    """A training step that runs ``model`` (a block holding two layers) compiled ``how``: the model
    whole or its block (aot_eager), or a compiled function calling it; and what counts the graphs
    compiled so far."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    compiles = lambda: counter.frame_count  # noqa: E731
    if how == "whole":
        run = torch.compile(model, backend=counter)
    elif how == "block":
        model[0].compile(backend=counter)
        run = model
    else:  # the graph run as a function, as inductor's code runs: no module call shows
        backend = _CountingBackend()
        run = torch.compile(lambda x: model(x), backend=backend)
        compiles = lambda: backend.compiles  # noqa: E731

    def step(x):
        model.zero_grad()
        run(x).sum().backward()

    return step, compiles


def _compiled_notices(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "torchdebug.debugger" and "compiled" in r.getMessage()]


@pytest.mark.parametrize("how", ["whole", "block", "function"])
def test_a_step_that_ran_the_model_compiled_is_told_once_or_captured_eagerly_with_compiled_code_eager(
    tmp_path, tiny, how, caplog
):
    """``compiled_code="as_run"`` (the default): the capture does not see inside compiled code, and
    says so once. ``"eager"``: the captured steps run it eagerly, so the dump is an eager step's,
    op for op and bit for bit, with module paths; nothing is compiled again, before or after."""
    torch._dynamo.reset()
    x = torch.randn(2, 4)
    model = torch.nn.Sequential(tiny)
    reference = copy.deepcopy(model)  # never compiled
    step, compiles = _compiled_step(model, how)
    step(x)
    compiled = compiles()
    with torchdebug.Debugger(tmp_path / "as_run", checksum=True) as debugger:
        for _ in range(2):
            debugger.start(model)
            step(x)
            debugger.step()
    notices = _compiled_notices(caplog)
    assert len(notices) == 1 and "step 0" in notices[0] and "compiled_code='eager'" in notices[0]
    assert ("compiled modules (0)" in notices[0]) == (how == "block")
    caplog.clear()
    with torchdebug.Debugger(tmp_path / "eager", checksum=True, compiled_code="eager") as debugger:
        debugger.start(model)
        step(x)
        debugger.stop()
    step(x)
    assert compiles() == compiled  # captured eagerly, then compiled code again as it was
    with torchdebug.Debugger(tmp_path / "reference", checksum=True) as debugger:
        debugger.start(reference)
        reference(x).sum().backward()
        debugger.stop()
    assert not _compiled_notices(caplog)
    result = torchdebug.compare(tmp_path / "eager", tmp_path / "reference")
    assert result.rows and all(row.matched and row.verdict == "pass" for row in result.rows)
    assert {"0.fc1", "0.fc2"} <= {row.module for row in result.rows}
    torch._dynamo.reset()


def test_an_eager_step_is_not_told_it_ran_compiled(tmp_path, tiny, caplog):
    with torchdebug.Debugger(tmp_path) as debugger:
        debugger.start(tiny)
        tiny(torch.randn(2, 4)).sum().backward()
        debugger.stop()
    assert not _compiled_notices(caplog)


@pytest.mark.parametrize("handed", [True, False])
def test_dumping_many_steps_of_code_compiled_through_the_module_hooks_never_reaches_the_recompile_limit(tmp_path, tiny, handed):
    """A compiled function calling a module whose ``forward`` is an instance attribute (Lightning's
    ``trainer.fit(torch.compile(model))``, accelerate's hooks) traces the module's call, global hooks
    included, and torch 2.11 and 2.14 guard on the hooks' registration ids. Capture keeps its hooks
    registered, idle between captured steps, from the first step that ran compiled code to the last
    step it dumps: nineteen dumped steps, ten in a row and nine apart, compile three graphs (no
    hooks, capturing, idle) and the function runs compiled at every step, never eagerly for having
    reached the recompile limit. Without the model handed to ``start()``, a step whose ops ran but
    no module call outside compiled code keeps them too; the tracker names the modules it meets
    inside the first captured step, which compiles one graph more."""
    torch._dynamo.reset()
    backend = _CountingBackend()
    tiny.forward = tiny.forward
    step = torch.compile(lambda x: tiny(x).sum(), backend=backend)
    x = torch.randn(2, 4)
    dumped = [*range(1, 11), *range(12, 30, 2)]
    model = tiny if handed else None
    with torchdebug.Debugger(tmp_path / "many", step=dumped) as debugger:
        for _ in range(32):
            debugger.start(model)
            step(x).backward()
            debugger.step()
        assert not global_module_hooks()  # taken out after the last dumped step
    assert backend.compiles <= (3 if handed else 4)
    assert backend.runs == 32
    assert {r.step for r in torchdebug.load(tmp_path / "many").ranks[0].records()} == set(dumped)
    with torchdebug.Debugger(tmp_path / "unreached", step=[1, 50]) as debugger:
        for _ in range(3):
            debugger.start(model)
            step(x).backward()
            debugger.step()
        assert global_module_hooks()  # kept, idle, for step 50
    assert not global_module_hooks()  # closing takes them out
    torch._dynamo.reset()


@pytest.mark.parametrize("level", ["module", "mix"])
def test_hooks_kept_between_dumped_steps_record_nothing_there(tmp_path, tiny, level):
    """The hooks kept registered between the dumped steps of compiled code are idle: with
    module-level records, which every reported module call writes, the dump holds steps 1 and 5
    only, and the modules' calls in between are not recorded. (Module-level records break the graph
    of a trace that inlines the hooks: on torch 2.11 and 2.14 the module's call then runs outside
    the compiled code, which guards on no hook, and the hooks go at each stop; on 2.13 they are
    kept.) Either way the second dumped step compiles nothing again."""
    torch._dynamo.reset()
    tiny.forward = tiny.forward  # a compiled function traces the module's call, its hooks included
    backend = _CountingBackend()
    inner = torch.compile(lambda x: tiny(x).sum(), backend=backend)
    outer = torch.nn.Linear(4, 4)  # an eager module beside it: its call reaches the hooks

    def step(x: torch.Tensor) -> torch.Tensor:
        return inner(outer(x))

    compiles = []
    with torchdebug.Debugger(tmp_path, level=level, step=[1, 5]) as debugger:
        for _ in range(7):
            debugger.start(tiny)
            step(torch.randn(2, 4)).backward()
            debugger.step()
            compiles.append(backend.compiles)
    assert compiles[5] == compiles[1]
    records = list(torchdebug.load(tmp_path).ranks[0].records())
    assert {r.step for r in records} == {1, 5}
    assert {r.module for r in records if r.op == MODULE_OP} >= {"Linear"}  # the eager module's call, named where it ran
    torch._dynamo.reset()


def test_a_close_whose_flush_fails_leaves_no_hook_registered(tmp_path, tiny, monkeypatch):
    """A step of compiled code keeps the hooks for the steps still to dump; a close in the middle of
    the dumped steps whose last flush raises (a full disk) takes them out all the same."""
    torch._dynamo.reset()
    tiny.forward = tiny.forward
    step = torch.compile(lambda x: tiny(x).sum(), backend="eager")
    debugger = torchdebug.Debugger(tmp_path, step=[0, 5, 9])
    debugger.start(tiny)
    step(torch.randn(2, 4)).backward()
    debugger.step()
    assert global_module_hooks()  # kept for steps 5 and 9
    debugger.start_at(5)
    debugger.start(tiny)
    step(torch.randn(2, 4)).backward()
    monkeypatch.setattr(debugger.session, "flush", _full_disk)
    with pytest.raises(OSError, match="No space"):
        debugger.close()
    assert not global_module_hooks()
    monkeypatch.undo()
    debugger.close()
    torch._dynamo.reset()


def _full_disk(*args, **kwargs) -> None:
    raise OSError(28, "No space left on device")
