"""The 64-bit tensor fingerprint: bits in logical order, any dtype, same on every device and on every
path (the torch-op reference, the native pass, the definition written out in Python)."""

import re

import pytest
import torch

from torchdebug.checksum import cpu_fingerprint, fingerprint, hex_digits
from torchdebug.native import fused_stats

_MASK = (1 << 64) - 1

PINNED_INT32 = "e2d285e2eb473ef9"
"""``torch.arange(4, dtype=torch.int32)``, computed by the torch-op reference before the native paths existed."""

PINNED_FLOAT32 = "013d929f1bd4f111"
"""``torch.tensor([1.0, -0.0, 3.5])``, likewise."""


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _as_documented(tensor: torch.Tensor) -> int:
    """The definition in checksum.py's docstring, in plain Python: each element's bits as an unsigned
    word of its width (two 64-bit words for 128-bit complex), in row-major order."""
    x = tensor.resolve_conj().resolve_neg().contiguous()
    data = x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""
    size = min(x.element_size(), 8)
    words = [int.from_bytes(data[k : k + size], "little") for k in range(0, len(data), size)]
    return _mix(sum(_mix((w + i * 0x9E3779B97F4A7C15) & _MASK) for i, w in enumerate(words, start=1)) & _MASK)


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
    assert re.fullmatch(r"[0-9a-f]{16}", text)
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


_DTYPE_CASES = [
    torch.randn(40).bfloat16(),
    torch.randn(33).half(),
    torch.randn(17),
    torch.randn(5, 7, dtype=torch.float64).t(),
    torch.arange(-50, 50, dtype=torch.int8),
    torch.arange(0, 200, dtype=torch.uint8),
    torch.arange(-500, 500, 9, dtype=torch.int16),
    torch.arange(-(2**31), 2**31 - 1, 2**25, dtype=torch.int32),
    torch.arange(-5, 40) * (2**57),
    torch.tensor([True, False, True] * 9),
    torch.randn(19, dtype=torch.complex64),
    torch.randn(3, 6, dtype=torch.complex128).t(),
    torch.randn(6, dtype=torch.complex64).conj(),
    torch.tensor(2.5),
    torch.empty(0, 4),
]


@pytest.mark.parametrize("tensor", _DTYPE_CASES, ids=lambda t: f"{t.dtype}{list(t.shape)}")
def test_every_path_computes_the_documented_definition(tensor):
    want = _as_documented(tensor)
    assert int(fingerprint(tensor)) & _MASK == want  # the torch-op reference
    assert cpu_fingerprint(tensor) == want  # the native pass where it is built, else the reference
    if fused_stats.available():
        assert fused_stats.fingerprint(tensor) == want


def test_the_definition_is_pinned():
    """Two values written down once: a change of the definition (a constant, the word order, the
    positions) breaks comparisons with dumps taken before it."""
    assert hex_digits(_as_documented(torch.arange(4, dtype=torch.int32))) == _hex(torch.arange(4, dtype=torch.int32))
    assert _hex(torch.arange(4, dtype=torch.int32)) == PINNED_INT32
    assert _hex(torch.tensor([1.0, -0.0, 3.5])) == PINNED_FLOAT32


def test_cpu_fingerprint_falls_back_to_the_reference_without_the_kernel(monkeypatch):
    monkeypatch.setattr(fused_stats, "_kernels", lambda: None)
    x = torch.randn(70_000).t()
    assert fused_stats.fingerprint(x) is None
    assert cpu_fingerprint(x) == int(fingerprint(x)) & _MASK
