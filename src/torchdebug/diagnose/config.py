"""``DiagnoseConfig``: the validated options of one :func:`torchdebug.diagnose` run.

The same kind of object as every torchdebug config (:mod:`torchdebug.options`), so a bad option
fails before the first stage runs, with one line naming it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from torchdebug.diagnose.accuracy import DEFAULT_TOLERANCE
from torchdebug.errors import ConfigError
from torchdebug.options import Options, boolean, configclass, number, one_of, option, optional, text

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes ``torch.compile`` takes."""


def _backend(key: str, value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value) and not callable(value):
        raise ConfigError(f"{key}: got {value!r}, expected None (inductor), a backend name or a callable backend")
    return value


@configclass
class DiagnoseConfig(Options):
    """Options of :func:`torchdebug.diagnose` (see its docstring for what each one does)."""

    backend: Any = field(
        default=None, metadata=option("The torch.compile backend under test: a name, a callable, or None for inductor.", _backend)
    )
    train: bool = field(default=True, metadata=option("Also run backward and check gradients.", boolean))
    mode: str | None = field(
        default=None, metadata=option("torch.compile mode for the last stage.", optional(one_of(*COMPILE_MODES)))
    )
    tolerance: float = field(
        default=DEFAULT_TOLERANCE,
        metadata=option("The tol of the RMSE-ratio accuracy rule (PyTorch's minifier uses 1e-3).", number(0, inclusive=False)),
    )
    output_dir: str = field(
        default="torchdebug_diagnose", metadata=option("Where repro.py and its inputs go.", text("a folder path"))
    )
    repro: bool = field(default=True, metadata=option("Write the repro.", boolean))
