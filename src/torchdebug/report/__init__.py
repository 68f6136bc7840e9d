"""Self-contained HTML reports: jinja2 templates with inline CSS and JS, no network access.

:func:`render` fills a template from ``report/templates/`` with autoescaping on, so every name,
stack frame and message taken from a dump (untrusted input) is escaped. ``base.html.j2`` holds the
page frame, the styles and the sortable, filterable table script; a report extends it
(``compare.html.j2`` here, a later ``diagnose`` report likewise).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["render"]

_TEMPLATES = Path(__file__).parent / "templates"


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2  # ships with torch; imported here so `import torchdebug` stays cheap

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _number
    return env


def _number(value: Any, digits: int = 4) -> str:
    """A float for a table cell: 4 significant digits, empty for ``None``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render(template: str, **context: Any) -> str:
    """The HTML of ``template`` (a file in ``report/templates``) filled with ``context``."""
    return _environment().get_template(template).render(**context)
