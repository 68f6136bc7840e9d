"""Every private torch symbol the backend uses still exists: a torch upgrade fails here first."""

from __future__ import annotations

import importlib
import inspect

import pytest

WRAPPERS = ["torchdebug.compile._inductor_hooks", "torchdebug.compile._dynamo_hooks"]


@pytest.mark.parametrize("module_name", WRAPPERS)
def test_wrapper_module_exports_every_wrapped_symbol(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{module_name}.{name}"


def test_inductor_pass_observer_is_looked_up_on_its_module_at_call_time() -> None:
    import torch._inductor.fx_passes.joint_graph as joint_graph
    import torch._inductor.fx_passes.post_grad as post_grad

    for module in (post_grad, joint_graph):
        assert "torch.fx.passes.graph_transform_observer.GraphTransformObserver" in inspect.getsource(module)


def test_inductor_custom_pass_slots_exist() -> None:
    from torchdebug.compile._inductor_hooks import inductor_config

    for slot in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass", "joint_custom_pre_pass", "joint_custom_post_pass"):
        assert hasattr(inductor_config, slot), slot


def test_observer_class_is_restored_after_observing() -> None:
    import torch.fx.passes.graph_transform_observer as module

    from torchdebug.compile._inductor_hooks import observe_inductor_passes

    original = module.GraphTransformObserver
    with observe_inductor_passes(lambda gm, name: None, lambda token: None):
        with observe_inductor_passes(lambda gm, name: None, lambda token: None):
            assert module.GraphTransformObserver is not original
    assert module.GraphTransformObserver is original


def test_compile_caches_can_be_disabled_in_a_scope() -> None:
    import torch.compiler.config

    with torch.compiler.config.patch(force_disable_caches=True):
        assert torch.compiler.config.force_disable_caches
