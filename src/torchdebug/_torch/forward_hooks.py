"""A forward hook that runs after a module's own forward hooks, for global hooks that must see what
the module returned.

Global forward hooks run before a module's own, which may change the output (a user's hook, tensor
parallelism's redistribution of a layer's output, FSDP2's post-forward). :class:`LastForwardHooks`
places one hook, last, on each module with hooks of its own as its call starts; where the running
torch does not allow that (:func:`hooks_read_after_forward`), nothing is placed and the caller keeps
reading the output from its global hook. Why the monitor needs it: docs/monitor.md, "What is
watched" ("What a module returned").
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.compiler import is_compiling
from torch.utils.hooks import RemovableHandle

from torchdebug._torch.global_hooks import never_compiled_as_a_frame

AfterHooks = Callable[[nn.Module, tuple, dict[str, Any], Any], None]
"""``after(module, args, kwargs, output)``: ``module``'s call returned ``output``, its own forward hooks run."""


own_forward_hooks = operator.attrgetter("_forward_hooks")
"""``own_forward_hooks(module)``: ``module``'s own forward hooks (``register_forward_hook``'s), by
id, in the order they run; empty, so false, for most modules. An attribute getter, not a function:
it is asked at every module call."""


def hooks_read_after_forward() -> bool:
    """Whether a forward hook added to a module while its call runs, before its ``forward`` returns,
    runs in that call after the hooks added before it. ``Module._call_impl`` reads
    ``self._forward_hooks`` only once ``forward`` has returned (torch 2.11 through 2.14), so a hook
    added as the call starts (from a global forward pre-hook) runs in that very call; this checks it on
    the running torch. Runs a module call: :data:`HOOKS_READ_AFTER_FORWARD` holds the answer, taken on
    import."""
    order: list[str] = []

    class Probe(nn.Module):
        def forward(self) -> None:
            self.register_forward_hook(lambda *_: order.append("added during the call"))

    probe = Probe()
    probe.register_forward_hook(lambda *_: order.append("added before"))
    probe()
    return order == ["added before", "added during the call"]


HOOKS_READ_AFTER_FORWARD = hooks_read_after_forward()
"""Taken as this module is imported (before any monitor registers its global hooks, which would see
the probe's call)."""


class LastForwardHooks:
    """``after`` called as a module's call returns, after the module's own forward hooks, on the
    modules :meth:`place` was called for as their call started.

    ``Module._call_impl`` (torch 2.11 through 2.14) runs ``_global_forward_hooks`` and then
    ``self._forward_hooks``, each free to return a new output, so a global hook sees the output as
    ``forward`` returned it, not what the call returned once the module's own hooks changed it. One
    hook is placed on each module that has forward hooks of its own, last among them (moved there
    again should the user add one after it); modules without hooks of their own get none, so their
    calls cost one dict's truth test.

    The hook returns at once while Dynamo traces (``torch.compiler.is_compiling()``: no graph break,
    nothing inside the compiled graph). Module hooks are not guarded on by Dynamo
    (``torch._dynamo.config.skip_nnmodule_hook_guards``, true by default in torch 2.11 through 2.14), so
    adding or removing one compiles nothing again; in any case hooks are placed only on modules that
    run outside compiled code.
    """

    def __init__(self, after: AfterHooks) -> None:
        self._after = after
        self._handles: dict[int, tuple[weakref.ref[nn.Module], RemovableHandle]] = {}
        self.works = HOOKS_READ_AFTER_FORWARD
        """Whether hooks can be placed on this torch (:func:`hooks_read_after_forward`)."""

    def place(self, module: nn.Module) -> bool:
        """As a call of ``module`` starts: whether ``after`` will see it return, after the module's
        own forward hooks (placed or moved last among them now). ``False`` for a module without
        hooks of its own: its global forward hook sees what it returned."""
        hooks = own_forward_hooks(module)
        if not hooks or not self.works:
            return False
        entry = self._handles.get(id(module))
        if entry is not None:
            if entry[0]() is module and next(reversed(hooks)) == entry[1].id:
                return True
            entry[1].remove()
        handle = module.register_forward_hook(never_compiled_as_a_frame(self._hook), with_kwargs=True)
        self._handles[id(module)] = (weakref.ref(module), handle)
        return True

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        if not is_compiling():
            self._after(module, args, kwargs, output)

    def remove(self) -> None:
        """Take every placed hook out."""
        for _, handle in self._handles.values():
            handle.remove()
        self._handles.clear()


__all__ = ["HOOKS_READ_AFTER_FORWARD", "AfterHooks", "LastForwardHooks", "hooks_read_after_forward", "own_forward_hooks"]
