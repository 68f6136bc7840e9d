import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torchdebug
from torchdebug.errors import DumpError
from torchdebug.records import Record
from torchdebug.store import _layout as layout
from torchdebug.store._reader import load
from torchdebug.store._writer import RankWriter, create_run_dir


def _record(i: int, **extra) -> Record:
    return Record(
        name=f"forward/-/aten.add.Tensor#{i}/output.0",
        step=0,
        rank=0,
        phase="forward",
        module="-",
        op="aten.add.Tensor",
        call=i,
        seq=i,
        io="output",
        arg="0",
        **extra,
    )


_STATS = {"min": -1.0, "max": 2.0, "mean": 0.5, "norm": 3.0, "nan": 0, "posinf": 1, "neginf": 0, "zeros": 9}


def _writer(tmp_path, on_write_error="continue"):
    run = create_run_dir(tmp_path, "run")
    manifest = {"rank": 0, "world_size": 1, "config": {"task": "tensor"}}
    return RankWriter(run / layout.rank_dir_name(1, 0), manifest, on_write_error=on_write_error)


def test_written_records_stacks_and_tensors_read_back(tmp_path):
    writer = _writer(tmp_path)
    batch = writer.tensor_batch(64)
    batch.add("pad-me", torch.ones(3, dtype=torch.bool))  # forces alignment padding before "k"
    batch.add("k", torch.arange(4.0).to(torch.bfloat16))
    ref = {"key": "k"}
    writer.add_stack("s1", ['File "a.py", line 1, in f'])
    writer.submit(0, [_record(0, tensor=ref, stack="s1")], batch, [ref])
    writer.close()
    dump = load(tmp_path).ranks[0]
    (record,) = dump.records()
    assert dump.complete and dump.stack(record) == ['File "a.py", line 1, in f']
    tensor = dump.load_tensor(record)
    assert tensor.dtype == torch.bfloat16 and tensor.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_records_are_on_disk_at_drain_while_tensor_files_are_still_being_written(tmp_path, monkeypatch):
    from torchdebug.store._tensor_batch import TensorBatch

    release = threading.Event()
    original = TensorBatch.write
    monkeypatch.setattr(TensorBatch, "write", lambda self, *args: (release.wait(30), original(self, *args)))
    writer = _writer(tmp_path)
    batch = writer.tensor_batch(64)
    batch.add("k", torch.ones(4))
    ref = {"key": "k"}
    writer.submit(0, [_record(0, tensor=ref)], batch, [ref])
    writer.drain()  # returns although the tensor file is not written yet
    partial = load(tmp_path).ranks[0]
    (record,) = partial.records()
    assert record.tensor is None and "stopped before" in record.capture_error
    release.set()
    writer.close()
    (record,) = load(tmp_path).ranks[0].records()
    assert record.capture_error is None and load(tmp_path).ranks[0].load_tensor(record).tolist() == [1.0] * 4


def test_a_steps_records_are_written_while_the_next_step_runs(tmp_path, monkeypatch):
    """``Debugger.stop`` (and ``step``) hands the step's records to the writer and returns; the next
    ``stop`` returns once they are on disk, ``flush`` and ``close`` once every record is."""
    from torchdebug.store._record_file import RecordFile

    release, written, returned = threading.Event(), [], []
    original = RecordFile.append

    def append(self, columns):  # noqa: ANN001
        if not written:
            release.wait(30)  # the first step's records: held until its step() returned
        written.append(bool(returned))
        return original(self, columns)

    monkeypatch.setattr(RecordFile, "append", append)
    x = torch.ones(3)
    with torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        debugger.start()
        x.mul(2)
        debugger.step()
        returned.append(True)
        release.set()
        debugger.start()
        x.add(1)
        debugger.step()
        assert written[:1] == [True]  # the first step's records: on disk once the second step returned
        debugger.flush()
        assert written == [True, True]
    assert {record.step for record in load(tmp_path).ranks[0].records()} == {0, 1}


