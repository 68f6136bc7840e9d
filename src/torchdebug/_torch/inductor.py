"""Inductor's entry points, config keys and pass hooks, as the compile backend and diagnose use them.

- ``compile_fx(model, inputs, inner_compile=..., config_patches=...)``: inductor's entry point;
  ``inner_compile`` is the seam PyTorch's own minifier uses to see each AOT graph.
- ``compile_fx_inner``: the default ``inner_compile`` (post-grad passes, then code generation).
- ``CustomGraphPass``: inductor's custom-pass interface; its ``uuid()`` enters the FX graph cache
  key, so a cache can never serve a graph our passes did not see.
- :func:`custom_pass_patch`: our pass added to one of inductor's custom-pass slots beside the
  user's (the slot's type changed in torch 2.13, see :data:`~torchdebug._torch.VERSION_DIFFERENCES`).
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torchdebug._torch import at_least, require

require("torch.compile features (inductor internals)")

import torch  # noqa: E402
import torch.fx.passes.graph_transform_observer as _observer_module  # noqa: E402
from torch._inductor import config as _config  # noqa: E402
from torch._inductor.compile_fx import compile_fx, compile_fx_inner  # noqa: E402
from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402
from torch._inductor.decomposition import select_decomp_table  # noqa: E402

__all__ = [
    "CUDAGRAPHS",
    "CUSTOM_PASS_SLOTS",
    "CustomGraphPass",
    "compile_fx",
    "compile_fx_inner",
    "config_patched",
    "custom_pass_patch",
    "debug_dir_patch",
    "installed_passes",
    "mode_patches",
    "observe_inductor_passes",
    "select_decomp_table",
]

CUSTOM_PASS_SLOTS = ("joint_custom_pre_pass", "joint_custom_post_pass", "post_grad_custom_pre_pass", "post_grad_custom_post_pass")
"""Inductor config keys that hold user passes, in the order inductor runs them."""

_SLOTS_TAKE_LISTS = at_least("2.13")


class ChainedPasses(CustomGraphPass):
    """Several passes in one custom-pass slot, for torch < 2.13 where a slot holds one callable.

    Its ``uuid()`` combines the members' ones; with a member that has none (a plain function),
    it has none either, and inductor bypasses its graph cache as it would for that member alone.
    """

    def __init__(self, passes: Sequence[Callable[[torch.fx.Graph], Any]]) -> None:
        self.passes = tuple(passes)

    def __call__(self, graph: torch.fx.Graph) -> None:
        for graph_pass in self.passes:
            graph_pass(graph)

    def uuid(self) -> Any | None:
        ids = [p.uuid() if isinstance(p, CustomGraphPass) else None for p in self.passes]
        return None if any(i is None for i in ids) else ("torchdebug.ChainedPasses", *ids)


def _passes_in(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, ChainedPasses):
        return list(value.passes)
    return [value]


def custom_pass_patch(slot: str, ours: CustomGraphPass, *, first: bool) -> dict[str, Any]:
    """``{slot: value}`` for ``config_patches``: the passes already in ``slot`` with ``ours`` first or last.

    Torch 2.13 and newer take a list; 2.11 and 2.12 call the slot's value, so several passes go in
    one :class:`ChainedPasses`. Nothing the user installed is lost either way.
    """
    if slot not in CUSTOM_PASS_SLOTS:
        raise ValueError(f"slot: got {slot!r}, expected one of {', '.join(map(repr, CUSTOM_PASS_SLOTS))}")
    existing = _passes_in(getattr(_config, slot))
    passes = [ours, *existing] if first else [*existing, ours]
    if _SLOTS_TAKE_LISTS:
        return {slot: passes}
    return {slot: passes[0] if len(passes) == 1 else ChainedPasses(passes)}


CUDAGRAPHS = "triton.cudagraphs"
"""The inductor config key that records CUDA graphs."""


def mode_patches(mode: str | None) -> dict[str, Any]:
    """``config_patches`` that make inductor compile as ``torch.compile(mode=mode)`` does (torch 2.11
    through 2.14: ``torch._inductor.list_mode_options``, which ``torch.compile`` applies itself)."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode)) if mode else {}


def debug_dir_patch(folder: str) -> dict[str, Any]:
    """``config_patches`` that put inductor's own debug output (``TORCH_COMPILE_DEBUG``) under ``folder``."""
    return {"trace.debug_dir": folder}


def config_patched(patches: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """Inductor's config with ``patches`` inside the block, restored after."""
    return _config.patch(patches)


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
        _observer_module.GraphTransformObserver = _ObservedGraphTransformObserver  # type: ignore[misc]  # swapped, restored below
    try:
        yield
    finally:
        with _lock:
            _callbacks.pop()
            if not _callbacks:
                _observer_module.GraphTransformObserver = _GraphTransformObserver  # type: ignore[misc]  # restored


def installed_passes(slot: str) -> list[Any]:
    """The passes in inductor's custom-pass ``slot`` now, in the order it runs them (a torch 2.11/2.12
    :class:`ChainedPasses` unpacked)."""
    if slot not in CUSTOM_PASS_SLOTS:
        raise ValueError(f"slot: got {slot!r}, expected one of {', '.join(map(repr, CUSTOM_PASS_SLOTS))}")
    return _passes_in(getattr(_config, slot))
