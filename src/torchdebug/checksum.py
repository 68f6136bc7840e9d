"""A 64-bit fingerprint of a tensor's bytes: its definition, and the torch-op reference that computes it.

Each element's bits are read as an unsigned integer of the element's width (two 64-bit words for
128-bit complex numbers), in the memory order of the logical elements (row-major over the shape,
whatever the strides: a transposed view and its contiguous copy agree, a view and a transpose of
it do not). Word ``w`` at position ``i`` (counted from 1) contributes
``mix(w + i * 0x9E3779B97F4A7C15)``, where ``mix`` is splitmix64's finaliser; the fingerprint is
``mix`` of the sum of all contributions modulo 2**64. Every step is integer arithmetic modulo 2**64
(int64 products and sums wrap on every backend torch has), and a sum modulo 2**64 does not depend on
the order a reduction adds in, so equal bits give an equal fingerprint on the CPU and on CUDA.

Collisions: ``mix`` is a bijection of 64-bit words with full avalanche, and the position is added
before it, so a changed element or two swapped elements change their contributions like
independent random 64-bit values; two different tensors then share a fingerprint with probability
about 2**-64. It is a checksum, not a cryptographic hash: a collision can be built on purpose. The
dtype and shape are recorded beside it and compared separately (an empty tensor's fingerprint is 0).

Cost: capture takes the fingerprint in the native single pass that takes the statistics, reading
each element once for both: on the CPU the C kernel (:mod:`torchdebug.native.fused_stats`; any
layout walked in memory order without a copy, each run knowing its elements' logical positions;
each block hashed while it is in L1, by a hand-written AVX2 loop where the CPU has one; big
contiguous tensors split over torch's OpenMP threads, whose partial sums add up modulo 2**64 in any
order), on CUDA the Triton kernel (:mod:`torchdebug.native.triton_stats`; several programs per
tensor whose partial sums the last one adds up, the 64 bits stored in an int64 column of the
statistics table and read with it once per flush, no host synchronisation; a non-contiguous tensor
is copied to a contiguous one first). A checksum-only capture runs the same pass without the
statistics, over the tensor's bits as integers of its width, so it takes every dtype. The hash is
arithmetic, two 64-bit products an element: 0.55-0.58 ns an element on one AVX2 core of the bench
machine (bench/history/2026-11.md, issue 22), seven times the statistics' 0.08 ns.
:func:`fingerprint` below, the reference, computes the same value with about a dozen elementwise
integer torch kernels and one sum per chunk of ``_CHUNK`` elements (temporaries below ``_CHUNK``
64-bit words whatever the tensor's size; a non-contiguous tensor copied once at its own width),
returning a 0-d int64 tensor on the tensor's device without synchronising; capture uses it where
the kernels do not apply (other devices, no Triton, no C compiler, ``TORCHDEBUG_NATIVE=0``).
Tests check that every path gives its bits.
"""

from __future__ import annotations

import torch

from torchdebug.native import fused_stats

__all__ = ["cpu_fingerprint", "fingerprint", "hex_digits"]

_WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The integer dtype each element is read as, by element size in bytes."""

_CHUNK = 1 << 22


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch multiplies by."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, modulo 2**64 on int64 words."""
    z = (z ^ _shift(z, 30)) * _M1
    z = (z ^ _shift(z, 27)) * _M2
    return z ^ _shift(z, 31)


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """The fingerprint of ``tensor`` (see the module docstring) as a 0-d int64 tensor on its device."""
    x = tensor.detach()
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    size = x.element_size()
    if size > 8:  # complex128: two 64-bit words per element
        x = x.contiguous().view(torch.int64)
        size = 8
    words = x.view(_WORD[size]).reshape(-1)
    mask = (1 << (8 * size)) - 1
    total = torch.zeros((), dtype=torch.int64, device=x.device)
    count = words.shape[0]
    for start in range(0, count, _CHUNK):
        chunk = words[start : start + _CHUNK].to(torch.int64)
        if size in (2, 4):
            chunk = chunk & mask  # the element's bits, not its sign-extended value
        position = torch.arange(start + 1, start + 1 + chunk.shape[0], dtype=torch.int64, device=x.device)
        total = total + _mix(chunk + position * _GAMMA).sum()
    return _mix(total)


def cpu_fingerprint(tensor: torch.Tensor) -> int:
    """The fingerprint of a CPU tensor as an unsigned 64-bit int, now: one pass of the native kernel,
    or :func:`fingerprint` where it does not apply."""
    value = fused_stats.fingerprint(tensor)
    if value is None:
        value = int(fingerprint(tensor))
    return value & 0xFFFFFFFFFFFFFFFF


def hex_digits(value: int) -> str:
    """A fingerprint read back from the device as the records store it: 16 lowercase hex digits."""
    return f"{value & 0xFFFFFFFFFFFFFFFF:016x}"