def test_a_tensor_file_missing_from_a_complete_run_is_an_error(tmp_path):
    writer = _writer(tmp_path)
    batch = writer.tensor_batch(64)
    batch.add("k", torch.ones(4))
    ref = {"key": "k"}
    writer.submit(0, [_record(0, tensor=ref)], batch, [ref])
    writer.close()
    dump = load(tmp_path).ranks[0]
    (dump.path / ref["file"]).unlink()
    with pytest.raises(DumpError, match=ref["file"]):
        dump.load_tensor(dump.records()[0])


def test_reader_skips_a_truncated_last_batch_and_reports_the_dump_partial(tmp_path):
    writer = _writer(tmp_path)
    writer.submit(0, [_record(0), _record(1)], None, [])
    writer.drain()
    path = writer.rank_dir / layout.RECORDS
    first = path.stat().st_size
    writer.submit(0, [_record(2), _record(3)], None, [])
    writer.drain()
    whole = path.read_bytes()
    for cut in (first + 3, first + 40, (first + len(whole)) // 2, len(whole) - 1):
        path.write_bytes(whole[:cut])  # killed while writing the second batch
        dump = load(tmp_path).ranks[0]
        assert [r.call for r in dump.records()] == [0, 1], cut
        assert dump.truncated and not dump.complete
    assert load(tmp_path).partial_ranks == [0]


def test_a_dump_killed_before_its_first_batch_has_no_records(tmp_path):
    writer = _writer(tmp_path)
    assert (writer.rank_dir / layout.RECORDS).read_bytes() == b""  # the schema is written with the first batch
    dump = load(tmp_path).ranks[0]
    assert dump.records() == [] and not dump.truncated and not dump.complete
    writer.close()


def _garbage_before_the_last_batch(tmp_path, batches: int) -> int:
    """A rank of ``batches`` record batches (a flush each) with garbage written between the last two;
    returns the byte where it starts."""
    writer = _writer(tmp_path)
    for i in range(batches - 1):
        writer.submit(0, [_record(i)], None, [])
        writer.drain()
    path = writer.rank_dir / layout.RECORDS
    size = path.stat().st_size
    writer.submit(0, [_record(batches - 1)], None, [])
    writer.close()
    data = path.read_bytes()
    path.write_bytes(data[:size] + b"garbage\n" + data[size:])
    return size


def test_reader_rejects_a_corrupt_batch_in_the_middle_naming_it(tmp_path):
    first = _garbage_before_the_last_batch(tmp_path, batches=2)
    with pytest.raises(DumpError, match=rf"records.arrows: batch 2 of records \(byte {first}\) is corrupt"):
        load(tmp_path).ranks[0].records()


def test_records_take_few_bytes_each(tmp_path, tiny):
    with torchdebug.dump(tmp_path, model=tiny, task="statistics"):
        for _ in range(40):  # one batch of many records, as a real step writes
            tiny(torch.randn(2, 4)).sum().backward()
    dump = load(tmp_path).ranks[0]
    size = (dump.path / layout.RECORDS).stat().st_size
    assert len(dump.records()) > 2000
    assert size / len(dump.records()) < 200  # JSON lines took about 460 bytes a record


def test_the_records_file_is_an_arrow_stream_any_arrow_reader_opens(tmp_path):
    import pyarrow.ipc

    writer = _writer(tmp_path)
    writer.submit(0, [_record(0, stats=_STATS)], None, [])
    writer.submit(1, [_record(1)], None, [])
    writer.close()
    table = pyarrow.ipc.open_stream(writer.rank_dir / layout.RECORDS).read_all()
    assert table.column("name").to_pylist() == [_record(0).name, _record(1).name]
    assert table.column("stats").to_pylist() == [_STATS, None]


def _message_types(path) -> list[str]:
    import pyarrow.ipc

    return [message.type for message in pyarrow.ipc.MessageReader.open_stream(path.read_bytes())]


def test_repeating_strings_are_stored_as_dictionaries_that_a_step_like_the_last_does_not_repeat(tmp_path):
    """Schema version 2: on disk the string columns (but checksum and tensor_key) are dictionaries, and
    a batch whose dictionaries equal the last batch's is written alone; readers get plain strings."""
    import pyarrow as pa
    import pyarrow.ipc

    from torchdebug.store._record_columns import SCHEMA

    writer = _writer(tmp_path)
    for step in range(2):  # two alike steps, but for their checksums
        writer.submit(step, [_record(i, checksum=f"{step}{i:015x}") for i in range(3)], None, [])
        writer.drain()
    path = writer.rank_dir / layout.RECORDS
    after_two = _message_types(path)
    last = dataclasses.replace(_record(0, checksum="f" * 16), module="layers.0")
    writer.submit(2, [last], None, [])
    writer.close()
    with pyarrow.ipc.open_stream(path) as stream:
        stored = stream.schema
    assert pa.types.is_dictionary(stored.field("op").type) and pa.types.is_dictionary(stored.field("name").type)
    assert stored.field("checksum").type == pa.string() and stored.field("tensor_key").type == pa.string()
    batch = after_two.index("record batch")
    assert after_two[1:batch] == ["dictionary"] * sum(pa.types.is_dictionary(field.type) for field in stored)
    assert after_two[batch:] == ["record batch", "record batch"]  # the second step's dictionaries are the first's
    assert _message_types(path)[len(after_two) :] == ["dictionary", "dictionary", "record batch"]  # its names and modules
    dump = load(tmp_path).ranks[0]
    assert dump.to_arrow().schema.equals(SCHEMA, check_metadata=False)
    assert [(r.name, r.module, r.checksum) for r in dump.records()][-1] == (last.name, "layers.0", last.checksum)


def test_dumps_of_schema_version_1_plain_strings_and_zstd_are_still_read(tmp_path):
    import pyarrow as pa
    import pyarrow.ipc

    from torchdebug.store._record_columns import SCHEMA, records_batch

    writer = _writer(tmp_path)
    writer.close()
    records = [_record(0, stats=_STATS), _record(1)]
    path = writer.rank_dir / layout.RECORDS
    options = pyarrow.ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(path), "wb") as sink, pyarrow.ipc.new_stream(sink, SCHEMA, options=options) as stream:
        stream.write_batch(records_batch(records))
    manifest = writer.rank_dir / layout.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "schema_version": 1}))
    assert load(tmp_path).ranks[0].records() == records


