"""Module-level records (level=module/mix) and module naming."""

import torch
from torch import nn

import torchdebug


def _records(tmp_path, model, body, **options):
    with torchdebug.dump(tmp_path, model=model, **options):
        body()
    return torchdebug.load(tmp_path).ranks[0].records()


def test_module_level_records_inputs_outputs_parameters_and_gradients(tmp_path, tiny):
    records = _records(tmp_path, tiny, lambda: tiny(torch.randn(2, 4, requires_grad=True)).sum().backward(), level="module")
    names = {r.name for r in records}
    assert "forward/fc1/module#0/input.0" in names
    assert "forward/fc1/module#0/output.0" in names
    assert "forward/fc1/module#0/parameter.weight" in names
    assert "backward/fc2/module#0/input.0" in names  # gradient of fc2's output
    assert "backward/fc1/module#0/output.0" in names  # gradient of fc1's input
    assert "backward/fc1/module#0/parameter_grad.weight" in names
    assert all(r.op == "module" for r in records)


def test_parameter_gradient_records_hold_the_accumulated_gradient(tmp_path, tiny):
    records = _records(tmp_path, tiny, lambda: tiny(torch.randn(2, 4)).sum().backward(), level="module")
    (grad,) = [r for r in records if r.name == "backward/fc2/module#0/parameter_grad.bias"]
    assert grad.stats["mean"] == tiny.fc2.bias.grad.mean().item()


def test_mix_level_records_both_modules_and_ops(tmp_path, tiny):
    records = _records(tmp_path, tiny, lambda: tiny(torch.randn(2, 4)), level="mix")
    ops = {r.op for r in records}
    assert "module" in ops and "aten.addmm.default" in ops


def test_without_a_model_the_first_module_called_is_the_root(tmp_path, tiny):
    with torchdebug.dump(tmp_path):
        tiny(torch.randn(2, 4))
        nn.MSELoss()(torch.ones(2), torch.zeros(2))
    modules = {r.module for r in torchdebug.load(tmp_path).ranks[0].records()}
    assert {"fc1", "fc2", "MSELoss"} <= modules


def test_shared_modules_keep_their_first_name(tmp_path):
    shared = nn.Linear(2, 2)
    model = nn.ModuleDict({"a": shared, "b": shared})
    with torchdebug.dump(tmp_path, model=model):
        model["b"](torch.ones(1, 2))
    assert {r.module for r in torchdebug.load(tmp_path).ranks[0].records() if r.op == "aten.addmm.default"} == {"a"}


def test_ops_of_a_modules_own_forward_hooks_are_the_modules(tmp_path):
    """A module's own forward hooks run after the global hook that sees it return (tensor
    parallelism redistributes a layer's output so): their ops are filed under the module, as a
    compiled graph files them; a module called inside a hook has its own name, and after the hooks
    the caller's ops are the caller's again."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.inner = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x).exp()

    model = Net()
    model.fc.register_forward_hook(lambda module, args, out: model.inner(out.sin()).cos())
    records = _records(tmp_path, model, lambda: model(torch.ones(1, 2)))
    modules = {r.op: r.module for r in records if r.io == "output"}
    assert modules["aten.addmm.default"] == "fc"
    assert modules["aten.sin.default"] == modules["aten.cos.default"] == "fc"  # the hook's
    assert modules["aten.relu.default"] == "inner"  # a module the hook called
    assert modules["aten.exp.default"] == "<root>"  # after fc's call returned
