"""task="checksum" and checksum=True: every captured tensor slot carries its fingerprint, taken in
the statistics' native pass and equal to the torch-op fingerprint record by record."""

import pytest
import torch

import torchdebug
from torchdebug import checksum, stats_table
from torchdebug.checksum import fingerprint, hex_digits
from torchdebug.native import fused_stats


def _records(tmp_path, fn, **options):
    with torchdebug.dump(tmp_path, **options):
        fn()
    return torchdebug.load(tmp_path).ranks[0].records()


def _body():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x.t().contiguous()
    x.bfloat16().neg()
    torch.arange(5).add(1)
    (x > 3).logical_not()
    torch.empty(0).add(1)
    y = torch.ones(3)
    y.mul_(2)


@pytest.mark.parametrize("deferred", [False, True], ids=["at once", "at flush"])
def test_checksum_records_carry_dtype_shape_and_the_fingerprint_of_their_values(tmp_path, monkeypatch, deferred):
    if deferred:  # as on an accelerator: fingerprints wait in the device table until the flush
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    records = [r for r in _records(tmp_path, _body, task="checksum") if r.kind == "tensor"]
    assert records and all(r.checksum and len(r.checksum) == 16 and r.stats is None for r in records)
    assert all(r.dtype and r.shape is not None for r in records)
    by_name = {r.name: r for r in records}
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    transposed = by_name["forward/-/aten.t.default#0/output.0"]
    assert (
        transposed.checksum == by_name["forward/-/aten.clone.default#0/output.0"].checksum == hex_digits(int(fingerprint(x.t())))
    )
    assert by_name["forward/-/aten.empty.memory_format#0/output.0"].checksum == "0" * 16
    mul_in, mul_out = by_name["forward/-/aten.mul_.Tensor#0/input.0"], by_name["forward/-/aten.mul_.Tensor#0/output.0"]
    assert mul_in.checksum == hex_digits(int(fingerprint(torch.ones(3))))
    assert mul_out.checksum == hex_digits(int(fingerprint(torch.full((3,), 2.0))))
    assert {r.dtype for r in records} >= {"float32", "bfloat16", "int64", "bool"}


def test_statistics_and_tensor_dumps_carry_checksums_when_asked(tmp_path):
    for task in ("statistics", "tensor"):
        records = [r for r in _records(tmp_path / task, _body, task=task, checksum=True) if r.kind == "tensor"]
        assert all(r.checksum and r.stats for r in records)
    plain = _records(tmp_path / "plain", _body)
    assert not any(r.checksum for r in plain)


def _training_step(device: str = "cpu"):  # noqa: ANN202
    """A small training step with views, transposes, several dtypes and tensors past the native
    kernel's threshold for splitting over threads (64 Ki elements); the model is made before
    capture (``torch.empty`` memory differs between runs)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(8, 16, device=device)
    big = torch.randn(300, 260, device=device)
    return lambda: _step(model, optimizer, x, big)


def _step(model, optimizer, x, big) -> None:  # noqa: ANN001
    h = model(x)
    heads = h.view(8, 2, 4).transpose(0, 1)  # a view in another order
    mask = h > 0
    loss = h.masked_fill(mask, 0.0).square().mean() + heads.bfloat16().float().softmax(-1).mean()
    loss = loss + h.argmax(1).float().mean() * 0
    loss.backward()
    optimizer.step()
    big.t().mul(2).reshape(-1).add(1).half().to(torch.int32)
    torch.arange(70_000, device=big.device).view(70, 1000).t().contiguous()


_TASKS = {
    "checksum": dict(task="checksum"),
    "statistics+checksum": dict(task="statistics", checksum=True),
    "tensor+checksum": dict(task="tensor", checksum=True),
}


@pytest.mark.parametrize("deferred", [False, True], ids=["at once", "at flush"])
@pytest.mark.parametrize("task", list(_TASKS))
def test_a_captured_training_step_has_the_torch_op_fingerprints_record_by_record(tmp_path, monkeypatch, task, deferred):
    """On the dispatch mode, the C kernel's fingerprints against torch ops' (the native path's are the
    mode's record by record: test_native_capture)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    if deferred:  # as on an accelerator without Triton: a table row per tensor, read at the flush
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    native = _records(tmp_path / "native", _training_step(), **_TASKS[task])
    with monkeypatch.context() as torch_ops:
        torch_ops.setattr(fused_stats, "_kernels", lambda: None)  # the kernel is not there: torch ops
        reference = _records(tmp_path / "reference", _training_step(), **_TASKS[task])
    got = {r.name: r.checksum for r in native if r.kind == "tensor"}
    want = {r.name: r.checksum for r in reference if r.kind == "tensor"}
    assert len(want) > 150 and all(want.values())
    assert got == want
    assert not [r.capture_error for r in native if r.capture_error]


def test_on_the_cpu_every_fingerprint_comes_from_the_native_pass(tmp_path, monkeypatch):
    if not fused_stats.available():
        pytest.skip("no C compiler: the native kernel is not built here")

    def torch_op_fingerprint(tensor):  # noqa: ANN001, ANN202
        raise AssertionError("the torch-op fingerprint was used")

    monkeypatch.setattr(checksum, "fingerprint", torch_op_fingerprint)
    for task in ("checksum", "statistics+checksum"):
        records = [r for r in _records(tmp_path / task, _training_step(), **_TASKS[task]) if r.kind == "tensor"]
        assert records and all(r.checksum for r in records) and not any(r.capture_error for r in records)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tensor_dump_checksums_are_the_fingerprints_of_the_saved_tensors(tmp_path, device):
    """Each record's checksum is the torch-op fingerprint of the tensor saved beside it (so a view
    that shares its source's fingerprint, or a transpose that does not, is checked on its values)."""
    step = _training_step(device)
    with torchdebug.dump(tmp_path, task="tensor", checksum=True) as debugger:
        step()
    dump = torchdebug.load(debugger.run_dir).ranks[0]
    records = [r for r in dump.records() if r.kind == "tensor" and r.tensor]
    assert len(records) > 150
    for record in records:
        assert record.checksum == hex_digits(int(fingerprint(dump.load_tensor(record)))), record.name


def test_a_view_in_the_same_order_shares_its_sources_fingerprint_without_another_pass(tmp_path, monkeypatch):
    """On the dispatch mode (the native path takes fingerprints in its callback: test_native_capture)."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    calls = []
    for name in ("cpu_fingerprint", "cpu_stats_and_fingerprint"):
        original = getattr(stats_table, name)
        monkeypatch.setattr(stats_table, name, lambda tensor, original=original: calls.append(tensor.shape) or original(tensor))

    def body() -> None:
        x = torch.randn(64, 32).relu()
        x.view(2048).neg()  # same bits, same order: the relu output's fingerprint
        x.t().neg()  # another order: a fingerprint of its own

    records = {r.name: r for r in _records(tmp_path, body, task="checksum") if r.kind == "tensor"}
    relu = records["forward/-/aten.relu.default#0/output.0"].checksum
    assert records["forward/-/aten.view.default#0/output.0"].checksum == relu
    assert records["forward/-/aten.neg.default#0/input.0"].checksum == relu
    transposed = records["forward/-/aten.t.default#0/output.0"].checksum
    assert transposed != relu and records["forward/-/aten.neg.default#1/input.0"].checksum == transposed
    assert calls.count(torch.Size([2048])) == 1  # the first neg's output, not the view
    assert calls.count(torch.Size([32, 64])) == 2  # the transpose and the second neg's output
