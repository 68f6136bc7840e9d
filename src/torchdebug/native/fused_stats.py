"""Ctypes binding of ``stats.c``: the statistics and the fingerprint of a CPU tensor in one pass over its memory.

Handles float32, bfloat16, float64, integer (int64 to int8, uint8) and bool CPU tensors of any
layout: the kernel walks runs of contiguous elements in whatever order memory holds them (statistics
do not depend on element order), so transposes, permutes, slices and broadcasts need no copy. Other
dtypes and devices give ``None`` and the caller uses torch ops. :func:`copy_with_stats` snapshots a
tensor and takes its statistics in the same pass. :func:`stats_and_fingerprint` adds the fingerprint
of :mod:`torchdebug.checksum` to the statistics' pass, and :func:`fingerprint` takes it alone, of a
CPU tensor of any dtype (it reads bits): the walk is still in memory order, each run carrying the
logical position of its first element and the step between its elements, since the fingerprint
depends on logical order. :func:`finish_sums` finishes many records' sums into statistics, a buffer
a field (the native path's statistics column). ctypes releases the GIL during the calls. Big
contiguous tensors are split over ``torch.get_num_threads()`` threads of torch's OpenMP pool (see
``stats.c``), on whichever thread the call comes from.
"""

from __future__ import annotations

import array
import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from torchdebug.native.addresses import data_address
from torchdebug.native.build import load_library
from torchdebug.stats import COLUMNS, WIDTH

Kernel = Callable[..., int]
Buffer = np.ndarray | array.array
"""Numbers in memory: a numpy array, or the ``array`` the native observer drains into."""

MAX_DIMS = 16
"""Dimensions the kernel walks at most (after dropping size-1 dims and merging contiguous ones)."""

_SUFFIXES = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "u8",  # one byte, 0 or 1
}
"""The kernels' suffix of each dtype they take (``stats.c``)."""

_MANY_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float64: 2}
"""The dtype codes of ``td_stats_many``'s entries."""

_WORD_BYTES = (1, 2, 4, 8)
"""Element sizes the fingerprint-only kernels read (16-byte complex numbers as two 8-byte halves)."""

_Sums = ctypes.c_double * WIDTH
_Dims = [ctypes.c_int64 * n for n in range(MAX_DIMS + 1)]
_ONE = _Dims[1](1)
"""The strides of a contiguous tensor's one run."""


class _Library(NamedTuple):
    stats: dict[torch.dtype, tuple[Kernel, Kernel, Kernel]]
    """``dtype -> (stats, copy-and-stats, stats-and-fingerprint)``."""
    fingerprint: dict[int, Kernel]
    """``element size in bytes -> fingerprint kernel``."""
    pick_hashers: Kernel
    """``pick_hashers(most)``: the fingerprint's inner loops, the fastest this CPU runs (AVX-512, else
    AVX2, else portable C) with 0, the portable ones with 1, AVX2 at most with 2; the library picks
    with 0 when it loads (tests run each: they give the same bits)."""
    hashers: Callable[[], bytes]
    """``hashers()``: the name of the inner loops picked (``b"avx512"``, ``b"avx2"`` or ``b"portable"``)."""
    many: Kernel
    """``many(count, entries, threads)``: the stats kernel of ``count`` contiguous tensors in one call
    (see :func:`fused_sums_many_into`)."""
    finish: Kernel
    """``finish(count, refs, sums, slots, ndim, shape, numel, values, counts, validity, nulls)``:
    :func:`finish_sums`."""