def test_a_flush_of_many_records_is_written_as_messages_a_reader_decodes_a_few_at_a_time(tmp_path, monkeypatch):
    """A step handed over as one batch (the native path's, a graph dump's) becomes messages of at most
    ``BATCH_ROWS`` records, so a reader never decodes a whole large step at once; its records read
    back whole and in order."""
    import pyarrow.ipc

    from torchdebug.store import _record_file
    from torchdebug.store._record_columns import records_batch

    monkeypatch.setattr(_record_file, "BATCH_ROWS", 4)
    writer = _writer(tmp_path)
    records = [_record(i) for i in range(10)]
    writer.submit_columns(0, records_batch(records))
    writer.close()
    with pyarrow.ipc.open_stream(writer.rank_dir / layout.RECORDS) as stream:
        assert [batch.num_rows for batch in stream] == [4, 4, 2]
    assert [record.name for record in load(tmp_path).ranks[0].records()] == [record.name for record in records]


def test_to_arrow_gives_the_stored_table_and_to_pandas_goes_through_it(tmp_path):
    writer = _writer(tmp_path)
    writer.submit(0, [_record(0, dtype="float32", shape=[2, 3], stats=_STATS), _record(1, kind="value", value=[1, 2])], None, [])
    writer.close()
    run = load(tmp_path)
    table = run.to_arrow()
    assert table.equals(run.ranks[0].to_arrow()) and table.num_rows == 2
    assert table.column("shape").to_pylist() == [[2, 3], None] and table.column("value").to_pylist() == [None, "[1,2]"]
    frame = run.to_pandas()
    assert frame["max"].tolist()[0] == _STATS["max"] and frame["shape"].tolist() == [[2, 3], None]


def test_tensor_files_open_with_the_safetensors_library(tmp_path):
    from safetensors.torch import load_file

    writer = _writer(tmp_path)
    batch = writer.tensor_batch(64)
    batch.add("a", torch.tensor([1, 2, 3], dtype=torch.int16))
    batch.add("b", torch.tensor([[1.5, 2.5]], dtype=torch.float64))
    batch.add("c", torch.empty(0, 2))
    ref = {"key": "a"}
    writer.submit(0, [_record(0, tensor=ref)], batch, [ref])
    writer.close()
    loaded = load_file(str(writer.rank_dir / ref["file"]))
    assert loaded["a"].tolist() == [1, 2, 3] and loaded["b"].tolist() == [[1.5, 2.5]] and loaded["c"].shape == (0, 2)


