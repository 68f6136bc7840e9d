"""Every private torch symbol diagnose uses that the compile package does not already wrap.

One module, one version check, one test (``tests/diagnose/test_torch_internals.py``) importing every
name in ``__all__``, so a torch upgrade that moves one fails here. Verified on torch 2.13.

- ``lookup_backend``: a backend name (``"aot_eager"``, ``"relu_accuracy_error_TESTING_ONLY"``) to
  its function, as ``torch.compile`` resolves it.
- ``explain``: Dynamo's graph-break summary (``ExplainOutput``: graphs, break reasons with stacks).
- ``get_compilation_metrics``: per-compile records; ``recompile_reason`` says why a frame recompiled.
- ``generate_config_string``: the non-default Dynamo/inductor/functorch config as Python, the text
  PyTorch's own minifier repros start with, so a repro reproduces a planted or tuned config.
- ``tree_leaves``: the tensors of a nested output (tuples, lists, dicts, dataclasses Dynamo knows).
- ``BackendCompilerFailed``: how Dynamo wraps a backend's exception; ``.inner_exception`` is the cause.
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.debug_utils import generate_config_string
from torch._dynamo.eval_frame import explain
from torch._dynamo.exc import BackendCompilerFailed
from torch._dynamo.utils import get_compilation_metrics
from torch.torch_version import TorchVersion
from torch.utils._pytree import tree_leaves

if TorchVersion(torch.__version__) < (2, 6):
    raise ImportError(
        f"torchdebug.diagnose needs torch >= 2.6, found {torch.__version__}; upgrade with `pip install -U torch`"
    )

__all__ = ["BackendCompilerFailed", "explain", "generate_config_string", "get_compilation_metrics", "lookup_backend", "tree_leaves"]
