"""task="checksum" and checksum=True: every captured tensor slot carries its fingerprint."""

import pytest
import torch

import torchdebug
from torchdebug import stats_table
from torchdebug.checksum import fingerprint, hex_digits


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
