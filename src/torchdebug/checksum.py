"""A 64-bit fingerprint of a tensor's bits (fingerprint 2): its definition and the torch-op reference.

Capture takes the fingerprint in the native pass that takes the statistics (:mod:`torchdebug.native.fused_stats`
on the CPU, :mod:`torchdebug.native.triton_stats` on CUDA); :func:`fingerprint` gives the same bits with torch ops
where those do not apply (other devices, no Triton, no C compiler, ``TORCHDEBUG_NATIVE=0``). The definition and
its collision bound: :func:`fingerprint`. What users get and how compare uses it: docs/capture.md, "Checksums";
why this hash and how the kernels take it: docs/architecture.md, "Decisions and their reasons".
"""

from __future__ import annotations

import torch

from torchdebug.native import fused_stats

__all__ = ["FINGERPRINT_VERSION", "cpu_fingerprint", "dump_fingerprint_version", "fingerprint", "hex_digits"]

FINGERPRINT_VERSION = 2
"""The definition in :func:`fingerprint`. Fingerprint 1, the one before it (splitmix64 of each element's word plus its
position times GAMMA), is what a dump without a ``"fingerprint"`` entry in its manifest holds."""


def dump_fingerprint_version(manifest: dict) -> int:
    """The fingerprint a dump's checksums follow, from a rank's ``manifest.json`` (1 where it does not say)."""
    value = manifest.get("fingerprint", 1)
    return value if isinstance(value, int) else 1


_CHUNK = 1 << 22
"""Words the reference reduces at a time (its temporaries: a few int64 vectors this long)."""


def _signed(value: int) -> int:
    """A 64-bit constant as the int64 torch multiplies by."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GAMMA = _signed(0x9E3779B97F4A7C15)
_LOW = 0xFFFFFFFF
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


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's 32-bit words in the definition's order, as a 1-d integer tensor: 1- and 2-byte
    elements as they are (widened and masked by the caller), wider ones viewed as int32 (little-endian:
    each element's low half first); a non-contiguous tensor is copied once, at its own width."""
    x = tensor.detach()
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    flat = x.reshape(-1)
    size = x.element_size()
    if size >= 4:
        return flat.view(torch.int32) if size == 4 else flat.contiguous().view(torch.int32)
    return flat.view(torch.uint8 if size == 1 else torch.int16)


def fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    """The fingerprint of ``tensor`` as a 0-d int64 tensor on its device, without synchronising.

    Definition. The tensor's bits are read as 32-bit words, in the memory order of the logical elements
    (row-major over the shape, whatever the strides: a transposed view and its contiguous copy agree, a
    view and a transpose of it do not): an element of 1 or 2 bytes is one word, its bits zero-extended;
    one of 4 bytes is one word; one of 8 bytes two and one of 16 bytes (complex128) four, low half
    first (the little-endian order of its bytes). The word at position ``p`` (counted from 0) has the key
    ``k = (p + 1) * GAMMA`` modulo 2**64 (``GAMMA = 0x9E3779B97F4A7C15``); with ``h`` the key's high 32
    bits and ``b = (its low 32 bits XOR h) | 1``, the word ``w`` contributes the 64-bit product
    ``(w XOR h) * b`` of two 32-bit numbers. The fingerprint is ``mix(S + n * GAMMA)``, where ``S`` is the
    sum of all contributions modulo 2**64, ``n`` the number of words and ``mix`` splitmix64's finaliser
    (a bijection of 64-bit words). An empty tensor's fingerprint is 0. Every step is integer arithmetic
    modulo 2**64, and a sum modulo 2**64 does not depend on the order a reduction adds in, so equal
    bits give an equal fingerprint on the CPU and on CUDA, on any number of threads or programs.

    What it guarantees, and what it does not:

    * **Any change confined to one word changes the fingerprint** — a changed element of 1, 2 or 4 bytes,
      a flipped bit anywhere, a changed half of a float64. The word's contribution moves by ``b * d``,
      where ``d`` (the change of ``w XOR h``) is not zero and above ``-2**32``, ``b`` is odd and below
      ``2**32``: a product that is neither 0 nor a multiple of 2**64. ``S`` changes, ``mix`` is a bijection.
    * **Anything else** (several words changed, two elements swapped) moves ``S`` by ``sum(b_p * d_p)``
      over the changed words, and goes unnoticed when that sum is a multiple of 2**64. The multipliers
      ``b`` are pseudo-random 32-bit numbers (the XOR of the key's two halves: a plain Weyl sequence
      such as the key's high half alone is nearly linear in the position, and changes such as +1, +1,
      -1, -1 in four neighbouring words then cancel out about once in 20 tries). Each term is below
      2**64 in size, so for changes of a few units in the last place the sum stays within a few times
      ``2**32`` of zero and must hit zero exactly: it does with a probability of about ``2**-32`` for
      changes spread at random, more often for some structured ones (a +1/-1 pair of neighbouring words
      and a -1/+1 pair 8 words further: 2 collisions in 4 * 10**7 random placements and values; +1, -2,
      +1 in three neighbours: 1 in 4 * 10**7; +1, +1, -1, -1 and sign flips: none), about ``2**-24``.
      Large changes (two swapped elements that differ much) spread the sum over all of 2**64 and
      collide far less often; two swapped elements that differ in one bit only collide when their two
      multipliers happen to be equal, about ``2**-31``. That is the bound that remains (fingerprint 1:
      about ``2**-64`` for any change). Tests check the single-word guarantee on millions of words,
      positions and changes, and a thousand swaps at many positions.
    * It is a checksum, not a cryptographic hash: a collision can be built on purpose. The dtype and
      shape are recorded beside it and compared separately.

    This reference takes a few elementwise integer kernels and one sum per chunk of ``_CHUNK`` words
    (temporaries of ``_CHUNK`` 64-bit words whatever the tensor's size; a non-contiguous tensor is
    copied once at its own width). Tests check that every native path gives its bits.
    """
    words = _words(tensor)
    mask = (1 << (8 * min(words.element_size(), 4))) - 1
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    count = words.shape[0]
    for start in range(0, count, _CHUNK):
        word = words[start : start + _CHUNK].to(torch.int64) & mask  # the word's bits, not its sign-extended value
        key = torch.arange(start + 1, start + 1 + word.shape[0], dtype=torch.int64, device=words.device) * _GAMMA
        high = _shift(key, 32)
        total = total + ((word ^ high) * (((key ^ high) & _LOW) | 1)).sum()
    return _mix(total + _signed(count * _GAMMA % (1 << 64)))


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
