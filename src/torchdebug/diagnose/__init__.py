"""Localise a torch.compile failure or accuracy loss to a stage, a node and a source line.

Typical use::

    result = torchdebug.diagnose(model, x, backend="inductor")
    print(result.summary())      # stage, error or lost accuracy, first bad node, source line
    result.repro_path            # repro.py: the smallest graph around that node that fails, inputs next to it

``docs/diagnose.md`` describes the method and the command line (``torchdebug diagnose``). The
names below load lazily: ``torchdebug diagnose --help`` imports ``_config`` without torch.
"""

from __future__ import annotations

from torchdebug.callable_package import lazy_exports, make_callable

_EXPORTS = {
    "diagnose": "torchdebug.diagnose._api",
    "DiagnoseConfig": "torchdebug.diagnose._config",
    "DiagnoseResult": "torchdebug.diagnose._result",
    "load_entry": "torchdebug.diagnose._entry",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)

make_callable(__name__, "diagnose")
