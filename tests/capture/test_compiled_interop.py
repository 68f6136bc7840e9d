"""A compiled function called while eager capture is on stays compiled, is not recompiled, and
its module calls are recorded once, without torch's warning about global hooks."""

import warnings

import pytest
import torch
import torch._dynamo

import torchdebug
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


def test_compiled_module_stays_compiled_under_capture(tmp_path, tiny):
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
