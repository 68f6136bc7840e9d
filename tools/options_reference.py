"""Print a config's options as the Markdown table the docs hold: ``python tools/options_reference.py
DebuggerConfig`` (or ``CompilerConfig``, ``CompareConfig``, ``RanksConfig``, ``DiagnoseConfig``,
``MonitorConfig``). Each row comes from the option's declaration (``torchdebug.options``): its name,
the values its annotation allows, its default and its doc; a group's options follow as
``group.option``."""

from __future__ import annotations

import sys

from torchdebug.compare._config import CompareConfig, RanksConfig
from torchdebug.compile._config import CompilerConfig
from torchdebug.config import DebuggerConfig
from torchdebug.diagnose._config import DiagnoseConfig
from torchdebug.monitor._config import MonitorConfig
from torchdebug.options import Options, OptionSpec, specs

CONFIGS: dict[str, type[Options]] = {
    kind.__name__: kind for kind in (DebuggerConfig, CompilerConfig, CompareConfig, RanksConfig, DiagnoseConfig, MonitorConfig)
}


def values(spec: OptionSpec) -> str:
    """What the option takes, in a few words: its choices, ``bool``, a bounded number, else its type."""
    if spec.choices:
        return ", ".join("`None`" if choice is None else f"`{choice}`" for choice in spec.choices)
    items = spec.schema.get("items", {}).get("enum")
    if items:
        return "list of " + ", ".join(f"`{item}`" for item in items)
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">")):
        if key in spec.schema and spec.kind in (int, float) and "not" not in spec.schema:
            return f"{'int' if spec.kind is int else 'number'} {sign} {spec.schema[key]}"
    return {bool: "`True`, `False`", str: "text"}.get(spec.kind, "see meaning")


def rows(kind: type[Options], prefix: str = "") -> list[str]:
    out = []
    for spec in specs(kind):
        if issubclass(spec.kind, Options):
            out += rows(spec.kind, f"{prefix}{spec.name}.")
            continue
        default = spec.default
        shown = "" if default in (None, [], {}) else f"`{sorted(default) if isinstance(default, frozenset) else default!r}`"
        doc = spec.doc.replace("|", "\\|")
        out.append(f"| `{prefix}{spec.name}` | {values(spec)} | {shown} | {doc} |")
    return out


def table(kind: type[Options]) -> str:
    """The Markdown table of ``kind``'s options."""
    return "\n".join(["| option | values | default | meaning |", "|---|---|---|---|", *rows(kind)]) + "\n"


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CONFIGS):
        print(table(CONFIGS[name]))
