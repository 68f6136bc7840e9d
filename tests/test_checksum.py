"""The 64-bit tensor fingerprint: bits in logical order, any dtype, same on every device and on every
path (the torch-op reference, the native pass, the definition written out in Python); a changed word
always changes it."""

import re

import numpy as np
import pytest
import torch

from torchdebug.checksum import FINGERPRINT_VERSION, cpu_fingerprint, fingerprint, hex_digits
from torchdebug.native import fused_stats

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15

PINNED_INT32 = "a9901ea5df21faba"
"""``torch.arange(4, dtype=torch.int32)``, fingerprint 2 (written down when it was defined)."""

PINNED_FLOAT32 = "36aed72e79aa0de0"
"""``torch.tensor([1.0, -0.0, 3.5])``, likewise."""

PINNED_FLOAT64 = "48d5d6f90c26e776"
"""``torch.arange(3, dtype=torch.float64)``: two words an element, likewise."""


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _contribution(word: int, position: int) -> int:
    """Word ``word`` at word position ``position`` (from 0), as checksum.py's docstring defines it."""
    key = ((position + 1) * _GAMMA) & _MASK
    high = key >> 32
    return (word ^ high) * ((key & 0xFFFFFFFF ^ high) | 1)


def _as_documented(tensor: torch.Tensor) -> int:
    """The definition in checksum.py's docstring, in plain Python: the 32-bit words of the elements in
    row-major order (1- and 2-byte elements widened, 8- and 16-byte ones cut into 2 and 4 words, low
    half first), each word's contribution summed modulo 2**64, then mixed with the word count."""
    x = tensor.resolve_conj().resolve_neg().contiguous()
    data = x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""
    size = min(x.element_size(), 4)
    words = [int.from_bytes(data[k : k + size], "little") for k in range(0, len(data), size)]
    total = sum(_contribution(w, p) for p, w in enumerate(words))
    return _mix((total + len(words) * _GAMMA) & _MASK)


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
    """Values written down once: a change of the definition (a constant, the word order, the
    positions) breaks comparisons with dumps taken before it, and must come with a new
    FINGERPRINT_VERSION (dumps record it; compare does not set fingerprints of two versions side by side)."""
    assert FINGERPRINT_VERSION == 2
    assert hex_digits(_as_documented(torch.arange(4, dtype=torch.int32))) == _hex(torch.arange(4, dtype=torch.int32))
    assert _hex(torch.arange(4, dtype=torch.int32)) == PINNED_INT32
    assert _hex(torch.tensor([1.0, -0.0, 3.5])) == PINNED_FLOAT32
    assert _hex(torch.arange(3, dtype=torch.float64)) == PINNED_FLOAT64


# -- the properties the docstring states ------------------------------------------------------------------
def _contributions(words: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """:func:`_contribution` of many words at once (uint64 arithmetic wraps modulo 2**64)."""
    key = (positions.astype(np.uint64) + np.uint64(1)) * np.uint64(_GAMMA)
    high = key >> np.uint64(32)
    multiplier = ((key & np.uint64(0xFFFFFFFF)) ^ high) | np.uint64(1)
    return (words.astype(np.uint64) ^ high) * multiplier


def test_a_changed_word_always_changes_its_contribution():
    """The contribution is injective in the word at every position: (w ^ h) * b with b odd, and the
    32 x 32-bit product never wraps. Checked on millions of random words, positions and changes (every
    single-bit flip included, positions near 2**32 and 2**63 included), so one changed word, whatever
    its position and the rest of the tensor, changes the sum modulo 2**64 and so the fingerprint."""
    generator = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        count = 1 << 20
        positions = np.concatenate(
            [
                generator.integers(0, 1 << 24, count // 2, dtype=np.uint64),
                generator.integers(0, 1 << 63, count // 4, dtype=np.uint64),
                (1 << 32) - 8 + generator.integers(0, 16, count // 4, dtype=np.uint64),
            ]
        )
        words = generator.integers(0, 1 << 32, count, dtype=np.uint64)
        before = _contributions(words, positions)
        for bit in range(32):
            assert np.all(_contributions(words ^ np.uint64(1 << bit), positions) != before), bit
        other = generator.integers(0, 1 << 32, count, dtype=np.uint64)
        changed = other != words
        assert np.all(_contributions(other, positions)[changed] != before[changed])


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int64, torch.bool, torch.complex64]
)
def test_one_changed_element_changes_every_paths_fingerprint(dtype):
    """A tensor and copies of it with one element changed (a bit flip, at many positions, the first
    and last included): every copy's fingerprint differs from the tensor's, on every path."""
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(5_003, generator=generator) * 100).to(dtype)
    bits = x.view(torch.uint8) if dtype == torch.bool else x.view(torch.int8 if x.element_size() == 1 else torch.int16)
    per_element = x.element_size() if dtype != torch.bool else 1
    prints = {cpu_fingerprint(x), int(fingerprint(x)) & _MASK}
    assert len(prints) == 1
    for index in [0, 1, 2, 7, 8, 15, 16, 63, 64, 1000, 4095, 4096, 5_001, 5_002]:
        y = x.clone()
        flat = y.view(torch.uint8) if dtype == torch.bool else y.view(bits.dtype)
        if dtype == torch.bool:
            flat[index] ^= 1
        else:
            flat[index * per_element // bits.element_size() + index % 2 * (per_element > 2)] ^= 1 << 3
        assert not torch.equal(y.view(torch.uint8), x.view(torch.uint8))
        assert cpu_fingerprint(y) not in prints, index
        assert int(fingerprint(y)) & _MASK not in prints, index


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.float64])
def test_swapping_two_elements_changes_the_fingerprint_at_many_positions(dtype):
    """Two different elements swapped, at a thousand pairs of positions (adjacent, a block apart, far
    apart): every swap changes the fingerprint (which the definition makes likely, 1 - 2**-31 or so
    each, not certain: the docstring says so)."""
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(9_000, generator=generator) * 50).to(dtype)
    base = cpu_fingerprint(x)
    pairs = torch.randint(0, 9_000, (1_000, 2), generator=generator).tolist()
    pairs += [[i, i + 1] for i in range(0, 64)] + [[i, i + 4096] for i in range(0, 64)]
    swaps = 0
    for i, j in pairs:
        if x[i].view(-1).view(torch.uint8).tolist() == x[j].view(-1).view(torch.uint8).tolist():
            continue
        y = x.clone()
        y[[i, j]] = x[[j, i]]
        assert cpu_fingerprint(y) != base, (i, j)
        swaps += 1
    assert swaps > 1_000


def test_cpu_fingerprint_falls_back_to_the_reference_without_the_kernel(monkeypatch):
    monkeypatch.setattr(fused_stats, "_kernels", lambda: None)
    x = torch.randn(70_000).t()
    assert fused_stats.fingerprint(x) is None
    assert cpu_fingerprint(x) == int(fingerprint(x)) & _MASK
