"""Global ``nn.Module`` forward hooks that live beside ``torch.compile(module)``.

Global hooks see every module call, which names the ops of modules the user never handed us (a
loss module, say). ``torch.compile(module)`` returns an ``OptimizedModule`` wrapper that is itself
an ``nn.Module``: with global hooks present, every call of it warns that "hooks fire an extra time
for the OptimizedModule" (torch 2.11 through 2.14), and the hooks see the wrapper and then the
wrapped module. :func:`global_forward_hooks` registers the hooks so that wrapper calls never reach
them and silences that one warning while the hooks are registered (the warning describes the
extra call the hooks now skip).

A forward hook registered ``with_kwargs=True`` leaves its id in
``torch.nn.modules.module._global_forward_hooks_with_kwargs`` after ``handle.remove()`` (torch 2.11
through 2.14: the handle does not know that dict), which keeps ``_has_any_global_hook()`` true and
that warning on for the rest of the process; :meth:`GlobalForwardHooks.remove` takes it out too.

When a forward raises (activation checkpointing's early stop raises inside a recomputed forward on
purpose), torch 2.11 through 2.14 call an always-called global hook without its ``kwargs``
argument, ``hook(module, args, result)``: a hook declared with kwargs would fail and torch would
warn. :class:`GlobalForwardHooks` takes that call and reports it to its ``raised`` callback.

Global forward hooks run before a module's own: ``Module._call_impl`` (torch 2.11 through 2.14) runs
``_global_forward_hooks`` and then ``self._forward_hooks`` from one frame of
``torch/nn/modules/module.py`` (its ``inner`` function), so a module's own hooks (tensor
parallelism's output redistribution, registered by ``parallelize_module``) run after the global
hook saw the module return. :func:`in_call_of` tells whether that call still runs.

Module wrappers (``checkpoint_wrapper``'s ``CheckpointWrapper``, FSDP1's
``FullyShardedDataParallel``, ``torch.compile``'s ``OptimizedModule``) hold the module they stand
for as their only child, under the attribute names in :data:`WRAPPER_ATTRIBUTES`. The hooks skip
their calls (the wrapped module's own call follows) and :func:`strip_wrappers` takes those names
out of module and parameter paths, as ``torch.distributed.fsdp``'s ``clean_tensor_name`` does.
Hooks that stay outside compiled code are the exception: the wrapped module's call runs inside
``OptimizedModule``'s compiled code, where they return at once, so the wrapper's call is reported
as the wrapped module's.

Compiled code whose module calls Dynamo traced while global hooks were registered (a model compiled
whole or per block, a compiled function calling it) is guarded on the ids they were registered
under (torch 2.11 through 2.14); on torch 2.11 and 2.14 so is code compiled before they came, when
it traced a module's ``_call_impl`` (a compiled function calling a module whose ``forward`` is an
instance attribute, as Lightning's ``trainer.fit(torch.compile(model))`` and accelerate's hooks
leave it). Hooks registered anew for each step would compile that code again at each step, until
Dynamo's recompile limit runs it eagerly for the rest of the process;
:meth:`GlobalForwardHooks.pause` keeps them registered, idle, between steps instead.

Data-parallel wrappers (``DistributedDataParallel``, ``DataParallel``) hold their module as
``module``, a name too common to skip, so their calls reach the hooks as calls of modules of their
own. They, and the module wrappers, pass their inputs through to their module's call; what their
forward adds around it (DDP's preparation of the backward's gradient all-reduce, FSDP1's unshard of
the parameters, a checkpoint) is what a call made again must also run, so
:meth:`GlobalForwardHooks.called_as` names the outermost of them as what a module's call was made on.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from torch import nn
from torch.compiler import is_compiling
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.parallel import DataParallel, DistributedDataParallel

_WRAPPER_WARNING = re.escape("Using `torch.compile(module)` when there are global hooks on modules")


WRAPPER_ATTRIBUTES = frozenset({"_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod"})
"""Child names under which a module wrapper holds the module it stands for (torch 2.11 through 2.14)."""


_MODULE_FILE = _module_globals.__file__


def in_call_of(module: nn.Module, frame: FrameType | None) -> bool:
    """Whether torch's call of ``module`` (its ``_call_impl`` frame, or the ``inner`` function that
    runs the hooks) is ``frame`` or one of its callers: that call, hooks included, has not returned.
    Reads the locals of torch's module-call frames only."""
    while frame is not None:
        if frame.f_code.co_filename == _MODULE_FILE and frame.f_locals.get("self") is module:
            return True
        frame = frame.f_back
    return False


