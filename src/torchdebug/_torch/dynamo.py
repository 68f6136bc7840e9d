"""Dynamo, AOT autograd and compile-cache internals the compile backend and diagnose read.

One function per thing read, each saying why it reads it there (graph-break and recompile reasons,
the debug folder, the structured trace, the caches that skip our passes, compiled modules' calls).
What the backend does with them: docs/compile.md; the seam's rules: docs/architecture.md, "The torch
seam". Unchanged from torch 2.11 through 2.14.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torchdebug._torch import require

require("torch.compile features (Dynamo internals)")

import torch  # noqa: E402
import torch._dynamo.config  # noqa: E402
import torch._functorch.config  # noqa: E402
import torch._inductor.config  # noqa: E402
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition  # noqa: E402
from torch import nn  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._dynamo.debug_utils import generate_config_string  # noqa: E402
from torch._dynamo.utils import get_debug_dir, get_metrics_context  # noqa: E402
from torch._guards import detect_fake_mode  # noqa: E402
from torch._logging._internal import trace_structured_artifact  # noqa: E402

# Re-exported as torch has them: get_debug_dir, PyTorch's run_<time>-pid_<pid> folder for
# TORCH_COMPILE_DEBUG (ours goes inside it); detect_fake_mode, the fake mode of a graph's example values,
# to give nodes our passes insert a meta["val"] as AOT autograd would have; generate_config_string, the
# non-default Dynamo/inductor/functorch config as Python, the text PyTorch's own minifier repros start
# with, so diagnose's repro reproduces a planted or tuned config.

__all__ = [
    "after_compiled_calls",
    "aot_autograd",
    "caches_disabled",
    "calls_with",
    "compile_id",
    "compiled_autograd_enabled",
    "detect_fake_mode",
    "emit_artifact",
    "generate_config_string",
    "get_debug_dir",
    "graph_break_reason",
    "make_boxed_func",
    "min_cut_rematerialization_partition",
    "recompile_reason",
    "user_frames",
]


@contextlib.contextmanager
def caches_disabled() -> Iterator[None]:
    """The caches that hand back a compiled graph without running the passes, off inside the block:
    inductor's FX graph cache and AOT autograd's, local and remote. Inductor's kernel cache stays on:
    it keys a compiled kernel by its source, so a statistics kernel built once is not built again
    (``force_disable_caches`` gives every compile a fresh kernel folder: every C++ kernel rebuilt).
    A cache hit would skip our passes and their dumps (pytorch/pytorch#152374)."""
    graphs = torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False)
    autograd = torch._functorch.config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False)
    with graphs, autograd:
        yield


def compile_id(gm: torch.fx.GraphModule) -> str | None:
    """Dynamo's ``frame/attempt`` id of this graph (``"0/1"`` is frame 0's first recompile)."""
    value = gm.meta.get("dynamo_compile_id")
    return None if value is None else str(value)


def user_frames(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    """The user stack where Dynamo ended this graph (a graph break or the frame's return)."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    return [
        {"file": frame.filename, "line": frame.lineno, "function": frame.name, "code": (frame.line or "").strip()}
        for frame in getattr(reason, "user_stack", None) or []
    ]


def graph_break_reason(gm: torch.fx.GraphModule) -> tuple[str, list[dict[str, Any]]] | None:
    """``(reason, user frames)`` when Dynamo ended this graph at a graph break, else ``None``.

    Dynamo sets ``gm.compile_subgraph_reason`` (a ``GraphCompileReason`` with the reason and the user
    stack) on every graph it hands a backend, and ``torch._dynamo.explain`` reads the same attribute: no
    logging handler or re-tracing needed, and it costs nothing."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    return str(reason.reason), user_frames(gm)


def recompile_reason() -> str | None:
    """Why Dynamo is recompiling the frame being compiled now (``None`` on a first compile).

    Dynamo computes the reasons before tracing a recompiled frame and keeps them in the compile's
    metrics context (``recompile_reason``), the value that lands in
    ``torch._dynamo.utils.get_compilation_metrics()`` after the compile; read during the backend call,
    it is written with the graph it caused."""
    context = get_metrics_context()
    if not context.in_progress():
        return None
    return context._metrics.get("recompile_reason")


def emit_artifact(name: str, text: str) -> None:
    """Log ``text`` as a structured-trace artifact named ``name`` (a no-op unless TORCH_TRACE is on),
    so tlparse shows our files beside PyTorch's."""
    trace_structured_artifact(name, "string", payload_fn=lambda: text)


def after_compiled_calls(module: nn.Module, after: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``after(output)`` after every call of a module whose ``compile()`` ran, outside its
    compiled code (Dynamo never traces it); returns what undoes it. Its ``_compiled_call_impl``,
    what ``Module._wrapped_call_impl`` calls in place of ``_call_impl`` and its hooks (global ones
    too), is wrapped: a compiled module's own hooks run inside its compiled code, so an observer of its
    output stands outside. (``torch.compile(module)``'s wrapper needs none of this: its own call is
    eager, global hooks see it and its call stands for its module's,
    :class:`torchdebug._torch.global_hooks.GlobalForwardHooks`; finding compiled modules needs no
    Dynamo, so :func:`torchdebug._torch.nn.compiled_modules` does it.)"""
    compiled = module._compiled_call_impl

    def call(*args: Any, **kwargs: Any) -> Any:
        output = compiled(*args, **kwargs)
        after(output)
        return output

    module._compiled_call_impl = call

    def undo() -> None:
        if module._compiled_call_impl is call:
            module._compiled_call_impl = compiled

    return undo


def compiled_autograd_enabled() -> bool:
    """Whether a backward run from compiled code is compiled too (``torch._dynamo.config.compiled_autograd``),
    which traces autograd hooks into its graph."""
    return bool(torch._dynamo.config.compiled_autograd)


def calls_with(compiled: Callable[..., Any], before: Callable[[tuple[Any, ...]], None]) -> Callable[..., Any]:
    """``compiled`` (what a backend returns to Dynamo) calling ``before(args)`` first at every run.
    Dynamo's bytecode calls it with the graph's inputs as positional arguments (parameters first among
    them when the graph reads any)."""

    def run(*args: Any) -> Any:
        before(args)
        return compiled(*args)

    return run
