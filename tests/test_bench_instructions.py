"""``bench/host_instructions.py`` reads callgrind's inclusive listing into its columns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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


def test_the_listing_is_read_into_the_columns_recursive_lines_left_out():
    path = Path(__file__).resolve().parents[1] / "bench" / "host_instructions.py"
    spec = importlib.util.spec_from_file_location("host_instructions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    total, parts = module.parts_of(LISTING)
    assert total == 10_000
    assert parts == {"callback": 2_000, "sums": 350, "stacks": 200, "values": 150, "native": 400, "writer": 600}