def _failing_tensor_write(tmp_path, on_write_error="raise") -> RankWriter:
    """A writer whose submitted tensor batch cannot be written (a file where the folder goes)."""
    writer = _writer(tmp_path, on_write_error)
    batch = writer.tensor_batch(64)
    batch.add("a", torch.ones(2))
    (writer.rank_dir / "tensors").write_text("a file where the folder should be")
    writer.submit(0, [], batch, [])
    return writer


def test_a_failed_tensor_write_is_reported_by_the_drain_that_waits_for_it(tmp_path):
    writer = _failing_tensor_write(tmp_path)
    with pytest.raises(DumpError, match="writing the dump under .* failed"):
        writer.drain(tensors=True)


def test_a_failed_tensor_write_is_reported_by_the_next_submit(tmp_path):
    writer = _failing_tensor_write(tmp_path)
    writer._tensor_jobs.join()  # the background write has failed by now
    with pytest.raises(DumpError, match="writing the dump under .* failed"):
        writer.submit(0, [_record(0)], None, [])


def test_run_folders_are_never_reused(tmp_path):
    first = create_run_dir(tmp_path, "20261122-101500")
    second = create_run_dir(tmp_path, "20261122-101500")
    assert first != second and second.name == "20261122-101500-1"


def test_load_rejects_folders_that_are_not_dumps(tmp_path):
    with pytest.raises(DumpError, match="no torchdebug dump here"):
        load(tmp_path)
    with pytest.raises(DumpError, match="no such dump folder"):
        load(tmp_path / "missing")


def test_load_rejects_a_newer_schema_version(tmp_path):
    writer = _writer(tmp_path)
    writer.close()
    manifest = writer.rank_dir / layout.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "schema_version": 99}))
    with pytest.raises(DumpError, match="schema_version 99 is not supported"):
        load(tmp_path)


def test_load_accepts_a_rank_folder_a_run_folder_and_a_dump_path(tmp_path):
    writer = _writer(tmp_path)
    writer.close()
    for path in (tmp_path, writer.rank_dir.parent, writer.rank_dir):
        assert list(load(path).ranks) == [0]


def test_unwritable_dump_path_fails_before_the_run_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DumpError, match="dump_path: cannot write to"):
        torchdebug.Debugger(blocker / "dump")


def test_running_twice_into_one_dump_path_keeps_both_runs(tmp_path, tiny):
    for _ in range(2):
        with torchdebug.dump(tmp_path, model=tiny):
            tiny(torch.randn(2, 4))
    runs = [p for p in tmp_path.iterdir() if layout.is_run_dir(p)]
    assert len(runs) == 2


@pytest.mark.parametrize("native", [False, True], ids=["dispatch_mode", "native_path"])
def test_a_process_killed_mid_step_keeps_every_flushed_record(tmp_path, native):
    """The dispatch mode hands a step's records to the writer as it goes (a flush mid-step writes
    them); the native path at the step's stop: killed mid-step, it keeps the steps before. Tensor
    files are whole or absent either way."""
    hold = "" if native else "torchdebug.debugger.why_not_native = lambda config, model: 'held'"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(os.getcwd())!r})
        import torchdebug, torchdebug.debugger
        {hold}
        dbg = torchdebug.Debugger({str(tmp_path)!r}, task="tensor")
        x = torch.ones(3)
        for step in range(2):
            dbg.start()
            y = (x * 2).relu()
            dbg.stop(); dbg.step()
        dbg.start()
        z = x + 1
        dbg.session.flush(wait=True)  # a batch written mid-step
        w = z * 3                    # never flushed
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    run = load(tmp_path)
    dump = run.ranks[0]
    assert run.partial_ranks == [0] and not dump.complete
    calls = {(r.step, r.op) for r in dump.records()}
    assert {(0, "aten.mul.Tensor"), (1, "aten.relu.default")} <= calls
    assert ((2, "aten.add.Tensor") in calls) != native and (2, "aten.mul.Tensor") not in calls
    for record in dump.records():
        if record.tensor:
            dump.load_tensor(record)  # tensor files are complete or absent, never partial
        elif record.kind == "tensor":
            assert record.capture_error.startswith("tensor not saved: the run stopped before")


