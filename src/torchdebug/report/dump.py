"""The HTML page of an eager dump: per rank, the first NaN/Inf with its source line, and every slot
whose statistics count one (``task="overflow_check"`` dumps hold only those).

Rendered from plain data the caller gathered (``torchdebug report DUMP``: one dict per rank), so
this layer reads nothing above it; every name reaches the page escaped.
"""

from __future__ import annotations

from typing import Any

from torchdebug.report import render

__all__ = ["render_dump"]


def render_dump(*, path: str, ranks: list[dict[str, Any]]) -> str:
    """The complete HTML page (a string; the caller writes it).

    Each rank: ``rank``, ``task``, ``complete``, ``records`` (count), ``first`` (the first NaN/Inf
    described in one line, or ``None``) and ``overflows`` (rows with ``name``, ``phase``,
    ``module``, ``source``, ``dtype``, ``shape``, ``nan``, ``inf``).
    """
    return render("dump.html.j2", title=f"torchdebug dump {path}", path=path, ranks=ranks)