@functools.cache
def _kernels() -> _Library | None:
    """The library's kernels, or ``None`` without the library."""
    library = load_library("stats")
    if library is None:
        return None
    columns = library.td_stats_columns
    columns.restype = ctypes.c_char_p
    if tuple(columns().decode().split(",")) != COLUMNS:  # the kernel must write the schema's columns
        raise RuntimeError(f"native/stats.c writes the columns {columns().decode()}, the schema has {','.join(COLUMNS)}")
    from torchdebug.checksum import FINGERPRINT_VERSION  # here: checksum imports this module

    version = library.td_fingerprint_version
    version.restype = ctypes.c_int
    if version() != FINGERPRINT_VERSION:  # the kernel must compute the definition checksum.py states
        raise RuntimeError(f"native/stats.c computes fingerprint {version()}, checksum.py defines {FINGERPRINT_VERSION}")
    pointer, dims, count = ctypes.c_void_p, ctypes.c_int, ctypes.c_int
    stats_kernels = {}
    for dtype, suffix in _SUFFIXES.items():
        stats = getattr(library, f"td_stats_{suffix}")
        stats.argtypes = (pointer, dims, pointer, pointer, pointer, count)
        stats.restype = ctypes.c_int
        copy = getattr(library, f"td_copy_stats_{suffix}")
        copy.argtypes = (pointer, ctypes.c_int64, pointer, pointer, count)
        copy.restype = ctypes.c_int
        both = getattr(library, f"td_stats_hash_{suffix}")
        both.argtypes = (pointer, dims, pointer, pointer, pointer, pointer, pointer, count)
        both.restype = ctypes.c_int
        stats_kernels[dtype] = (stats, copy, both)
    fingerprints = {}
    for size in _WORD_BYTES:
        kernel = getattr(library, f"td_hash_w{size}")
        kernel.argtypes = (pointer, dims, pointer, pointer, pointer, count)
        kernel.restype = ctypes.c_uint64
        fingerprints[size] = kernel
    pick_hashers = library.td_pick_hashers
    pick_hashers.argtypes = (ctypes.c_int,)
    pick_hashers.restype = None
    hashers = library.td_hashers
    hashers.restype = ctypes.c_char_p
    many = library.td_stats_many
    many.argtypes = (ctypes.c_int64, pointer, ctypes.c_int)
    many.restype = ctypes.c_int64
    finish = library.td_finish_sums
    finish.argtypes = (ctypes.c_int64, pointer, pointer, ctypes.c_int64, *(pointer,) * 7)
    finish.restype = None
    return _Library(stats_kernels, fingerprints, pick_hashers, hashers, many, finish)


def _kernel(tensor: torch.Tensor, which: int) -> Kernel | None:
    kernels = _kernels()
    found = kernels.stats.get(tensor.dtype) if kernels is not None else None
    if found is None or not tensor.is_cpu or tensor.is_neg():
        return None
    return found[which]


def available() -> bool:
    """Whether the native kernels could be built and loaded here."""
    return _kernels() is not None


