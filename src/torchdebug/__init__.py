"""torchdebug: why a PyTorch model fails to compile and where its numbers go wrong.

Typical use::

    import torchdebug
    torchdebug.seed_all(1234)
    with torchdebug.dump("dump", task="statistics"):
        loss = train_step(model, batch)

This module only re-exports the public API, lazily: ``import torchdebug`` must stay cheap because
PyTorch may import it while ``import torch`` runs (``TORCH_LOGS="+torchdebug"``).
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports
from torchdebug.version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `torchdebug --help` starts here

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Debugger": "torchdebug.debugger",
    "DebuggerConfig": "torchdebug.config",
    "dump": "torchdebug.debugger",
    "seed_all": "torchdebug.seed",
    "load": "torchdebug.store",
    "Record": "torchdebug.records",
    "TorchDebugError": "torchdebug.errors",
    "ConfigError": "torchdebug.errors",
    "DumpError": "torchdebug.errors",
    "compare": "torchdebug.compare",
    "CompareResult": "torchdebug.compare",
    "CompareConfig": "torchdebug.compare",
    "CompilerConfig": "torchdebug.compile",
    "get_backend": "torchdebug.compile",
    "diagnose": "torchdebug.diagnose",
    "DiagnoseResult": "torchdebug.diagnose",
    "DiagnoseConfig": "torchdebug.diagnose",
    "Monitor": "torchdebug.monitor",
    "MonitorConfig": "torchdebug.monitor",
    "AnomalyError": "torchdebug.errors",
}
_SUBMODULES = {"scope"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])

__getattr__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchdebug.compare import CompareConfig, CompareResult, compare
    from torchdebug.compile import CompilerConfig, get_backend
    from torchdebug.config import DebuggerConfig
    from torchdebug.debugger import Debugger, dump
    from torchdebug.diagnose import DiagnoseConfig, DiagnoseResult, diagnose
    from torchdebug.errors import AnomalyError, ConfigError, DumpError, TorchDebugError
    from torchdebug.monitor import Monitor, MonitorConfig
    from torchdebug.records import Record
    from torchdebug.seed import seed_all
    from torchdebug.store import load
