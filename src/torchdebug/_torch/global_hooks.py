"""Global ``nn.Module`` forward hooks that live beside ``torch.compile(module)`` and module wrappers.

Global hooks see every module call, which names the ops of modules the user never handed us (a
loss module, say). ``torch.compile(module)`` returns an ``OptimizedModule`` wrapper that is itself
an ``nn.Module``: with global hooks present, every call of it warns that "hooks fire an extra time
for the OptimizedModule" (torch 2.11 through 2.14), and the hooks see the wrapper and then the
wrapped module. :class:`GlobalForwardHooks` registers the hooks so that wrapper calls never reach
them and silences that one warning while the hooks are registered (the warning describes the
extra call the hooks now skip).

Each thing torch does that these hooks must work around is one function here, named for it, with
the torch releases it holds on (:func:`ignore_compiled_wrapper_warning`, :func:`remove_global_hook`,
:func:`forward_raised`, :func:`in_call_of`, :func:`never_compiled_as_a_frame`); the guards Dynamo puts on the hooks are why
:meth:`GlobalForwardHooks.pause` exists. Module wrappers are :mod:`torchdebug._torch.nn`'s.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

from torch import nn
from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
from torch.compiler import is_compiling
from torch.nn.modules import module as _module_globals
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

from torchdebug._torch.nn import DATA_PARALLEL, compiles_a_wrapper, is_compiled_wrapper, is_module_wrapper, wrapped_module

_WRAPPER_WARNING = re.escape("Using `torch.compile(module)` when there are global hooks on modules")

_MODULE_FILE = _module_globals.__file__


def ignore_compiled_wrapper_warning() -> tuple:
    """Ignore torch's warning that "hooks fire an extra time for the OptimizedModule" (torch 2.11
    through 2.14 warn at every call of ``torch.compile(module)``'s wrapper while any global hook is
    registered; :class:`GlobalForwardHooks` skips that extra call). Returns the filter for
    :func:`stop_ignoring`."""
    ignored = ("ignore", re.compile(_WRAPPER_WARNING, re.I), UserWarning, None, 0)
    warnings.filters.insert(0, ignored)  # type: ignore[attr-defined]  # a list; typeshed says Sequence
    return ignored


def stop_ignoring(ignored: tuple) -> None:
    """Take out a filter :func:`ignore_compiled_wrapper_warning` put in. An "ignore" filter leaves
    nothing in warning registries, so this needs no invalidation; the filter may be gone already if
    the list was swapped (``warnings.catch_warnings``)."""
    try:
        warnings.filters.remove(ignored)  # type: ignore[attr-defined]  # as above
    except ValueError:
        pass


def remove_global_hook(handle: RemovableHandle) -> None:
    """Remove a global forward hook, with its id in ``_global_forward_hooks_with_kwargs``: torch 2.11
    through 2.14 leave it there after ``handle.remove()`` (the handle does not know that dict), which
    keeps ``_has_any_global_hook()`` true, and the wrapper's warning on, for the rest of the process."""
    handle.remove()
    _module_globals._global_forward_hooks_with_kwargs.pop(handle.id, None)


def forward_raised(kwargs_and_output: tuple) -> bool:
    """Whether an always-called global forward hook's arguments after ``(module, args)`` are those
    of a forward that raised: torch 2.11 through 2.14 then call it as ``hook(module, args, result)``,
    without the ``kwargs`` it was registered with (activation checkpointing's early stop raises
    inside a recomputed forward on purpose)."""
    return len(kwargs_and_output) != 2


_AS_PYTHON = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
"""A frame Dynamo runs as plain Python, with every frame it calls."""

Hook = Callable[..., Any]


def never_compiled_as_a_frame(hook: Hook) -> Hook:
    """``hook``, which Dynamo now runs as plain Python, with every call it makes, where it would
    compile it as a frame of its own; inlined in a frame Dynamo compiles, it is traced as before.

    ``module.compile()`` compiles the module's ``_call_impl``, a frame of ``torch.nn`` that Dynamo
    skips for a module of the user's class (torch 2.11 through 2.14; 2.14 traces an ``nn.Linear``'s),
    so Dynamo compiles each frame called from it instead: the module's forward, and its hooks, ours
    included, each a frame of its own, guarded on the module it was called with. Under capture every
    compiled block compiled our hooks once more, and from the ninth on Dynamo warned that it hit its
    recompile limit. The frame's exec strategy
    (``set_code_exec_strategy`` on the code object, as ``torch.compiler.disable(recursive=False)``
    sets it, here for the frames it calls too) skips it without the wrapper that would break the
    graph of a trace that inlines it."""
    set_code_exec_strategy(hook.__code__, _AS_PYTHON)
    return hook


def in_call_of(module: nn.Module, frame: FrameType | None) -> bool:
    """Whether torch's call of ``module`` (its ``_call_impl`` frame, or the ``inner`` function that
    runs the hooks) is ``frame`` or one of its callers: that call, hooks included, has not returned.
    Reads the locals of torch's module-call frames only.

    Global forward hooks run before a module's own: ``Module._call_impl`` (torch 2.11 through 2.14)
    runs ``_global_forward_hooks`` and then ``self._forward_hooks`` from one frame of
    ``torch/nn/modules/module.py`` (its ``inner`` function), so a module's own hooks (tensor
    parallelism's output redistribution, registered by ``parallelize_module``) run after the global
    hook saw the module return."""
    while frame is not None:
        if frame.f_code.co_filename == _MODULE_FILE and frame.f_locals.get("self") is module:
            return True
        frame = frame.f_back
    return False


