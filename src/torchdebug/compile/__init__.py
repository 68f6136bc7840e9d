"""torchdebug's torch.compile backend: one switch (``TORCH_COMPILE_DEBUG=1``) keeps every graph,
pass, log and reason of a compile, under PyTorch's own debug folder. Typical use::

    config = torchdebug.CompilerConfig()
    config.debug.graph_dump.type = "py"
    model = torch.compile(model, backend=torchdebug.get_backend(config))
    # TORCH_COMPILE_DEBUG=1 python train.py  ->  torch_compile_debug/run_*/torchdebug/

``backend="torchdebug"`` works too (default options). :mod:`torchdebug.compile.debug_dir` documents
the files; :mod:`torchdebug.compile.pipeline` the pass pipeline and how to add passes to it.
"""

from __future__ import annotations

from torchdebug.compile.backend import TorchDebugBackend, get_backend, torchdebug_backend
from torchdebug.compile.config import CompilerConfig
from torchdebug.compile.pipeline import GraphPass

__all__ = ["CompilerConfig", "GraphPass", "TorchDebugBackend", "get_backend", "torchdebug_backend"]
