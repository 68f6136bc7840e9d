"""``DiagnoseConfig``: the validated options of one :func:`torchdebug.diagnose` run, declared once.

The same kind of object as every torchdebug config (:mod:`torchdebug.options`), so a bad option
fails before the first stage runs, with one line naming it. Its fields are also
:func:`torchdebug.diagnose`'s keyword options and ``torchdebug diagnose``'s flags (generated from
them), so this module imports nothing that loads torch (the command line's help imports it).
"""

from __future__ import annotations

from dataclasses import field

from torchdebug.config import COMPILE_MODES
from torchdebug.errors import ConfigError
from torchdebug.options import Flag, Options, boolean, configclass, number, number_text, one_of, option, optional, text

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

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

    backend: Any = field(
        default=None,
        metadata=option(
            "The torch.compile backend under test: a name (or, from Python, a callable); default: inductor "
            "(with compile_mode='reduce-overhead' when the inputs are on CUDA).",
            _backend,
            flag=Flag(metavar="NAME"),
        ),
    )
    train: bool = field(
        default=True,
        metadata=option(
            "Also run backward and check the gradients of parameters and floating inputs.",
            boolean,
        ),
    )
    compile_mode: str | None = field(
        default=None,
        metadata=option(
            "torch.compile mode for the last stage.",
            optional(one_of(*COMPILE_MODES)),
            flag=Flag(metavar="MODE"),
            enum=[*COMPILE_MODES, None],
        ),
    )
    accuracy_tolerance: float = field(
        default=DEFAULT_TOLERANCE,
        metadata=option(
            "The tol of PyTorch's accuracy check, torch._dynamo.utils.same: allclose at it, or an RMSE against "
            "fp64 within the eager result's plus a tenth of it (PyTorch's minifier uses 1e-3) (was tolerance).",
            number(0, inclusive=False),
            flag=Flag(parse=number_text, metavar="TOL", old=("--tolerance",)),
        ),
    )
    output_dir: str = field(
        default="torchdebug_diagnose",
        metadata=option(
            "Where repro.py and its inputs go (and, from the command line, report.html).",
            text("a folder path"),
            flag=Flag(short="-o", metavar="DIR"),
        ),
    )
    repro: bool = field(default=True, metadata=option("Write the repro.", boolean))