def _runs(tensor: torch.Tensor) -> tuple[list[int], list[int]] | None:
    """Sizes and strides, outer to inner, that visit every element once with an innermost stride
    of 1 (dims of size 1 dropped, dims that continue each other merged, broadcast dims outermost);
    ``None`` when no such walk exists."""
    if tensor.is_contiguous():
        return [tensor.numel()], [1]
    dims = sorted(((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz != 1), key=lambda d: (d[0] != 0, -d[0]))
    sizes: list[int] = []
    strides: list[int] = []
    for stride, size in reversed(dims):  # inner to outer
        if strides and stride == strides[-1] * sizes[-1]:
            sizes[-1] *= size
        else:
            sizes.append(size)
            strides.append(stride)
    if not strides or strides[0] != 1 or len(sizes) > MAX_DIMS:
        return None
    return sizes[::-1], strides[::-1]


def _ordered_runs(tensor: torch.Tensor) -> tuple[list[int], list[int], list[int]] | None:
    """Sizes, strides and logical steps, outer to inner, that visit every element once with an
    innermost stride of 1, as :func:`_runs`, where each dimension also says how far one step along it
    moves in the row-major order of the elements (the fingerprint's positions). Dims merge only where
    they continue each other in memory and in that order; ``None`` when no such walk exists."""
    if tensor.is_contiguous():
        return [tensor.numel()], [1], [1]
    logical, step = [], 1
    for size in reversed(tensor.shape):
        logical.append(step)
        step *= size
    logical.reverse()
    dims = sorted(
        ((st, sz, lg) for sz, st, lg in zip(tensor.shape, tensor.stride(), logical) if sz != 1),
        key=lambda d: (d[0] != 0, -d[0], -d[2]),
    )
    sizes: list[int] = []
    strides: list[int] = []
    positions: list[int] = []
    for stride, size, position in reversed(dims):  # inner to outer
        if strides and stride == strides[-1] * sizes[-1] and position == positions[-1] * sizes[-1]:
            sizes[-1] *= size
        else:
            sizes.append(size)
            strides.append(stride)
            positions.append(position)
    if not strides or strides[0] != 1 or len(sizes) > MAX_DIMS:
        return None
    return sizes[::-1], strides[::-1], positions[::-1]


def _walk(tensor: torch.Tensor) -> tuple[torch.Tensor, int, ctypes.Array, ctypes.Array, ctypes.Array]:
    """``(tensor, ndim, sizes, strides, positions)`` for the kernels that take the fingerprint (the
    tensor copied to a contiguous one when its layout cannot be walked)."""
    layout = _ordered_runs(tensor)
    if layout is None:
        tensor = tensor.contiguous()
        layout = [tensor.numel()], [1], [1]
    ndim = len(layout[0])
    return (tensor, ndim, *(_Dims[ndim](*values) for values in layout))


def fused_stats(tensor: torch.Tensor) -> list[float] | None:
    """The sums vector (``torchdebug.stats._schema.COLUMNS``) of a non-empty CPU tensor (NaNs left
    out of min, max, sum and squares; min/max NaN when all are NaN), or ``None`` when the kernel does
    not apply (another dtype or device). Layouts the kernel cannot walk are copied to a contiguous tensor first."""
    out = _Sums()
    return list(out) if fused_sums_into(tensor, ctypes.addressof(out)) else None


def fused_sums_into(tensor: torch.Tensor, address: int) -> bool:
    """:func:`fused_stats`, written as ``WIDTH`` doubles at ``address`` (a row of the caller's array:
    the flight recorder's ring takes a step's statistics with no Python object per tensor); whether
    the kernel applied (nothing is written when it did not)."""
    kernel = _kernel(tensor, 0)
    if kernel is None:
        return False
    if tensor.is_contiguous():
        ndim, sizes, strides = 1, _Dims[1](tensor.numel()), _ONE
    else:
        layout = _runs(tensor)
        if layout is None:
            tensor = tensor.contiguous()
            layout = [tensor.numel()], [1]
        ndim = len(layout[0])
        sizes, strides = (_Dims[ndim](*values) for values in layout)
    kernel(tensor.data_ptr(), ndim, sizes, strides, address, torch.get_num_threads())
    return True


def fused_sums_many_into(tensors: Sequence[torch.Tensor], addresses: Sequence[int]) -> list[int]:
    """:func:`fused_sums_into` of each non-empty CPU tensor of ``tensors``, into the address of the
    same place in ``addresses``, the contiguous ones of the kernel's dtypes in one native call (one
    call through ctypes costs more than a small tensor's pass: a step's parameters and gradients
    are reduced this way); the same sums, bit for bit, as one call each. Returns the places of the
    tensors it left alone (another dtype or layout: nothing written for them)."""
    kernels = _kernels()
    if kernels is None:
        return list(range(len(tensors)))
    entries: list[int] = []
    left = []
    codes = _MANY_CODES
    for place, (tensor, address) in enumerate(zip(tensors, addresses)):
        code = codes.get(tensor.dtype)
        if code is None or not tensor.is_contiguous() or tensor.is_neg() or not tensor.is_cpu:
            left.append(place)
        else:
            entries += (tensor.data_ptr(), code, tensor.numel(), address)
    if entries:
        packed = array.array("q", entries)
        kernels.many(len(entries) // 4, packed.buffer_info()[0], torch.get_num_threads())
    return left


def many_kernel_address() -> int | None:
    """The address of the library's ``td_stats_many`` (see :func:`fused_sums_many_into`), for native
    code that reduces tensors with the same kernel, or ``None`` without the library."""
    kernels = _kernels()
    return None if kernels is None else ctypes.cast(kernels.many, ctypes.c_void_p).value


class FinishedStats(NamedTuple):
    """The statistics of many records, finished from their sums as :func:`torchdebug.stats.stats_from_sums`
    finishes one (:func:`finish_sums`), by field: what an Arrow struct column of them is made of."""

    values: np.ndarray
    """``float64[4, records]``: min, max, mean and norm (0 for a record without sums)."""
    counts: np.ndarray
    """``int64[4, records]``: the NaN, +Inf, -Inf and zero counts."""
    validity: np.ndarray
    """``uint8[3, bytes]``: Arrow validity bitmaps of the records with sums, of those with a non-NaN
    element too (min, max, norm), and of those whose mean is not NaN as well (mean)."""
    nulls: np.ndarray
    """``int64[3]``: the records each bitmap leaves out."""


def finish_sums(refs: np.ndarray, sums: Buffer, ndim: Buffer, shape: Buffer) -> FinishedStats:
    """The statistics of records whose sums are rows of ``sums`` (``WIDTH`` doubles a row, as the
    native observer drains them): record ``i`` takes row ``refs[i]`` (none where < 0), whose tensor
    has ``ndim[row]`` sizes, concatenated in ``shape``. One pass in C, no Python a record or field;
    raises ``RuntimeError`` without the library."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("native/stats.c cannot be built here: no statistics to finish")
    refs = np.ascontiguousarray(refs, np.int64)
    sums, ndim, shape = np.asarray(sums, np.float64), np.asarray(ndim, np.int8), np.asarray(shape, np.int64)
    count, rows = len(refs), len(ndim)
    if len(sums) < rows * WIDTH or len(shape) < ndim.sum(dtype=np.int64) or (count and refs.max() >= rows):
        raise ValueError(f"finish_sums: {rows} rows of sums, sizes or references that do not fit them")
    done = FinishedStats(
        np.empty((4, count)), np.empty((4, count), np.int64), np.empty((3, (count + 7) // 8), np.uint8), np.empty(3, np.int64)
    )
    numel = np.empty(rows, np.int64)
    arrays = (refs, sums, rows, ndim, shape, numel, *done)
    kernels.finish(count, *(value if isinstance(value, int) else data_address(value) for value in arrays))
    return done


def stats_and_fingerprint(tensor: torch.Tensor) -> tuple[list[float], int] | None:
    """:func:`fused_stats` of a non-empty CPU tensor and its fingerprint (as
    :func:`torchdebug.checksum.fingerprint` defines it, an unsigned 64-bit int), in one pass; ``None``
    when the kernel does not apply."""
    kernel = _kernel(tensor, 2)
    if kernel is None or tensor.numel() == 0:
        return None
    tensor, ndim, sizes, strides, positions = _walk(tensor)
    out = _Sums()
    value = ctypes.c_uint64()
    kernel(tensor.data_ptr(), ndim, sizes, strides, positions, out, ctypes.byref(value), torch.get_num_threads())
    return list(out), value.value


def fingerprint(tensor: torch.Tensor) -> int | None:
    """The fingerprint of a CPU tensor of any dtype (:mod:`torchdebug.checksum`), an unsigned 64-bit
    int, from one pass over its bits; ``None`` when the kernel does not apply (no library, another
    device, a layout other than strided)."""
    kernels = _kernels()
    if kernels is None or not tensor.is_cpu or tensor.layout != torch.strided:
        return None
    x = tensor.detach()
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()  # the values, as the reference reads them
    if x.numel() == 0:
        return 0
    if x.element_size() == 16:  # complex128: two 8-byte halves an element, real first (four words)
        x = torch.view_as_real(x)
    kernel = kernels.fingerprint.get(x.element_size())
    if kernel is None:
        return None
    x, ndim, sizes, strides, positions = _walk(x)
    return kernel(x.data_ptr(), ndim, sizes, strides, positions, torch.get_num_threads())


def copy_with_stats(tensor: torch.Tensor, address: int) -> list[float] | None:
    """Copy a contiguous CPU tensor's bytes to memory at ``address`` and return its statistics as
    :func:`fused_stats` does, in one pass; ``None`` (nothing copied) when the kernel does not apply."""
    kernel = _kernel(tensor, 1)
    if kernel is None or not tensor.is_contiguous():
        return None
    out = _Sums()
    kernel(tensor.data_ptr(), tensor.numel(), address, out, torch.get_num_threads())
    return list(out)
