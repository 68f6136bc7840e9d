"""The docs' options tables come from the declarations (``tools/options_reference.py``): every option
of every config has its row, with the values its annotation allows and its doc."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from torchdebug.options import Options, specs

TOOL = Path(__file__).resolve().parents[1] / "tools" / "options_reference.py"


def _tool():
    spec = importlib.util.spec_from_file_location("options_reference", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(kind: type[Options], prefix: str = "") -> list[str]:
    out = []
    for spec in specs(kind):
        out += _keys(spec.kind, f"{prefix}{spec.name}.") if issubclass(spec.kind, Options) else [prefix + spec.name]
    return out


def test_every_option_of_every_config_has_a_row_with_its_doc():
    tool = _tool()
    for kind in tool.CONFIGS.values():
        rows = tool.table(kind).splitlines()[2:]
        assert [row.split("`", 2)[1] for row in rows] == _keys(kind), kind.__name__


def test_a_row_shows_the_choices_and_bounds_the_annotation_declares():
    tool = _tool()
    rows = {row.split("`", 2)[1]: row for row in tool.table(tool.CONFIGS["DebuggerConfig"]).splitlines()[2:]}
    assert "| `statistics`, `tensor`, `structure`, `overflow_check`, `checksum` | `'statistics'` |" in rows["task"]
    assert "| int ≥ 1048576 | `268435456` |" in rows["tensor_bytes_in_flight"]
    assert "| list of `all`, `forward`, `backward`, `input`, `output` |" in rows["data_mode"]
    assert "0\\|3-5\\|10" in rows["step"]  # a | in a doc does not split the row
