"""Localise a torch.compile failure or accuracy loss to a stage, a node and a source line.

Typical use::

    report = torchdebug.diagnose(model, x, backend="inductor")
    print(report.summary())      # stage, error or lost accuracy, first bad node, source line
    report.repro_path            # repro.py with only that node, inputs in safetensors next to it

``docs/diagnose.md`` describes the method and the command line (``torchdebug diagnose``).
"""

from __future__ import annotations

from torchdebug.callable_package import make_callable
from torchdebug.diagnose.api import diagnose
from torchdebug.diagnose.report import DiagnoseReport

__all__ = ["DiagnoseReport", "diagnose"]

make_callable(__name__, diagnose)
