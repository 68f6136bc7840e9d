"""Reading records converts Arrow columns from their buffers, and capture makes its columns from
numpy arrays and bytes, so neither imports pandas through pyarrow's shim (0.35–0.4 s and about 50
MB the first time a process reads a dump, or at a training process's first captured step)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.store.test_store import _STATS, _record, _writer
from torchdebug.store import _layout as layout
from torchdebug.store._arrow_buffers import array, booleans, column, int_lists, null_column, numbers, strings, text, valid
from torchdebug.store._record_columns import STATS_TYPE
from torchdebug.store._writer import RankWriter, create_run_dir

_ROOT = Path(__file__).resolve().parents[2]


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


_COLUMNS = [
    (pa.string(), ["a", None, "é, ü", "", None]),
    (pa.int64(), [3, None, -(2**63), 2**63 - 1]),
    (pa.float64(), [0.5, None, -1e300, 2**53, float("inf")]),
    (pa.bool_(), [True, None, False, True, False, False, True, False, True]),
    (pa.list_(pa.int64()), [[2, 3], None, [], [2**40]]),
]


_EXTREMES = [(kind, extreme) for kind, _ in _COLUMNS for extreme in ([], [None, None])]


@pytest.mark.parametrize(("kind", "values"), _COLUMNS + _EXTREMES)
def test_a_column_made_here_is_the_array_pyarrow_makes(kind, values):
    made = column(values, kind)
    assert made.equals(pa.array(values, kind)) and made.null_count == values.count(None)
    if kind == pa.string():
        assert strings(values).equals(made)
    if kind == pa.list_(pa.int64()):
        assert int_lists(values).equals(made)


@pytest.mark.parametrize(
    ("kind", "value", "error"),
    [
        (pa.int64(), 2**63, OverflowError),
        (pa.int64(), True, TypeError),
        (pa.int64(), 2.5, TypeError),
        (pa.float64(), 2**53 + 1, OverflowError),
        (pa.float64(), "1.5", TypeError),
        (pa.string(), 1, TypeError),
        (pa.bool_(), 1, TypeError),
        (pa.list_(pa.int64()), [2**64], OverflowError),
    ],
)
def test_a_value_a_column_cannot_hold_exactly_raises(kind, value, error):
    with pytest.raises(error):
        column([None, value], kind)


def test_a_boolean_column_reads_as_its_values_false_where_empty_chunks_and_offsets_included():
    column = pa.chunked_array([pa.array([True, None, False, True, True]).slice(1), pa.array([None, True])])
    assert booleans(column).tolist() == [False, False, True, True, False, True]
    assert booleans(pa.array([True] * 9 + [False]).slice(8)).tolist() == [True, False]  # from a bit within a byte
    assert booleans(pa.chunked_array([], pa.bool_())).tolist() == []


def test_a_numpy_array_becomes_the_array_pyarrow_makes_with_its_empty_slots():
    values, missing = np.array([5, -1, 7, -1], np.int64), np.array([False, True, False, True])
    assert array(values, missing=missing).equals(pa.array(values, mask=missing))
    assert array(values.astype(np.int8), pa.int64()).equals(pa.array(values, pa.int64()))
    assert array(np.array([True, False, True])).equals(pa.array([True, False, True]))


def test_empty_columns_are_made_once_a_length_and_type_and_only_the_last_length_kept():
    first = null_column(3, STATS_TYPE)
    assert first.equals(pa.nulls(3, STATS_TYPE)) and first.type == STATS_TYPE and first.null_count == 3
    assert null_column(3, STATS_TYPE) is first  # a steady step's batch shares it
    texts = null_column(3, pa.string())
    assert texts.type == pa.string() and len(texts) == 3 and texts is not first
    assert null_column(3, pa.string()) is texts
    other = null_column(5, pa.string())
    assert len(other) == 5 and other.null_count == 5
    assert null_column(3, pa.string()) is not texts  # another length came between: made again
    struct = pa.struct([("a", pa.int64())])
    assert null_column(3, struct).type == struct  # a type with the id of a type gone is not mistaken for it


def test_reading_and_comparing_a_dump_does_not_import_pandas(tmp_path):
    """Two dumps compared, and the ranks of one dump compared with each other (its replicated slots
    digested and the differing ones read), in a process that has no pandas loaded."""
    pytest.importorskip("pandas")  # without it installed there is nothing to import
    for side in ("a", "b"):
        writer = _writer(tmp_path / side)
        integral = _record(1, stats=dict(_STATS))
        integral.dtype = "int64"  # read back through the ints of min and max
        writer.submit(0, [_record(0, stats=dict(_STATS)), integral, _record(2)], None, [])
        writer.close()
    run = create_run_dir(tmp_path / "ranks", "run")
    for rank, value in enumerate((1.0, 2.0)):  # an all-reduce's output, which every rank must hold alike
        writer = RankWriter(run / layout.rank_dir_name(2, rank), {"rank": rank, "world_size": 2, "config": {}})
        reduced = _record(0, stats={**_STATS, "max": value}, checksum=f"{int(value):016x}")
        reduced.op, reduced.name, reduced.rank = "c10d.allreduce_.default", "forward/-/c10d.allreduce_.default#0/output.0", rank
        writer.submit(0, [reduced], None, [])
        writer.close()
    script = textwrap.dedent(
        f"""
        import sys
        import torchdebug
        result = torchdebug.compare({str(tmp_path / "a")!r}, {str(tmp_path / "b")!r})
        assert len(result.rows) == 3, result.rows
        ranks = torchdebug.compare({str(tmp_path / "ranks")!r})
        assert ranks.first_divergence is not None, ranks
        print(sorted(name for name in sys.modules if name.split(".")[0] == "pandas"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_capturing_does_not_import_pandas(tmp_path):
    """Each path (native, the dispatch mode) with statistics and fingerprints, at level ``mix``, and
    tensors, written and read back, a graph dump of the compiled model, and the monitor firing (its
    window written, the step replayed), in a process that has no pandas loaded; nor ``numpy.ma`` once
    the captures are read back."""
    pytest.importorskip("pandas")
    script = textwrap.dedent(
        f"""
        import os, sys
        if sys.argv[1] == "mode":
            os.environ["TORCHDEBUG_NATIVE"] = "0"
        import torch
        import torchdebug
        from examples.gpt import GPT, GPTConfig, make_batch, train_step
        config = GPTConfig(n_layer=1, d_model=8, n_head=2, seq_len=4, vocab=16)
        model = GPT(config)
        optimizer, batch = torch.optim.AdamW(model.parameters()), make_batch(config, batch=1)
        runs = [dict(task="statistics", checksum=True), dict(task="statistics", level="mix"), dict(task="tensor")]
        for number, options in enumerate(runs):
            path = {str(tmp_path)!r} + f"/{{sys.argv[1]}}{{number}}"
            debugger = torchdebug.Debugger(path, **options)
            for _ in range(2):
                debugger.start(model=model)
                train_step(model, optimizer, batch)
                debugger.stop()
                debugger.step()
            debugger.close()
            assert torchdebug.load(path).ranks[0].records()
        masked = ["numpy.ma"] if "numpy.ma" in sys.modules else []  # (np.unique's first call imports it: 40-55 ms)
        if sys.argv[1] == "native":  # a graph dump (TORCHDEBUG_NATIVE is not the backend's)
            os.makedirs({str(tmp_path)!r} + "/graph")
            compiler = torchdebug.CompilerConfig()
            compiler.dump_config.enable_dump = True
            compiler.dump_config.dump_path = {str(tmp_path)!r} + "/graph"
            backend = torchdebug.get_backend(compiler, model=model)
            compiled = torch.compile(model, backend=backend)
            for _ in range(2):
                train_step(compiled, optimizer, batch)
            assert torchdebug.load(compiler.dump_config.dump_path).ranks[0].records()
            backend.data_dump.close()
        monitor = torchdebug.Monitor(model, optimizer, {str(tmp_path)!r} + f"/{{sys.argv[1]}}-monitor")
        with torch.no_grad():
            model.tok.weight.fill_(float("nan"))  # fires: the window written, the step replayed and read
        def closure():
            optimizer.zero_grad()
            loss = model(*batch)
            loss.backward()
            return loss
        monitor.step(closure)
        monitor.close()
        assert monitor.events[0].replay.reproduced, monitor.events
        print(masked + sorted(name for name in sys.modules if name.split(".")[0] == "pandas"))
        """
    )
    for path in ("native", "mode"):
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, cwd=_ROOT)
        said = (path, out.stdout[-2000:], out.stderr[-2000:])
        assert out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == ["[]"], said
