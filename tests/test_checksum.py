"""The 64-bit tensor fingerprint: bits in logical order, any dtype, same on every device."""

import pytest
import torch

from torchdebug.checksum import fingerprint, hex_digits


def _hex(tensor):
    return hex_digits(int(fingerprint(tensor)))


def test_a_non_contiguous_view_and_its_contiguous_copy_agree():
    x = torch.randn(6, 5)
    view = x.t()[1:, ::2]
    assert not view.is_contiguous()
    assert _hex(view) == _hex(view.contiguous())


def test_a_transpose_differs_from_its_base():
    x = torch.randn(4, 4)
    assert _hex(x) != _hex(x.t())


def test_one_ulp_or_a_sign_of_zero_changes_the_fingerprint():
    x = torch.randn(1000)
    y = x.clone()
    y[517] = torch.nextafter(y[517], torch.tensor(float("inf")))
    assert _hex(x) != _hex(y)
    assert _hex(torch.tensor([0.0])) != _hex(torch.tensor([-0.0]))


def test_swapping_two_elements_changes_the_fingerprint():
    x = torch.arange(10, dtype=torch.int32)
    assert _hex(x) != _hex(x.flip(0))


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(7).bfloat16(),
        torch.randn(7).half(),
        torch.randn(3, dtype=torch.float64),
        torch.arange(-5, 5, dtype=torch.int8),
        torch.arange(-5, 5, dtype=torch.int16),
        torch.arange(-5, 5),
        torch.tensor([True, False, True]),
        torch.randn(3, dtype=torch.complex64),
        torch.randn(3, dtype=torch.complex128),
        torch.tensor(2.5),
    ],
    ids=lambda t: str(t.dtype),
)
def test_every_dtype_gives_sixteen_hex_digits_that_track_its_bits(tensor):
    text = _hex(tensor)
    assert len(text) == 16 and int(text, 16) >= 0
    assert _hex(tensor.clone()) == text
    assert _hex(torch.zeros_like(tensor)) != text


def test_an_empty_tensor_has_fingerprint_zero():
    assert _hex(torch.empty(0, 3)) == "0" * 16


def test_a_conjugate_view_is_read_as_its_values():
    z = torch.randn(4, dtype=torch.complex64)
    assert _hex(z.conj()) == _hex(z.conj().resolve_conj())


def test_big_tensors_are_reduced_in_chunks_without_changing_the_result(monkeypatch):
    from torchdebug import checksum

    x = torch.randn(1000)
    whole = _hex(x)
    monkeypatch.setattr(checksum, "_CHUNK", 7)
    assert _hex(x) == whole


@pytest.mark.gpu
def test_cuda_and_cpu_agree_on_the_same_bits():
    x = torch.randn(1 << 12, 3).bfloat16()
    assert _hex(x) == _hex(x.cuda()) and _hex(x.t()) == _hex(x.cuda().t())
