"""A compiled function called while eager capture is on stays compiled and is not recompiled."""

import torch
import torch._dynamo

import torchdebug


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
