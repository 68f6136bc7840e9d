"""torchdebug's torch.compile backend: one switch (``TORCH_COMPILE_DEBUG=1``) keeps every graph,
pass, log and reason of a compile, under PyTorch's own debug folder. Typical use::

    config = torchdebug.CompilerConfig()
    config.debug.graph_dump.type = "py"
    model = torch.compile(model, backend=torchdebug.get_backend(config))
    # TORCH_COMPILE_DEBUG=1 python train.py  ->  torch_compile_debug/run_*/torchdebug/

``backend="torchdebug"`` works too (default options). :mod:`torchdebug.compile._debug_dir` documents
the files; :mod:`torchdebug.compile._pipeline` the pass pipeline and how to add passes to it.
"""

from __future__ import annotations

from torchdebug.compile._backend import TorchDebugBackend, get_backend, torchdebug_backend
from torchdebug.compile._config import CompilerConfig
from torchdebug.compile._debug_report import find_torchdebug_folder, render_report
from torchdebug.compile._pipeline import GraphPass, default_passes, user_pass

__all__ = [
    "CompilerConfig",
    "GraphPass",
    "TorchDebugBackend",
    "default_passes",
    "find_torchdebug_folder",
    "get_backend",
    "render_report",
    "torchdebug_backend",
    "user_pass",
]
