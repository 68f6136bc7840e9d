"""Statistics of a CUDA tensor in one pass, by a Triton kernel that writes one row of a device table.

``launch(tensor, table, row, scratch, scratch_row, counters)`` reduces a floating tensor whose
elements fill one dense span of memory (contiguous, or any permutation of a contiguous layout) to
``[min, max, sum, sum of squares, nan, posinf, neginf]`` (NaNs left out of the first four, as in
``stats.c``) and stores them, as float64, in ``table[row]``. Nothing is read back: the host copies
the whole table once per flush (:mod:`torchdebug.stats_table`).

One launch per tensor, of up to :data:`MAX_PROGRAMS` programs. Each program loops over its share
of the elements with BLOCK-wide float32 accumulators (float64 for float64 tensors) and, when the
float32 sum or sum of squares of its share overflowed with no infinity among the values, takes its
share again in float64 — values beyond 1e19 are rare, so the common case is one read. A single
program writes the row itself; with several, each writes its partial row to ``scratch`` and the last
one to finish (an acquire-release counter per table row) combines the partials in program order, so
the result does not depend on scheduling: the same tensor gives the same bits every run.

Triton is imported when the first CUDA tensor arrives. Under ``TRITON_INTERPRET=1`` the kernel runs
on CPU tensors too, which is how the suite checks it on machines without a GPU.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

COLUMNS = 7
"""``min, max, sum, sum of squares, nan, posinf, neginf``."""

MAX_PROGRAMS = 512
"""Programs per tensor at most (enough to keep every SM of an H100 streaming)."""

ELEMENTS_PER_PROGRAM = 1 << 15
"""Elements a program takes at least before a second program is started."""

_BLOCK = 1024

DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
"""Dtypes the kernel reads; others go through torch ops (``stats_table``)."""


@triton.jit
def _share_sums(x_ptr, start, end, blocks, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """Sums of elements ``[start, end)``, read in ``blocks`` blocks: NaN-free min, max, sum, sum of
    squares and the counts."""
    acc: tl.constexpr = tl.float64 if WIDE else tl.float32
    offsets = tl.arange(0, BLOCK)
    low = tl.full([BLOCK], float("inf"), acc)
    high = tl.full([BLOCK], float("-inf"), acc)
    total = tl.zeros([BLOCK], acc)
    squares = tl.zeros([BLOCK], acc)
    nans = tl.zeros([BLOCK], tl.int32)
    posinf = tl.zeros([BLOCK], tl.int32)
    neginf = tl.zeros([BLOCK], tl.int32)
    for block in range(0, blocks):  # a host-given count: runs on the GPU and in every interpreter
        index = start + block * BLOCK + offsets
        inside = index < end
        x = tl.load(x_ptr + index, mask=inside, other=0.0).to(acc)
        nan = x != x
        valid = inside & (x == x)
        low = tl.minimum(low, tl.where(valid, x, float("inf")))
        high = tl.maximum(high, tl.where(valid, x, float("-inf")))
        kept = tl.where(valid, x, 0.0)
        total += kept
        squares += kept * kept
        nans += (inside & nan).to(tl.int32)
        posinf += (x == float("inf")).to(tl.int32)
        neginf += (x == float("-inf")).to(tl.int32)
    return (
        tl.min(low, 0).to(tl.float64),
        tl.max(high, 0).to(tl.float64),
        tl.sum(total, 0).to(tl.float64),
        tl.sum(squares, 0).to(tl.float64),
        tl.sum(nans, 0),
        tl.sum(posinf, 0),
        tl.sum(neginf, 0),
    )


# Triton specialises integer arguments on their value (== 1, divisible by 16) and compiles a
# variant per combination; sizes and row numbers change with every tensor, so they are not.
@triton.jit(do_not_specialize=["numel", "share", "blocks", "row", "scratch_row"])
def _stats_kernel(
    x_ptr,
    table_ptr,
    scratch_ptr,
    counter_ptr,
    numel,
    share,
    blocks,
    row,
    scratch_row,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    start = pid.to(tl.int64) * share
    end = tl.minimum(start + share, numel)
    low, high, total, squares, nans, posinf, neginf = _share_sums(x_ptr, start, end, blocks, WIDE, BLOCK)
    if not WIDE:
        overflowed = (total != total) | (total == float("inf")) | (total == float("-inf")) | (squares == float("inf"))
        if overflowed & (posinf + neginf == 0) & (nans < end - start):
            low, high, total, squares, nans, posinf, neginf = _share_sums(x_ptr, start, end, blocks, True, BLOCK)
    if programs == 1:
        out = table_ptr + row * 7
    else:
        out = scratch_ptr + (scratch_row + pid) * 7
    tl.store(out + 0, low)
    tl.store(out + 1, high)
    tl.store(out + 2, total)
    tl.store(out + 3, squares)
    tl.store(out + 4, nans.to(tl.float64))
    tl.store(out + 5, posinf.to(tl.float64))
    tl.store(out + 6, neginf.to(tl.float64))
    if programs > 1:
        # The last program to finish combines the partial rows, in program order (CUDA's
        # "threadfence reduction"): a block barrier orders every thread's stores before the
        # release of the counter, and the winner's acquire and a second barrier order its loads,
        # which bypass L1 (".cg"): other SMs wrote the partial rows.
        tl.debug_barrier()
        finished = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
        if finished == programs - 1:
            tl.debug_barrier()
            part = tl.arange(0, PROGRAMS)
            present = part < programs
            rows = scratch_ptr + (scratch_row + part) * 7
            low = tl.min(tl.load(rows + 0, mask=present, other=float("inf"), cache_modifier=".cg"), 0)
            high = tl.max(tl.load(rows + 1, mask=present, other=float("-inf"), cache_modifier=".cg"), 0)
            final = table_ptr + row * 7
            tl.store(final + 0, low)
            tl.store(final + 1, high)
            for column in tl.static_range(2, 7):
                sums = tl.load(rows + column, mask=present, other=0.0, cache_modifier=".cg")
                tl.store(final + column, tl.sum(sums, 0))


def programs_for(numel: int) -> int:
    """Programs one tensor of ``numel`` elements is reduced by (scratch rows it needs when > 1)."""
    return max(1, min(MAX_PROGRAMS, -(-numel // ELEMENTS_PER_PROGRAM)))


@functools.cache
def interpreted() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``): the kernel then takes CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill one span of memory with no element twice (contiguous or
    permuted). Strides are never negative in torch, so such a span starts at ``data_ptr()`` and the
    kernel reads it as a flat array, in memory order: statistics do not depend on element order."""
    if tensor.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def launch(
    tensor: torch.Tensor,
    table: torch.Tensor,
    row: int,
    scratch: torch.Tensor,
    scratch_row: int,
    counters: torch.Tensor,
) -> None:
    """Reduce a non-empty floating ``tensor`` (:func:`is_dense`, dtype in :data:`DTYPES`) into
    ``table[row]``, using ``scratch[scratch_row : scratch_row + programs_for(numel)]`` and
    ``counters[row]`` (zero before the call) when it takes several programs. Asynchronous."""
    numel = tensor.numel()
    programs = programs_for(numel)
    share = -(-numel // programs)
    share += (-share) % _BLOCK
    _stats_kernel[(programs,)](
        tensor,
        table,
        scratch,
        counters,
        numel,
        share,
        share // _BLOCK,
        row,
        scratch_row,
        WIDE=tensor.dtype == torch.float64,
        BLOCK=_BLOCK,
        PROGRAMS=MAX_PROGRAMS,
    )
