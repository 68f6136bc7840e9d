"""Custom operators with Python kernels, and the dispatcher calls they skip.

From torch 2.14, an operator made by ``torch.library.custom_op`` dispatches through its Python object
("PyObject dispatch", ``OpOverload._pyobj_dispatcher``, private): the key computation is redone in
the Python C API and a Python kernel is called straight away, without the C++ dispatcher's call, so
no ``at::RecordFunction`` callback sees the op: the native observer would record the ops its kernel
runs in its place. A dispatch mode still sees it (a mode's Python key reaches it). While the native
path observes, :class:`DispatcherCalls` turns that fast path off for every such op (it calls the C++
dispatcher, as torch 2.11 and 2.13 always do) and back on at its end.

Read here: ``torch._library.custom_ops.OPDEFS`` (the custom ops made so far, by name),
``CustomOpDef._opoverload`` and, from torch 2.14, ``OpOverload._is_pyobj_dispatcher_enabled`` and
``_enable_pyobj_dispatch``.
"""

from __future__ import annotations

from typing import Any

from torchdebug._torch import at_least

__all__ = ["DispatcherCalls"]


class DispatcherCalls:
    """Custom ops dispatched by the C++ dispatcher while entered (a no-op before torch 2.14)."""

    def __init__(self) -> None:
        self._turned: list[Any] = []

    def enter(self) -> None:
        """Turn PyObject dispatch off for each custom op that has it on (made before this call)."""
        if not at_least("2.14"):
            return
        from torch._library.custom_ops import OPDEFS

        for definition in list(OPDEFS.values()):
            overload = definition._opoverload
            if overload._is_pyobj_dispatcher_enabled():
                overload._enable_pyobj_dispatch(False)
                self._turned.append(overload)

    def exit(self) -> None:
        """Turn it on again for the ops :meth:`enter` turned off."""
        for overload in self._turned:
            overload._enable_pyobj_dispatch(True)
        self._turned.clear()
