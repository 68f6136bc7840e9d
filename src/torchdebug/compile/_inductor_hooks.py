"""Every torch._inductor (and torch.fx pass-observer) symbol the compile backend touches.

Private torch APIs live here and only here, behind a version check, so a torch upgrade that moves
one fails in this module and in ``tests/compile/test_torch_internals.py`` rather than deep in a
compile. Verified on torch 2.13.

- ``compile_fx(model, inputs, inner_compile=..., config_patches=...)``: inductor's entry point;
  ``inner_compile`` is the seam PyTorch's own minifier uses to see each AOT graph.
- ``compile_fx_inner``: the default ``inner_compile`` (post-grad passes, then code generation).
- ``CustomGraphPass``: inductor's custom-pass interface; its ``uuid()`` enters the FX graph cache
  key, so a cache can never serve a graph our passes did not see.
- ``select_decomp_table``: inductor's decompositions, for ``run_eagerly`` to trace the same graph.
- :func:`observe_inductor_passes`: per-pass callbacks around inductor's joint-graph and post-grad
  passes. PyTorch has no public hook for this: ``post_grad_passes`` and ``joint_graph_passes``
  construct ``torch.fx.passes.graph_transform_observer.GraphTransformObserver`` around each pass
  (looking the class up on its module at call time), and that observer only writes dot files when
  ``trace.log_url_for_graph_xform`` is set. We substitute a subclass on that module attribute for
  the duration of a compile and restore it afterwards.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx.passes.graph_transform_observer as _observer_module
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.decomposition import select_decomp_table
from torch.torch_version import TorchVersion

if TorchVersion(torch.__version__) < (2, 6):
    raise ImportError(
        f"torchdebug.compile needs torch >= 2.6 (inductor custom graph passes), found {torch.__version__}; "
        "upgrade with `pip install -U torch`"
    )

__all__ = [
    "CustomGraphPass",
    "compile_fx",
    "compile_fx_inner",
    "inductor_config",
    "observe_inductor_passes",
    "select_decomp_table",
]

_GraphTransformObserver = _observer_module.GraphTransformObserver

# (on_enter(gm, pass_name) -> token, on_exit(token)); one pair at a time per process
_callbacks: list[tuple[Callable[[torch.fx.GraphModule, str], Any], Callable[[Any], None]]] = []
_lock = threading.Lock()


class _ObservedGraphTransformObserver(_GraphTransformObserver):
    """PyTorch's observer plus our callbacks on entering and leaving each pass."""

    def __enter__(self) -> _ObservedGraphTransformObserver:
        result = super().__enter__()
        self._torchdebug_token = _callbacks[-1][0](self.gm, self.passname) if _callbacks else None
        return result

    def __exit__(self, *exc_info: Any) -> None:
        super().__exit__(*exc_info)
        token = getattr(self, "_torchdebug_token", None)
        if _callbacks and token is not None and exc_info[0] is None:
            _callbacks[-1][1](token)


@contextlib.contextmanager
def observe_inductor_passes(
    on_enter: Callable[[torch.fx.GraphModule, str], Any], on_exit: Callable[[Any], None]
) -> Iterator[None]:
    """Call ``on_enter(gm, pass_name)`` before and ``on_exit(token)`` after each inductor FX pass.

    ``on_enter`` returns a token (``None`` to ignore this pass). Re-entrant: the innermost
    callbacks win, and the original observer class is back once the outermost block exits.
    """
    with _lock:
        _callbacks.append((on_enter, on_exit))
        _observer_module.GraphTransformObserver = _ObservedGraphTransformObserver  # type: ignore[misc]
    try:
        yield
    finally:
        with _lock:
            _callbacks.pop()
            if not _callbacks:
                _observer_module.GraphTransformObserver = _GraphTransformObserver  # type: ignore[misc]