class GlobalForwardHooks:
    """A forward pre-hook and an always-called forward hook (with kwargs) on every module call.

    ``exit`` sees each call that returned, ``raised`` (when given) each call whose forward raised;
    each callback is told last whether Dynamo traces the call (``torch.compiler.is_compiling()``,
    asked once a hook: the callbacks need not ask again).
    Calls of module wrappers are skipped: the wrapped module's own call follows, so each module
    call reaches the hooks once; but a wrapper compiled (:func:`~torchdebug._torch.nn.compiles_a_wrapper`:
    its wrapped module's call is traced, its hooks never run) stands for the wrapped module's call,
    which the hooks then see enter and return with the wrapper's arguments and output.
    ``remove()`` undoes everything, once.
    """

    def __init__(
        self,
        enter: Callable[[nn.Module, tuple, bool], None],
        exit: Callable[[nn.Module, tuple, dict[str, Any], Any, bool], None],
        raised: Callable[[nn.Module, bool], None] | None = None,
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
            compiling = is_compiling()  # asked once a hook (two Python calls each), before any state is read
            if outside_compiled and compiling:  # before the pause: compiled code never reads it
                return
            # (traced: compiling first, so that compiled code never reads what stands)
            if self._paused or (not compiling and self._standing and self.stands_in(module)):
                return
            if module._modules and is_module_wrapper(module):  # a leaf wraps nothing: no call
                stands = is_compiled_wrapper(module) if outside_compiled else not compiling and compiles_a_wrapper(module)
                if not stands:
                    if outside_compiled:
                        self._enclosing.append((module, next(iter(module._modules.values()))))
                    return
                self._standing.append((module, wrapped_module(module)))
                module = self._standing[-1][1]
            elif outside_compiled and isinstance(module, DATA_PARALLEL):
                self._enclosing.append((module, module.module))
            enter(module, args, compiling)

        def on_exit(module: nn.Module, args: tuple, *kwargs_and_output: Any) -> None:
            compiling = is_compiling()
            if outside_compiled and compiling:
                return
            if self._paused or (not compiling and self._standing and self.stands_in(module)):
                return
            if self._enclosing and module is self._enclosing[-1][0]:
                self._enclosing.pop()
            if module._modules and is_module_wrapper(module):
                if compiling or not (self._standing and self._standing[-1][0] is module):
                    return
                module = self._standing.pop()[1]
            if not forward_raised(kwargs_and_output):
                kwargs, output = kwargs_and_output  # one by one: a starred call builds a list and a tuple
                exit(module, args, kwargs, output, compiling)
            elif raised is not None:
                raised(module, compiling)

        self._filter = ignore_compiled_wrapper_warning()
        self._handles = [
            register_module_forward_pre_hook(never_compiled_as_a_frame(on_enter)),
            register_module_forward_hook(never_compiled_as_a_frame(on_exit), with_kwargs=True, always_call=True),
        ]

    def stands_in(self, module: nn.Module) -> bool:
        """Whether a compiled wrapper's running call stands for ``module``'s (with
        ``outside_compiled``): ``module`` itself runs inside the compiled code."""
        return bool(self._standing) and module is self._standing[-1][1]

    def called_as(self, module: nn.Module) -> nn.Module:
        """What the running call of ``module`` was made on (with ``outside_compiled``): the
        outermost of the wrappers whose calls made it, each holding the next (``DDP(torch.compile(
        checkpoint_wrapper(model)))``: DDP), else ``module`` itself; calling that again runs what
        ran (see :mod:`torchdebug._torch.nn`). Ask while the call runs."""
        called = self._standing[-1][0] if self._standing and self._standing[-1][1] is module else module
        for wrapper, held in reversed(self._enclosing):
            if held is not called:
                break
            called = wrapper
        return called

    def pause(self) -> None:
        """Stop reporting calls but stay registered, so that code Dynamo compiled through the hooks
        is not compiled again when they report again; ``resume()`` goes on. Pause between module
        calls, not inside one. (With ``outside_compiled`` the hooks return under Dynamo before they
        look at the pause, so compiled code does not depend on it.)

        Compiled code whose module calls Dynamo traced while global hooks were registered (a model
        compiled whole or per block, a compiled function calling it) is guarded on the ids they were
        registered under (torch 2.11 through 2.14); on torch 2.11 and 2.14 so is code compiled before
        they came, when it traced a module's ``_call_impl`` (a compiled function calling a module
        whose ``forward`` is an instance attribute, as Lightning's ``trainer.fit(torch.compile(model))``
        and accelerate's hooks leave it). Hooks registered anew for each step would compile that code
        again at each step, until Dynamo's recompile limit runs it eagerly for the rest of the process."""
        self._paused = True

    def resume(self) -> None:
        """Report calls again, from a clean slate: a wrapper's call that a ``BaseException`` (a
        ``KeyboardInterrupt``) left unfinished, which torch's always-called hook does not see, is
        forgotten, so it does not stand for its module's later calls."""
        self._paused = False
        self._standing.clear()
        self._enclosing.clear()

    def remove(self) -> None:
        """Unregister the hooks and stop ignoring the wrapper's warning; a second call does nothing."""
        for handle in self._handles:
            remove_global_hook(handle)
        if self._handles:
            stop_ignoring(self._filter)
        self._handles = []


__all__ = [
    "GlobalForwardHooks",
    "forward_raised",
    "ignore_compiled_wrapper_warning",
    "in_call_of",
    "never_compiled_as_a_frame",
    "remove_global_hook",
    "stop_ignoring",
]