def test_the_completion_marker_says_whether_the_run_was_interrupted(tmp_path, tiny):
    """``complete.json``'s ``status``: ``complete`` for a run closed as planned; ``interrupted`` when
    an exception left ``torchdebug.dump(...)`` or a ``with Debugger(...)`` block, or the interpreter
    exited while a step was being captured. Every record captured before is kept either way."""
    x = torch.randn(2, 4)
    with torchdebug.dump(tmp_path / "planned", model=tiny):
        tiny(x)
    with pytest.raises(ValueError, match="planted"), torchdebug.dump(tmp_path / "raised", model=tiny):
        tiny(x)
        raise ValueError("planted")
    with pytest.raises(ValueError, match="planted"), torchdebug.Debugger(tmp_path / "debugger") as debugger:
        debugger.start(tiny)
        tiny(x)
        raise ValueError("planted")
    script = textwrap.dedent(
        f"""
        import torch, torchdebug
        debugger = torchdebug.Debugger({str(tmp_path / "exited")!r})
        debugger.start()
        torch.ones(3).relu()
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    expected = {"planned": "complete", "raised": "interrupted", "debugger": "interrupted", "exited": "interrupted"}
    for name, status in expected.items():
        (marker,) = (tmp_path / name).glob(f"*/*/{layout.COMPLETE}")
        assert (name, json.loads(marker.read_text())["status"]) == (name, status)
        assert load(tmp_path / name).ranks[0].records(), name


def test_fast_record_encoding_equals_json_for_every_field():
    import dataclasses
    import math

    from torchdebug.store._record_json import ENCODED_FIELDS, encode_record

    assert ENCODED_FIELDS == tuple(f.name for f in dataclasses.fields(Record))
    record = _record(
        0,
        kind="value",
        dtype="bfloat16",
        shape=[2, 0],
        stride=[1, 1],
        device="cuda:0",
        requires_grad=True,
        stats={"min": -math.inf, "max": 2.5, "mean": None, "norm": 1e300, "nan": 3, "posinf": 0, "neginf": 1, "zeros": 7},
        tensor={"key": 'k"\\ü', "file": "tensors/x.safetensors", "view": {"shape": [1], "stride": [1], "offset": 0}},
        sampled=4,
        value={"nested": [1, "two", None]},
        stack="abc",
        source="f.py:1 in <module>",
        fwd="forward/-/x#0",
        node="mm_1",
        capture="graph",
        capture_error="boom",
        extra={"future": [1.5]},
    )
    decoded = json.loads(encode_record(record))
    expected = json.loads(json.dumps(record.to_json()))
    assert decoded.keys() == expected.keys()
    assert math.isinf(decoded["stats"].pop("min")) and math.isinf(expected["stats"].pop("min"))
    assert decoded == expected
    minimal = _record(1)
    assert json.loads(encode_record(minimal)) == minimal.to_json()


def _encoding_cases() -> list[Record]:
    import math

    shape, stats = [4, 8], {"min": -1.0, "max": 2.0, "mean": 0.5, "norm": 3.0, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 9}
    shared = [_record(i, dtype="float32", shape=shape, stride=[8, 1], device="cpu", stats=stats) for i in range(3)]
    return [
        *shared,
        _record(3, dtype="float32", shape=[2], stride=[1], device="cpu", stats={**stats, "min": -7.0}),
        _record(4),
        _record(5, kind="value", value={"nested": [1, "two", None, 2.5]}),
        _record(6, kind="value", value=[1, 2, "float32"]),
        _record(7, stats={"min": math.nan, "max": math.inf, "mean": -math.inf, "norm": None, "nan": 3, "posinf": 1, "neginf": 1}),
        _record(8, stats={"min": 1e-300, "max": 1e300, "mean": -0.0, "norm": 0.1, "nan": 0, "posinf": 0, "neginf": 2**40}),
        _record(
            9, stats={"min": 1.0}, tensor={"key": 'k"\\ü\n', "file": "tensors/x.safetensors", "view": {"shape": [1], "offset": 0}}
        ),
        _record(10, shape=[2**62, -3, 0], stride=[], requires_grad=True, sampled=4, extra={"graph": "m__0/forward"}),
        _record(
            11,
            requires_grad=False,
            stack="abc",
            source="fünf.py:1 in <module>",
            fwd="forward/-/x#0",
            node="mm_1",
            capture="graph",
            capture_error="boom\t\x7f",
        ),
        # statistics of a dump from before zeros existed: written as they were read
        _record(12, stats={"min": -1, "max": 5, "mean": 2.0, "norm": 7.5, "nan": 0, "posinf": 0, "neginf": 0}, extra={}),
        _record(13, dtype="bfloat16", shape=[2], stats=stats, checksum="00ff00ff00ff00ff", tensor={"key": "k"}),
        _record(14, dtype="int64", shape=[], checksum="8000000000000000"),
        _odd_numbers_record(),
    ]


def test_batch_encoding_writes_shared_descriptions_as_each_record_alone():
    from torchdebug.store import _record_json as record_json

    records = _encoding_cases()
    lines = record_json.encode_records(records).splitlines(keepends=True)
    assert lines == [record_json.encode_record(r) + "\n" for r in records]
    assert json.loads(lines[3])["stats"]["min"] == -7.0 and json.loads(lines[3])["shape"] == [2]


def _columns_round_trip(records: list[Record]) -> list[Record]:
    import pyarrow as pa

    from torchdebug.store._record_columns import records_batch, records_from_table

    return records_from_table(pa.Table.from_batches([records_batch(records)]))


def test_every_field_reads_back_from_the_arrow_columns_as_written():
    import math

    cases = _encoding_cases()[:-1]  # all but the odd numbers (below)
    back = _columns_round_trip(cases)
    nan = back[7].stats.pop("min"), cases[7].stats["min"]
    assert math.isnan(nan[0]) and back[7].stats == {k: v for k, v in cases[7].stats.items() if k != "min"}
    back[7].stats["min"] = cases[7].stats["min"]
    assert back == cases
    assert back[0].shape is back[1].shape and back[0].stats is back[1].stats  # shared, as capture shares them
    assert "zeros" not in back[12].stats and back[12].stats["max"].__class__ is int  # written as they were read


def test_steps_and_ranks_read_back_per_record_whether_one_or_several():
    one_step = _columns_round_trip([_record(i) for i in range(3)])
    assert [r.step for r in one_step] == [0, 0, 0] and [r.rank for r in one_step] == [0, 0, 0]
    several = [dataclasses.replace(_record(i), step=i % 2, rank=2**40 + i) for i in range(3)]
    back = _columns_round_trip(several)
    assert [r.step for r in back] == [0, 1, 0] and [r.rank for r in back] == [2**40, 2**40 + 1, 2**40 + 2]


def test_records_share_statistics_only_when_every_bit_is_equal():
    import math

    negative_zero, nan = {**_STATS, "mean": -0.0}, {**_STATS, "min": math.nan, "norm": None}
    cases = [_STATS, dict(_STATS), {**_STATS, "mean": 0.0}, negative_zero, nan, None, {**_STATS, "zeros": None}]
    back = [r.stats for r in _columns_round_trip([_record(i, dtype="float32", stats=s) for i, s in enumerate(cases)])]
    assert back[0] is back[1] and back[0] == _STATS and back[2] is not back[3]
    assert math.copysign(1, back[2]["mean"]) == 1 and math.copysign(1, back[3]["mean"]) == -1
    assert math.isnan(back[4]["min"]) and back[4]["norm"] is None and back[5] is None and back[6]["zeros"] is None
    (odd,) = _columns_round_trip([_record(0, stats={**_STATS, "nan": 2.5, "zeros": True})])
    assert odd.stats == {**_STATS, "nan": 2.5, "zeros": True} and odd.stats["zeros"] is True  # never truncated to an int


def test_statistics_of_integer_tensors_read_back_as_ints():
    stats = {**_STATS, "min": 3, "max": 2**40}
    back = _columns_round_trip([_record(0, dtype="int64", stats=stats), _record(1, dtype="float32", stats=_STATS)])
    assert back[0].stats == stats and back[0].stats["min"].__class__ is int and back[0].stats["max"].__class__ is int
    assert back[1].stats == _STATS and back[1].stats["min"].__class__ is float


def test_integer_statistics_beyond_a_doubles_exact_range_read_back_exactly():
    """An attention kernel's random seed (an int64 on the host, any 64-bit value) has a min and a
    max no float64 column holds exactly: the record keeps them whole, the batch of records beside
    it is written as usual."""
    seed = {**_STATS, "min": 7016455870382827520, "max": 7016455870382827520, "mean": 7.0164558703828275e18}
    back = _columns_round_trip([_record(0, dtype="int64", stats=seed), _record(1, dtype="float32", stats=_STATS)])
    assert back[0].stats == seed and back[0].stats["max"].__class__ is int
    assert back[1].stats == _STATS


def test_debugger_flush_puts_every_tensor_file_on_disk_before_close(tmp_path):
    dbg = torchdebug.Debugger(tmp_path, task="tensor")
    dbg.start()
    (torch.ones(8) * 2).relu()
    dbg.stop()
    dbg.flush()
    dump = load(tmp_path).ranks[0]
    assert not dump.complete
    saved = [r for r in dump.records() if r.kind == "tensor"]
    assert saved and all(r.capture_error is None and dump.load_tensor(r).numel() == 8 for r in saved)
    dbg.close()


class _SymbolicSize:
    """Stands for a size the encoder cannot write as a number (a ``SymInt`` left in a record)."""

    def __str__(self) -> str:
        return "s27"

    def __index__(self) -> int:
        raise TypeError("a symbolic size has no value here")


def _odd_numbers_record() -> Record:
    import numpy as np

    record = _record(
        0,
        shape=[2, _SymbolicSize(), np.int64(64), "s9", True],
        stride=[_SymbolicSize(), 1],
        stats={
            "min": np.float32(1.5),
            "max": None,
            "mean": _SymbolicSize(),
            "norm": 2.0,
            "nan": np.int64(0),
            "posinf": None,
            "neginf": 1,
        },
        sampled=np.int16(4),
        value=[np.int64(3), _SymbolicSize(), np.float32(2.5)],
        extra={"graph": "model__0/forward", "count": np.int8(1)},
    )
    record.step, record.call = np.int64(3), np.int32(2)
    return record


def test_numbers_that_are_not_plain_ints_or_floats_never_make_an_invalid_line():
    from torchdebug.store import _record_json as record_json

    (line,) = record_json.encode_records([_odd_numbers_record()]).splitlines()
    _assert_odd_numbers(json.loads(line))  # a symbolic size, a numpy int, a string: still one valid JSON line


def test_numbers_that_are_not_plain_ints_or_floats_are_kept_beside_the_arrow_columns():
    (record,) = _columns_round_trip([_odd_numbers_record()])
    _assert_odd_numbers({**record.to_json(), "extra": record.extra})


def _assert_odd_numbers(decoded: dict) -> None:
    assert decoded["step"] == 3 and decoded["call"] == 2 and decoded["sampled"] == 4
    assert decoded["shape"] == [2, "s27", 64, "s9", True] and decoded["stride"] == ["s27", 1]
    assert decoded["stats"] == {"min": 1.5, "max": None, "mean": "s27", "norm": 2.0, "nan": 0, "posinf": None, "neginf": 1}
    assert decoded["value"] == [3, "s27", 2.5] and decoded["extra"]["count"] == 1


def test_numpy_scalars_among_an_ops_arguments_are_recorded_as_numbers():
    import numpy as np

    from torchdebug.slots import json_value
    from torchdebug.store._record_json import encode_record

    value = json_value([np.int64(3), np.float32(1.5), -1])
    assert value == [3, 1.5, -1] and all(type(v) in (int, float) for v in value)
    assert json.loads(encode_record(_record(0, kind="value", value=value)))["value"] == [3, 1.5, -1]


def test_a_records_file_is_decoded_in_order_only(tmp_path):
    """A batch's dictionaries are in the messages before it: decoding a later batch first is refused,
    never answered with another batch's records."""
    from torchdebug.store._record_file import _Decoder, record_stream

    writer = _writer(tmp_path)
    for i in range(2):
        writer.submit(0, [_record(i)], None, [])
        writer.drain()
    writer.close()
    stream = record_stream(writer.rank_dir / layout.RECORDS)
    with pytest.raises(ValueError, match="decoded in order: 1 asked for, 0 next"):
        _Decoder(stream).decode(range(1, 2))
    decoder = _Decoder(stream)
    assert [decoder.decode(range(i, i + 1)).column("call").to_pylist() for i in range(2)] == [[0], [1]]


def test_a_column_equal_to_the_one_encoded_last_takes_that_encoding_and_a_new_one_is_encoded(tmp_path, monkeypatch):
    """The native path hands a steady step's names as the same arrays each step: the writer encodes
    them once, and a column of the same values in other memory takes that encoding too. A column
    of new values is encoded again, whatever its length and place."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from torchdebug.store import _record_file
    from torchdebug.store._record_columns import SCHEMA, records_batch
    from torchdebug.store._record_file import RecordFile, read_records

    encoded = []
    encode = pc.dictionary_encode
    monkeypatch.setattr(pc, "dictionary_encode", lambda column: encoded.append(column) or encode(column))
    first = records_batch([_record(i) for i in range(3)])
    again = pa.RecordBatch.from_arrays(first.columns, schema=SCHEMA)  # the same memory, another batch
    copied = first.set_column(SCHEMA.names.index("name"), "name", pa.array(first.column("name").to_pylist()))
    renamed = first.set_column(SCHEMA.names.index("name"), "name", pa.array([f"x{i}" for i in range(3)]))
    path = tmp_path / "records.arrows"
    file = RecordFile(path)
    file.append(first)
    encodes = len(encoded)
    file.append(again)
    file.append(copied)
    assert len(encoded) == encodes  # nothing encoded again
    file.append(renamed)
    assert len(encoded) == encodes + 1  # its names alone
    monkeypatch.setattr(_record_file, "BATCH_ROWS", 2)
    file.append(first)  # two messages: the second's columns are held too
    assert {offset for _, offset in file._encoded} == {0, 2}
    file.append(first.slice(0, 2))  # one: the larger batch's columns at offset 2 are let go
    assert {offset for _, offset in file._encoded} == {0}
    file.close()
    assert not file._encoded
    table, truncated = read_records(path)
    assert not truncated
    names = [r.name for r in [_record(i) for i in range(3)]]
    assert table.column("name").to_pylist() == names * 3 + ["x0", "x1", "x2"] + names + names[:2]


def test_a_column_of_nulls_is_encoded_without_hashing_and_no_dictionary_is_written_again(tmp_path, monkeypatch):
    """Most records hold no ``node``, ``extra`` or ``json_fields``: such a column, new memory each
    batch, is encoded without ``dictionary_encode``, on an empty dictionary the stream does not
    write again, and as long as the last batch's takes its encoding (none made again); its records
    read back with nothing there."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc

    from torchdebug.store._record_columns import records_batch
    from torchdebug.store._record_file import STORED_SCHEMA, RecordFile, read_records

    encoded = []
    encode = pc.dictionary_encode
    monkeypatch.setattr(pc, "dictionary_encode", lambda column: encoded.append(column) or encode(column))
    path = tmp_path / "records.arrows"
    file = RecordFile(path)
    node = (STORED_SCHEMA.names.index("node"), 0)
    made = []
    for step in range(3):
        file.append(records_batch([_record(i + 3 * step) for i in range(3)]))
        made.append(file._encoded[node][1])
    file.append(records_batch([_record(i) for i in range(2)]))  # another length: encoded anew
    shorter = file._encoded[node][1]
    file.close()
    assert encoded and all(column.null_count < len(column) for column in encoded)  # no column of nulls hashed
    assert made[1] is made[0] and made[2] is made[0] and shorter is not made[0] and len(shorter) == 2
    dictionaries = sum(message.type == "dictionary" for message in ipc.MessageReader.open_stream(str(path)))
    assert dictionaries == sum(pa.types.is_dictionary(field.type) for field in STORED_SCHEMA) + 3  # then the names alone
    table, truncated = read_records(path)
    assert not truncated and table.num_rows == 11
    assert table.column("node").null_count == table.column("extra").null_count == 11
