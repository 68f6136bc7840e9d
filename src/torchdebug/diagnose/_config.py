"""``DiagnoseConfig``: the validated options of one :func:`torchdebug.diagnose` run, declared once.

The same kind of object as every torchdebug config (:mod:`torchdebug.options`), so a bad option
fails before the first stage runs, with one line naming it. Its fields are also
:func:`torchdebug.diagnose`'s keyword options and ``torchdebug diagnose``'s flags (generated from
them), so this module imports nothing that loads torch (the command line's help imports it).
"""

from __future__ import annotations

from typing import Annotated, Any

from torchdebug.config import CompileMode
from torchdebug.errors import ConfigError
from torchdebug.options import Above, Check, Flag, Folder, Options, configclass, option

DEFAULT_TOLERANCE = 1e-3
"""The tolerance PyTorch's accuracy minifier uses (``torch._dynamo.config.repro_tolerance``)."""


def _backend(key: str, value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and value) and not callable(value):
        raise ConfigError(f"{key}: got {value!r}, expected None (inductor), a backend name or a callable backend")
    return value


@configclass
class DiagnoseConfig(Options):
    """Options of :func:`torchdebug.diagnose` and ``torchdebug diagnose``."""

    _ALIASES = {"tolerance": "accuracy_tolerance"}  # compare's tolerances are per dtype

    backend: Annotated[Any, Check(_backend, schema={"type": ["string", "null"]})] = option(
        "The torch.compile backend under test: a name (or, from Python, a callable); default: inductor "
        "(with compile_mode='reduce-overhead' when the inputs are on CUDA).",
        default=None,
        flag=Flag(metavar="NAME"),
    )
    train: bool = option("Also run backward and check the gradients of parameters and floating inputs.", default=True)
    compile_mode: CompileMode | None = option("torch.compile mode for the last stage.", default=None, flag=Flag(metavar="MODE"))
    accuracy_tolerance: Annotated[float, Above(0)] = option(
        "The tol of PyTorch's accuracy check, torch._dynamo.utils.same: allclose at it, or an RMSE against "
        "fp64 within the eager result's plus a tenth of it (PyTorch's minifier uses 1e-3) (was tolerance).",
        default=DEFAULT_TOLERANCE,
        flag=Flag(metavar="TOL", old=("--tolerance",)),
    )
    output_dir: Folder = option(
        "Where repro.py and its inputs go (and, from the command line, report.html).",
        default="torchdebug_diagnose",
        flag=Flag(short="-o", metavar="DIR"),
    )
    repro: bool = option("Write the repro.", default=True)
