"""Reading records converts Arrow columns from their buffers, so it never imports pandas through
pyarrow's shim (0.4 s and about 50 MB the first time a process reads a dump)."""

import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from tests.store.test_store import _STATS, _record, _writer
from torchdebug.store._arrow_buffers import numbers, text, valid


def _chunked(kind: pa.DataType) -> pa.ChunkedArray:
    """Two chunks with empty slots, the second a slice (its values start at an offset)."""
    values = [3, None, -7, 11, None, 2**40] if kind != pa.float64() else [0.5, None, -1e300, 2.0, None, float("inf")]
    return pa.chunked_array([pa.array(values[:3], kind), pa.array([0, *values[3:]], kind).slice(1)])


@pytest.mark.parametrize("kind", [pa.int64(), pa.float64()])
def test_numbers_and_valid_read_chunked_sliced_columns_with_empty_slots(kind):
    column = _chunked(kind)
    assert numbers(column, fill=9).tolist() == [9 if v is None else v for v in column.to_pylist()]
    assert valid(column).tolist() == [v is not None for v in column.to_pylist()]


def test_numbers_read_dictionary_indices_of_any_width():
    indices = pa.array([1, None, 0, 1], pa.int8())
    assert numbers(indices, fill=5).tolist() == [1, 5, 0, 1]
    assert numbers(pa.chunked_array([], pa.int32())).tolist() == []


def test_text_is_the_string_scalar_arrow_would_make():
    assert text(",") == pa.scalar(",", pa.string())
    assert text("é, ü").as_py() == "é, ü"


def test_reading_and_comparing_a_dump_does_not_import_pandas(tmp_path):
    pytest.importorskip("pandas")  # without it installed there is nothing to import
    for side in ("a", "b"):
        writer = _writer(tmp_path / side)
        integral = _record(1, stats=dict(_STATS))
        integral.dtype = "int64"  # read back through the ints of min and max
        writer.submit(0, [_record(0, stats=dict(_STATS)), integral, _record(2)], None, [])
        writer.close()
    script = textwrap.dedent(
        f"""
        import sys
        import torchdebug
        result = torchdebug.compare({str(tmp_path / "a")!r}, {str(tmp_path / "b")!r})
        assert len(result.rows) == 3, result.rows
        print(sorted(name for name in sys.modules if name.split(".")[0] == "pandas"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
