"""Module wrappers: modules that only stand for their one child, and compiled modules.

Module wrappers (``checkpoint_wrapper``'s ``CheckpointWrapper``, FSDP1's
``FullyShardedDataParallel``, ``torch.compile``'s ``OptimizedModule``) hold the module they stand
for as their only child, under the attribute names in :data:`WRAPPER_ATTRIBUTES`. Global forward
hooks skip their calls (:mod:`~torchdebug._torch.global_hooks`) and :func:`strip_wrappers` takes
those names out of module and parameter paths, as ``torch.distributed.fsdp``'s ``clean_tensor_name`` does.
Hooks that stay outside compiled code are the exception: the wrapped module's call runs inside
``OptimizedModule``'s compiled code, where they return at once, so the wrapper's call is reported
as the wrapped module's.

Data-parallel wrappers (``DistributedDataParallel``, ``DataParallel``) hold their module as
``module``, a name too common to skip, so their calls reach the hooks as calls of modules of their
own. They, and the module wrappers, pass their inputs through to their module's call; what their
forward adds around it (DDP's preparation of the backward's gradient all-reduce, FSDP1's unshard of
the parameters, a checkpoint) is what a call made again must also run, so
:meth:`~torchdebug._torch.global_hooks.GlobalForwardHooks.called_as` names the outermost of them as
what a module's call was made on.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

WRAPPER_ATTRIBUTES = frozenset({"_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod"})
"""Child names under which a module wrapper holds the module it stands for (torch 2.11 through 2.14)."""

DATA_PARALLEL = (DistributedDataParallel, DataParallel)
"""Wrappers that hold their module as ``module``: calls of modules of their own."""


def is_module_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` only wraps its one child (see the module docstring)."""
    children = module._modules
    return len(children) == 1 and next(iter(children)) in WRAPPER_ATTRIBUTES


def strip_wrappers(path: str) -> str:
    """``path`` without the wrapper names in it: ``h.0._checkpoint_wrapped_module.attn`` is ``h.0.attn``."""
    if "._" not in path and not path.startswith("_"):  # the common case, no split
        return path
    return ".".join(part for part in path.split(".") if part not in WRAPPER_ATTRIBUTES)


def wrapped_module(module: nn.Module) -> nn.Module:
    """The module that ``module`` stands for: itself unless it is a wrapper, else its child's, in turn."""
    while is_module_wrapper(module):
        module = next(iter(module._modules.values()))
    return module


def is_compiled_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` is the ``OptimizedModule`` that ``torch.compile(module)`` returned."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # no wrapper exists before Dynamo is loaded
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)


_COMPILED_CALL = "_compiled_call_impl"
"""Where ``module.compile()`` keeps the module's compiled call (torch 2.11 through 2.14)."""


def compiled_modules(root: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(path, module)`` for each module of ``root`` whose calls run compiled code, outer ones
    first: ``torch.compile(module)``'s wrapper and modules whose ``compile()`` ran (it stores the
    compiled call in ``module._compiled_call_impl``). Paths leave the wrappers out (``layers.0``,
    never ``layers.0._orig_mod``); ``root`` itself is ``""``. Loads no part of Dynamo, and walks no
    module before it is loaded (nothing can have compiled: a capture asks at every step's stop)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # torch.compile and Module.compile load Dynamo first
    if eval_frame is None:
        return
    for path, module in named_module_list(root):  # (the instance's dict: a getattr goes through Module's __getattr__ hook)
        if isinstance(module, eval_frame.OptimizedModule) or module.__dict__.get(_COMPILED_CALL) is not None:
            yield strip_wrappers(path), module


def named_module_list(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(root.named_modules())``: each module once, parents before children, children in their
    order, with their paths; read from the modules' ``_modules`` (torch 2.11 through 2.14) without
    ``named_modules``' generator a level, which passes each module up through every level above it:
    a capture walks the model at each step's start and stop (the tiny GPT's 46 modules: 50k
    instructions fewer a walk, callgrind)."""
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    pending = [("", root)]
    while pending:
        path, module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append((path, module))
        if children := module._modules:
            prefix = f"{path}." if path else ""
            pending += [(prefix + name, child) for name, child in reversed(children.items()) if child is not None]
    return found


def compiles_a_wrapper(module: nn.Module) -> bool:
    """Whether ``module``'s call runs a module wrapper compiled (``checkpoint_wrapper(block).compile()``,
    or ``torch.compile`` of such a wrapper): Dynamo traces the wrapped module's call inside the
    wrapper's compiled ``forward`` (torch's modules are not skipped), so its hooks never run."""
    if is_compiled_wrapper(module):
        return is_module_wrapper(module._orig_mod)  # type: ignore[arg-type]  # a Module, not a Tensor
    return is_module_wrapper(module) and getattr(module, _COMPILED_CALL, None) is not None


def parameters_and_hooked(root: nn.Module) -> tuple[list[nn.Parameter], list[nn.Module]]:
    """``root.parameters()`` (each once, in its order) and the modules of ``root`` with forward
    hooks of their own, in one walk of its modules: a capture asks at each step's start, and
    ``parameters()`` walks them again through generators."""
    parameters: list[nn.Parameter] = []
    seen: set[int] = set()
    hooked = []
    for _, module in named_module_list(root):
        for parameter in module._parameters.values():  # (torch 2.11 through 2.14)
            if parameter is not None and id(parameter) not in seen:
                seen.add(id(parameter))
                parameters.append(parameter)
        if module._forward_hooks:
            hooked.append(module)
    return parameters, hooked


def unwrap_compiled(module: nn.Module) -> nn.Module:
    """The module that ``torch.compile`` wrapped, or ``module`` itself."""
    return module._orig_mod if is_compiled_wrapper(module) else module  # type: ignore[return-value]  # a Module, not a Tensor


__all__ = [
    "DATA_PARALLEL",
    "WRAPPER_ATTRIBUTES",
    "compiled_modules",
    "compiles_a_wrapper",
    "is_compiled_wrapper",
    "is_module_wrapper",
    "named_module_list",
    "parameters_and_hooked",
    "strip_wrappers",
    "unwrap_compiled",
    "wrapped_module",
]


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
"""The ``nn.Module`` attributes holding a module's own hooks (torch 2.11 through 2.14)."""


def module_hooks(module: nn.Module) -> tuple[tuple[str, int, int, int, int], ...]:
    """How many hooks of each kind (forward pre, forward, backward pre, backward) ``module`` and each
    module under it holds, for those holding any, by path: what Dynamo does not guard on
    (``torch._dynamo.config.skip_nnmodule_hook_guards``), so instances that differ in it run one graph."""
    found = []
    for path, child in module.named_modules():
        counts = tuple(len(getattr(child, name, None) or ()) for name in _HOOK_DICTS)
        if any(counts):
            found.append((strip_wrappers(path), *counts))
    return tuple(found)
