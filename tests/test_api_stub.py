"""``src/torchdebug/__init__.pyi`` is what type checkers read of the public API: it must say what the
code says (``make stubs`` rewrites it), keyword options of ``compare``/``diagnose``/``dump`` included."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torchdebug
from torchdebug.compare._config import CompareConfig
from torchdebug.config import DebuggerConfig
from torchdebug.diagnose._config import DiagnoseConfig
from torchdebug.options import specs

TOOL = Path(__file__).resolve().parents[1] / "tools" / "api_stub.py"


def _tool():
    spec = importlib.util.spec_from_file_location("api_stub", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stub_is_what_make_stubs_writes():
    tool = _tool()
    assert tool.STUB.read_text() == tool.stub(), "src/torchdebug/__init__.pyi is stale: run `make stubs`"


def test_the_stub_lists_every_public_name_and_each_option_as_a_keyword():
    text = _tool().stub()
    assert all(f'"{name}"' in text for name in torchdebug.__all__)
    for function, kind in [("compare", CompareConfig), ("diagnose", DiagnoseConfig), ("dump", DebuggerConfig)]:
        signature = text.split(f"def {function}(", 1)[1].split(") ->", 1)[0]
        assert f"config: {kind.__name__} | None = None" in signature
        assert all(f"    {spec.name}: " in signature for spec in specs(kind)), function


def test_annotated_metadata_stays_out_of_the_stub():
    assert "Annotated[" not in _tool().stub()
