"""Compare two dumps: match records, compute error metrics, judge and attribute, find the first divergence.

::

    result = torchdebug.compare("dump_bf16", "dump_fp32")   # A against the reference B
    print(result.summary())
    result.first_divergence          # earliest op whose error its inputs do not explain
    result.to_html("report.html")    # also to_csv / to_json

Modules: ``matching`` (pairing records), ``metrics`` (float64 errors), ``tolerances`` (per dtype),
``verdicts`` (pass/warning/error, blamed/inherited), ``engine`` (the run), ``result``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from torchdebug.compare.engine import compare, open_dump
from torchdebug.compare.matching import NameMapping, load_mapping
from torchdebug.compare.result import CompareResult
from torchdebug.compare.rows import Row
from torchdebug.compare.tolerances import DEFAULT_TOLERANCES, Tolerance

__all__ = ["compare", "open_dump", "CompareResult", "Row", "NameMapping", "load_mapping", "Tolerance", "DEFAULT_TOLERANCES"]


class _CallableModule(types.ModuleType):
    """``torchdebug.compare`` names both this package and the function: once a submodule is imported,
    Python binds the attribute to the package, so the package forwards calls to :func:`compare`."""

    def __call__(self, *args: Any, **kwargs: Any) -> CompareResult:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
