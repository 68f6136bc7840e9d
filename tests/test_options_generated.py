"""What is generated from the option declarations, outside the package: ``src/torchdebug/__init__.pyi``
(``tools/api_stub.py``), what type checkers read of the public API, must say what the code says
(``make stubs`` rewrites it), keyword options of ``compare``/``diagnose``/``dump`` included; the docs'
options tables (``tools/options_reference.py``) have a row for every option of every config."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import torchdebug
from torchdebug.compare._config import CompareConfig
from torchdebug.config import DebuggerConfig
from torchdebug.diagnose._config import DiagnoseConfig
from torchdebug.options import Options, specs

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stub_is_what_make_stubs_writes():
    tool = _tool("api_stub")
    assert tool.STUB.read_text() == tool.stub(), "src/torchdebug/__init__.pyi is stale: run `make stubs`"


def test_the_stub_lists_every_public_name_and_each_option_as_a_keyword():
    text = _tool("api_stub").stub()
    assert all(f'"{name}"' in text for name in torchdebug.__all__)
    for function, kind in [("compare", CompareConfig), ("diagnose", DiagnoseConfig), ("dump", DebuggerConfig)]:
        signature = text.split(f"def {function}(", 1)[1].split(") ->", 1)[0]
        assert f"config: {kind.__name__} | None = None" in signature
        assert all(f"    {spec.name}: " in signature for spec in specs(kind)), function


def test_annotated_metadata_stays_out_of_the_stub():
    assert "Annotated[" not in _tool("api_stub").stub()


def _keys(kind: type[Options], prefix: str = "") -> list[str]:
    out = []
    for spec in specs(kind):
        out += _keys(spec.kind, f"{prefix}{spec.name}.") if issubclass(spec.kind, Options) else [prefix + spec.name]
    return out


def test_every_option_of_every_config_has_a_row_in_its_options_table():
    tool = _tool("options_reference")
    for kind in tool.CONFIGS.values():
        rows = tool.table(kind).splitlines()[2:]
        assert [row.split("`", 2)[1] for row in rows] == _keys(kind), kind.__name__


def test_an_options_table_row_shows_the_choices_and_bounds_the_annotation_declares():
    tool = _tool("options_reference")
    rows = {row.split("`", 2)[1]: row for row in tool.table(tool.CONFIGS["DebuggerConfig"]).splitlines()[2:]}
    assert "| `statistics`, `tensor`, `structure`, `overflow_check`, `checksum` | `'statistics'` |" in rows["task"]
    assert "| int ≥ 1048576 | `268435456` |" in rows["tensor_bytes_in_flight"]
    assert "| list of `all`, `forward`, `backward`, `input`, `output` |" in rows["data_mode"]
    assert "0\\|3-5\\|10" in rows["step"]  # a | in a doc does not split the row


_TABLE = re.compile(r"<!-- options: (\w+) -->\n((?:\|.*\n?)+)")


def test_the_options_tables_in_the_docs_are_what_the_declarations_say():
    tool = _tool("options_reference")
    docs = Path(__file__).resolve().parents[1] / "docs"
    placed = {}
    for doc in sorted(docs.glob("*.md")):
        for name, text in _TABLE.findall(doc.read_text()):
            placed[name] = doc.name
            assert text.strip() == tool.table(tool.CONFIGS[name]).strip(), (
                f"{doc.name}: the options table of {name} is stale: paste `python tools/options_reference.py {name}`"
            )
    assert placed.get("DebuggerConfig") == "capture.md", placed