def is_module_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` only wraps its one child (see the module docstring)."""
    children = module._modules
    return len(children) == 1 and next(iter(children)) in WRAPPER_ATTRIBUTES


def strip_wrappers(path: str) -> str:
    """``path`` without the wrapper names in it: ``h.0._checkpoint_wrapped_module.attn`` is ``h.0.attn``."""
    if "._" not in path and not path.startswith("_"):  # the common case, no split
        return path
    return ".".join(part for part in path.split(".") if part not in WRAPPER_ATTRIBUTES)


def _wrapped(module: nn.Module) -> nn.Module:
    """The module that ``module`` stands for: itself unless it is a wrapper, else its child's, in turn."""
    while is_module_wrapper(module):
        module = next(iter(module._modules.values()))
    return module


def is_compiled_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` is the ``OptimizedModule`` that ``torch.compile(module)`` returned."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # no wrapper exists before Dynamo is loaded
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)


def compiled_modules(root: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``(path, module)`` for each module of ``root`` whose calls run compiled code, outer ones
    first: ``torch.compile(module)``'s wrapper and modules whose ``compile()`` ran (it stores the
    compiled call in ``module._compiled_call_impl``). Paths leave the wrappers out (``layers.0``,
    never ``layers.0._orig_mod``); ``root`` itself is ``""``. Loads no part of Dynamo."""
    for path, module in root.named_modules():
        if is_compiled_wrapper(module) or getattr(module, "_compiled_call_impl", None) is not None:
            yield strip_wrappers(path), module


def unwrap_compiled(module: nn.Module) -> nn.Module:
    """The module that ``torch.compile`` wrapped, or ``module`` itself."""
    return module._orig_mod if is_compiled_wrapper(module) else module  # type: ignore[return-value]


class GlobalForwardHooks:
    """A forward pre-hook and an always-called forward hook (with kwargs) on every module call.

    ``exit`` sees each call that returned, ``raised`` (when given) each call whose forward raised.
    Calls of module wrappers are skipped: the wrapped module's own call follows, so each module
    call reaches the hooks once. ``remove()`` undoes everything, once.
    """

    def __init__(
        self,
        enter: Callable[[nn.Module, tuple], None],
        exit: Callable[[nn.Module, tuple, dict[str, Any], Any], None],
        raised: Callable[[nn.Module], None] | None = None,
        *,
        outside_compiled: bool = False,
    ) -> None:
        """``outside_compiled``: skip module calls that Dynamo traces (the hooks return at once under
        ``torch.compiler.is_compiling()``, so compiled code neither breaks its graph on them nor runs
        them). A call of ``torch.compile(module)``'s wrapper then stands for its module's call, which
        runs inside the compiled code: the hooks see ``module`` enter and return with the wrapper's
        arguments and output (and, should the module's call run eagerly all the same, as under
        ``torch.compiler.set_stance("force_eager")``, not that call a second time)."""
        self._standing: list[tuple[nn.Module, nn.Module]] = []
        """``(wrapper, module)`` for each compiled wrapper whose call is running, innermost last."""
        self._enclosing: list[tuple[nn.Module, nn.Module]] = []
        """``(wrapper, module)`` for each other wrapper whose call is running (with
        ``outside_compiled``: a module wrapper's whose call the hooks skip, a data-parallel one's),
        innermost last."""

        self._paused = False

        def on_enter(module: nn.Module, args: tuple) -> None:
            if outside_compiled and is_compiling():  # before the pause: compiled code never reads it
                return
            if self._paused or (outside_compiled and self.stands_in(module)):
                return
            if is_module_wrapper(module):
                if not (outside_compiled and is_compiled_wrapper(module)):
                    if outside_compiled:
                        self._enclosing.append((module, next(iter(module._modules.values()))))
                    return
                self._standing.append((module, _wrapped(module)))
                module = self._standing[-1][1]
            elif outside_compiled and isinstance(module, _DATA_PARALLEL):
                self._enclosing.append((module, module.module))
            enter(module, args)

        def on_exit(module: nn.Module, args: tuple, *kwargs_and_output: Any) -> None:
            if outside_compiled and is_compiling():
                return
            if self._paused or (outside_compiled and self.stands_in(module)):
                return
            if self._enclosing and module is self._enclosing[-1][0]:
                self._enclosing.pop()
            if is_module_wrapper(module):
                if not (outside_compiled and is_compiled_wrapper(module)):
                    return
                module = self._standing.pop()[1]
            if len(kwargs_and_output) == 2:
                exit(module, args, *kwargs_and_output)
            elif raised is not None:  # torch's call after a forward raised: (module, args, None)
                raised(module)

        self._filter = ("ignore", re.compile(_WRAPPER_WARNING, re.I), UserWarning, None, 0)
        warnings.filters.insert(0, self._filter)  # type: ignore[attr-defined]
        self._handles = [
            register_module_forward_pre_hook(on_enter),
            register_module_forward_hook(on_exit, with_kwargs=True, always_call=True),
        ]

    def stands_in(self, module: nn.Module) -> bool:
        """Whether a compiled wrapper's running call stands for ``module``'s (with
        ``outside_compiled``): ``module`` itself runs inside the compiled code."""
        return bool(self._standing) and module is self._standing[-1][1]

    def called_as(self, module: nn.Module) -> nn.Module:
        """What the running call of ``module`` was made on (with ``outside_compiled``): the
        outermost of the wrappers whose calls made it, each holding the next (``DDP(torch.compile(
        checkpoint_wrapper(model)))``: DDP), else ``module`` itself; calling that again runs what
        ran (see the module docstring). Ask while the call runs."""
        called = self._standing[-1][0] if self._standing and self._standing[-1][1] is module else module
        for wrapper, held in reversed(self._enclosing):
            if held is not called:
                break
            called = wrapper
        return called

    def pause(self) -> None:
        """Stop reporting calls but stay registered, so that code Dynamo compiled through the hooks
        is not compiled again when they report again (see the module docstring); ``resume()`` goes
        on. Pause between module calls, not inside one. (With ``outside_compiled`` the hooks return
        under Dynamo before they look at the pause, so compiled code does not depend on it.)"""
        self._paused = True

    def resume(self) -> None:
        """Report calls again, from a clean slate: a wrapper's call that a ``BaseException`` (a
        ``KeyboardInterrupt``) left unfinished, which torch's always-called hook does not see, is
        forgotten, so it does not stand for its module's later calls."""
        self._paused = False
        self._standing.clear()
        self._enclosing.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
            _module_globals._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles = []
        # An "ignore" filter leaves nothing in warning registries, so taking it out needs no
        # invalidation; it may be gone already if the list was swapped (warnings.catch_warnings).
        try:
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]
        except ValueError:
            pass


_DATA_PARALLEL = (DistributedDataParallel, DataParallel)


__all__ = [
    "WRAPPER_ATTRIBUTES",
    "GlobalForwardHooks",
    "compiled_modules",
    "in_call_of",
    "is_compiled_wrapper",
    "is_module_wrapper",
    "strip_wrappers",
    "unwrap_compiled",
]
