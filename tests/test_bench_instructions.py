"""The benches that count instructions: ``bench/host_instructions.py`` reads callgrind's inclusive
listing into its columns and its dumps into spans; ``bench/monitor.py --per-call --instructions``
runs its chains in children (here without callgrind) and reads their dumps; ``bench/host_per_op.py``'s
marks, phases and collector table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

LISTING = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
10,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                        file:function
--------------------------------------------------------------------------------
9,000 (90.0%)  Python/ceval.c:_PyEval_EvalFrameDefault'2 [libpython3.11.so.1.0]
1,200 (12.0%)  ???:(anonymous namespace)::on_enter(at::RecordFunction const&) [observer.so]
  800 ( 8.0%)  ???:(anonymous namespace)::on_exit(at::RecordFunction const&, at::ObserverContext*) [observer.so]
  100 ( 1.0%)  ???:(anonymous namespace)::on_exit(at::RecordFunction const&, at::ObserverContext*)'2 [observer.so]
  300 ( 3.0%)  ???:td_stats_f32 [stats.so]
   50 ( 0.5%)  ???:td_stats_i64 [stats.so]
  200 ( 2.0%)  ???:(anonymous namespace)::python_frames(bool) [observer.so]
  150 ( 1.5%)  ???:(anonymous namespace)::json_value(std::string&, c10::IValue const&) [observer.so]
  400 ( 4.0%)  ???:ffi_call [libffi.so.8.1.2]
  600 ( 6.0%)  ???:arrow::ipc::internal::IpcFormatWriter::WriteRecordBatch(arrow::RecordBatch const&) [libarrow.so.2600]
"""


def _bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "host_instructions.py"
    spec = importlib.util.spec_from_file_location("host_instructions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_listing_is_read_into_the_columns_recursive_lines_left_out():
    module = _bench()
    total, parts = module.parts_of(LISTING)
    assert total == 10_000
    assert parts == {"callback": 2_000, "sums": 350, "stacks": 200, "values": 150, "native": 400, "writer": 600}


def _dump(count: int) -> str:
    return f"version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: {count}\n\nfn=(1) main\n0 {count}\n"


def test_the_spans_are_read_from_the_dumps_in_turn_and_a_missing_dump_is_an_error():
    module = _bench()
    # dump 1: before the first mark; then per step: start, step, stop, and what ran until the next start
    counts = (999, 10, 100, 1_000, 7, 20, 200, 2_000)
    dumps = {number: _dump(count) for number, count in enumerate(counts, start=1)}
    assert module.spans_of(dumps, 2) == {"start": [10, 20], "step": [100, 200], "stop": [1_000, 2_000]}
    del dumps[6]
    with pytest.raises(SystemExit, match="dumps for 2 steps"):
        module.spans_of(dumps, 2)


class _Calls:
    """A stand-in debugger that notes its calls, in order, with the marks and the step's."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self.calls.append(name)


def test_run_block_marks_each_step_before_its_start_and_after_its_start_step_and_stop():
    from bench.host_per_op import run_block  # (the repository's root is on the path: conftest.py)

    calls: list[str] = []
    run_block("statistics/op native", _Calls(calls), None, lambda: calls.append("train"), 2, lambda: calls.append("mark"))
    one = ["mark", "start", "mark", "train", "mark", "stop", "step", "mark"]
    assert calls == [*one, *one, "flush"]


def test_a_steps_phases_are_the_times_between_its_marks():
    from bench.host_per_op import phase_times, run_block

    now = [0.0]  # a clock each call below moves on: the start by 1, the step by 10, the stop by 100
    ticks = {"start": 1, "stop": 100}

    class Timed:
        def __getattr__(self, name: str):
            return lambda *args, **kwargs: now.__setitem__(0, now[0] + ticks.get(name, 0))

    readings: list[float] = []
    run_block("statistics/op native", Timed(), None, lambda: now.__setitem__(0, now[0] + 10), 2, lambda: readings.append(now[0]))
    assert phase_times(readings) == {"start": [1, 1], "step": [10, 10], "stop": [100, 100]}
    with pytest.raises(ValueError, match="7 marks"):
        phase_times(readings[:7])


def test_the_collector_table_counts_the_collections_made_while_entered_and_full_ones_apart():
    import gc

    from bench.host_per_op import Collections

    collections = Collections()
    with collections:
        gc.collect(0)
        gc.collect(1)
        gc.collect()
    gc.collect()  # (not entered: not counted)
    assert collections.full == 1
    assert gc.callbacks.count(collections._called) == 0
    milliseconds, full = collections.per_step(2).split()
    assert float(full) == 50.0 and float(milliseconds) == round(collections.seconds / 2 * 1000, 2)


def test_a_dump_count_is_its_summary_or_totals_line():
    from bench._callgrind import dump_count

    assert dump_count(_dump(1234)) == 1234
    assert dump_count("version: 1\ntotals: 56\n") == 56
    assert dump_count("version: 1\nevents: Ir\n") is None


_GLOBAL_HOOKS = ("pre_hooks", "hooks", "hooks_with_kwargs", "hooks_always_called")
"""torch's tables of global forward hooks (``torch.nn.modules.module``): a hook's id left in any one
keeps every module call on the slow path (``remove_global_hook``)."""


@pytest.mark.parametrize("mode", ["plain", "global hooks", "monitor"])
def test_each_counted_chain_runs_its_forwards_between_two_marks_and_leaves_no_hook(mode, monkeypatch):
    import torch.nn.modules.module as module_globals

    from bench import monitor as bench

    marks: list[int] = []
    forwards: list[int] = []
    monkeypatch.setattr(bench.os, "getppid", lambda: marks.append(len(forwards)))
    monkeypatch.setattr(bench, "_FORWARDS", 3)
    chain = bench._chain

    def counted_chain(modules):
        model, x = chain(modules)
        model.register_forward_hook(lambda *_: forwards.append(1))
        return model, x

    monkeypatch.setattr(bench, "_chain", counted_chain)
    hooks = [len(getattr(module_globals, f"_global_forward_{kind}")) for kind in _GLOBAL_HOOKS]
    bench._counted_forwards(mode, modules=2)
    assert marks == [5 + (3 if mode == "monitor" else 0), 8 + (3 if mode == "monitor" else 0)]  # (the monitor's 3 steps)
    assert len(forwards) == marks[1]  # the counted forwards between the marks, nothing after them
    assert [len(getattr(module_globals, f"_global_forward_{kind}")) for kind in _GLOBAL_HOOKS] == hooks


def test_host_per_op_runs_the_staged_native_arms_and_prints_their_collector_table(monkeypatch, capsys, tmp_path):
    import sys

    from bench import host_per_op
    from torchdebug.native.observer import load_observer

    observer = load_observer()
    if observer is None:
        pytest.skip("the native observer cannot be built here")
    argv = ["host_per_op.py", "--modes", "statistics/op native", "--rounds", "1", "--warmup", "0", "--block", "1", "--staged"]
    monkeypatch.setattr(sys, "argv", [*argv, "--dir", str(tmp_path)])
    before = observer._staged
    host_per_op.main()
    assert observer._staged - before > 1000  # (the tiny GPT's step: about 1,600 tensors staged; unstaged, a handful)
    printed = capsys.readouterr().out
    table = printed[printed.index("collector (gc)") :].splitlines()
    assert [line.split()[0] for line in table[1:3]] == ["plain", "statistics/op"]
    assert "fell back" not in printed
