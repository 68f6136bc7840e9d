"""Statistics of CUDA tensors in one pass each, by a Triton kernel that writes rows of a device table.

:func:`launch` reduces tensors of one dtype to the sums vector of :mod:`torchdebug.stats._schema`
(:data:`COLUMNS`) and, when asked, their fingerprint (:mod:`torchdebug.checksum`), into rows of a
device table the host copies once per flush (:mod:`torchdebug.stats_table`); nothing is read back.
Why a kernel, and how it reads, combines programs' partial rows and takes many tensors a launch:
docs/architecture.md, "Decisions and their reasons" ("A Triton kernel for CUDA statistics"). Triton
is imported when the first CUDA tensor arrives; under ``TRITON_INTERPRET=1`` the kernel runs on CPU
tensors too, which is how the suite checks it on machines without a GPU.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from torchdebug import stats as schema

COLUMNS = ("min", "max", "sum", "squares", "nan", "posinf", "neginf", "zeros")
"""The columns the kernel writes, in order: :func:`_share_sums` returns them (and the fingerprint's
sum), the stores write them; checked against the schema on import."""

if COLUMNS != schema.COLUMNS:
    raise ImportError(f"triton_stats writes the columns {COLUMNS}, the schema has {schema.COLUMNS}")

_WIDTH: tl.constexpr = tl.constexpr(schema.WIDTH)

MAX_PROGRAMS = 1024
"""Programs per tensor at most: with :data:`ELEMENTS_PER_PROGRAM`, the grid that read 100 M float32
elements fastest on an H200 (0.89x torch.sum's pace against 0.74x with 512 programs of 32,768;
``bench/stats_pass.py --grid``, ``bench/RESULTS.md``); more programs lose to the combine's rows."""

ELEMENTS_PER_PROGRAM = 1 << 14
"""Elements a program takes at least before a second program is started."""

_BLOCK = 1024

WARPS = 4
"""Warps a program runs (Triton's default, stated so that ``bench/triton_occupancy.py`` can show
what it costs in registers and resident programs)."""

FP_FUSION = True
"""Fused multiply-adds in the sums (each square rounds once with its addition). Stated because
Triton 3.9 warns that its default turns to off in 3.10: the kernel's results and speed must not
change with the Triton a user has, and every figure in ``bench/RESULTS.md`` was taken with them on."""

STAGES = 1
"""Stages of Triton's software pipeline over a program's whole blocks (``tl.range(num_stages=)``:
above 1, the loads of later blocks are issued, as asynchronous copies into shared memory, while
earlier ones are reduced). 1, the plain loop, is what every figure so far was measured with;
``bench/stats_pass.py --stages`` times others on CUDA (a big tensor's programs keep few bytes in
flight per SM, and the fingerprint's instructions between the loads show in its pace)."""

SLOTS = 4
"""Tensors one launch passes as arguments at most (an op's new inputs or outputs of one dtype: a
linear's weight and bias)."""

TENSORS_PER_LAUNCH = 1024
"""Tensors one launch reduces at most. More than :data:`SLOTS` (a step's gradients or parameters, a
foreach op's lists) are listed in a directory on the device, which the launch fills from pinned
host memory: one launch, and one small copy, instead of a launch per :data:`SLOTS` tensors (on the
H100, a launch of one tensor cost the host 45.6 µs: ``bench/RESULTS.md``)."""

DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
"""Dtypes the kernel takes statistics of; others go through torch ops (``stats_table``)."""

WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The dtype a tensor is viewed as to take its fingerprint alone, by element size in bytes."""

_GAMMA: tl.constexpr = tl.constexpr(0x9E3779B97F4A7C15)
_MIX1: tl.constexpr = tl.constexpr(0xBF58476D1CE4E5B9)
_MIX2: tl.constexpr = tl.constexpr(0x94D049BB133111EB)


@triton.jit
def _mix(z):
    """splitmix64's finaliser on uint64 values (products wrap modulo 2**64, shifts are logical)."""
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


@triton.jit
def _contribution(w, key):
    """The fingerprint's contribution of 32-bit words ``w`` (uint32) keyed by ``key`` (uint64: the
    word position plus one, times GAMMA): ``(w ^ h) * ((low ^ h) | 1)`` with ``h`` the key's high
    half, a 32 x 32 -> 64-bit product (one ``mul.wide.u32``)."""
    high = (key >> 32).to(tl.uint32)
    multiplier = (key.to(tl.uint32) ^ high) | 1
    word = w ^ high
    # the product's halves from two 32-bit multiplies: written as one 64-bit product of zero-extended
    # words, LLVM folds the extensions into the XOR and emits an emulated 64 x 64-bit multiply instead
    low = word * multiplier  # modulo 2**32
    return (tl.umulhi(word, multiplier).to(tl.uint64) << 32) | low.to(tl.uint64)


@triton.jit
def _element_sums(x, key, BITS: tl.constexpr):
    """The contributions of elements ``x`` of BITS bits whose first words are keyed ``key``: one
    word each, zero-extended, for 8, 16 and 32 bits; two for 64 (the low half first, the high one
    keyed GAMMA after it)."""
    if BITS == 8:
        return _contribution(x.to(tl.uint8, bitcast=True).to(tl.uint32), key)
    elif BITS == 16:
        return _contribution(x.to(tl.uint16, bitcast=True).to(tl.uint32), key)
    elif BITS == 32:
        return _contribution(x.to(tl.uint32, bitcast=True), key)
    else:
        w = x.to(tl.uint64, bitcast=True)
        return _contribution(w.to(tl.uint32), key) + _contribution((w >> 32).to(tl.uint32), key + _GAMMA)


@triton.jit
def _fingerprint(total, numel, BITS: tl.constexpr):
    """The fingerprint of a tensor of ``numel`` elements of BITS bits from the sum of its
    contributions (modulo 2**64): ``mix(total + words * GAMMA)``, as an int64."""
    WORDS: tl.constexpr = 2 if BITS == 64 else 1
    words = numel.to(tl.uint64) * WORDS
    return _mix(total + words * _GAMMA).to(tl.int64, bitcast=True)


@triton.jit
def _add_block(x, inside, low, high, total, squares, nans, posinf, neginf, zeros):
    """The running sums of :func:`_share_sums` with one block of values added: ``x`` holds the block
    as rows of 16 bytes (``inside``: which lanes hold a value), each row is reduced at once into
    the sums, one per row."""
    nan = x != x
    valid = inside & (x == x)
    low = tl.minimum(low, tl.min(tl.where(valid, x, float("inf")), 1))
    high = tl.maximum(high, tl.max(tl.where(valid, x, float("-inf")), 1))
    kept = tl.where(valid, x, 0.0)
    total += tl.sum(kept, 1)
    squares += tl.sum(kept * kept, 1)
    nans += tl.sum((inside & nan).to(tl.int32), 1)
    posinf += tl.sum((x == float("inf")).to(tl.int32), 1)
    neginf += tl.sum((x == float("-inf")).to(tl.int32), 1)
    zeros += tl.sum((inside & (x == 0)).to(tl.int32), 1)  # masked lanes load 0
    return low, high, total, squares, nans, posinf, neginf, zeros


@triton.jit
def _share_sums(
    x_ptr,
    start,
    end,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    STATS: tl.constexpr,
    HASH: tl.constexpr,
    BITS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Sums of elements ``[start, end)`` (``start`` a multiple of BLOCK): NaN-free min, max, sum,
    sum of squares and the counts (STATS), and the sum of the fingerprint's contributions modulo
    2**64 (HASH; element ``i`` is at position ``i + 1``). A block is read as BLOCK / ROW rows of
    ROW elements, 16 bytes, one vector load each, and each row is reduced as soon as it is read:
    the running sums are one per row, not one per element, so a program holds few registers and
    an SM keeps many programs' loads in flight (float32 statistics on sm_90: 48 registers a thread,
    against 152 with BLOCK-wide sums; ``bench/triton_occupancy.py``). NaNs are left out of min, max,
    sum and squares, as in ``stats.c``. Whole blocks are
    read without a mask, so that loads from an aligned tensor are vectorised; the rest, if any, is
    one masked block."""
    acc: tl.constexpr = tl.float64 if WIDE else tl.float32
    ROW: tl.constexpr = 128 // BITS
    ROWS: tl.constexpr = BLOCK // ROW
    offsets = tl.arange(0, ROWS)[:, None] * ROW + tl.arange(0, ROW)[None, :]
    low = tl.full([ROWS], float("inf"), acc)
    high = tl.full([ROWS], float("-inf"), acc)
    total = tl.zeros([ROWS], acc)
    squares = tl.zeros([ROWS], acc)
    nans = tl.zeros([ROWS], tl.int32)
    posinf = tl.zeros([ROWS], tl.int32)
    neginf = tl.zeros([ROWS], tl.int32)
    zeros = tl.zeros([ROWS], tl.int32)
    hashes = tl.zeros([ROWS], tl.uint64)
    WORDS: tl.constexpr = 2 if BITS == 64 else 1  # 32-bit words an element
    keys = ((start + offsets) * WORDS + 1).to(tl.uint64) * _GAMMA  # each first word's key, advanced per block
    advance = tl.full([], BLOCK * WORDS, tl.uint64) * _GAMMA
    everywhere = offsets >= 0
    length = tl.maximum(end - start, 0)  # a program past the end of a small tensor reads nothing
    whole = length // BLOCK
    for block in tl.range(0, whole, num_stages=STAGES):  # STAGES > 1: Triton's software pipeline
        index = tl.multiple_of(start + block * BLOCK, BLOCK) + offsets
        raw = tl.load(x_ptr + index)
        if STATS:
            low, high, total, squares, nans, posinf, neginf, zeros = _add_block(
                raw.to(acc), everywhere, low, high, total, squares, nans, posinf, neginf, zeros
            )
        if HASH:
            hashes += tl.sum(_element_sums(raw, keys, BITS), 1)
            keys += advance
    for block in range(whole, tl.cdiv(length, BLOCK)):  # the rest: none or one block
        index = start + block * BLOCK + offsets
        inside = index < end
        raw = tl.load(x_ptr + index, mask=inside, other=0)
        if STATS:
            low, high, total, squares, nans, posinf, neginf, zeros = _add_block(
                raw.to(acc), inside, low, high, total, squares, nans, posinf, neginf, zeros
            )
        if HASH:
            hashes += tl.sum(tl.where(inside, _element_sums(raw, keys, BITS), tl.zeros_like(keys)), 1)
    return (
        tl.min(low, 0).to(tl.float64),
        tl.max(high, 0).to(tl.float64),
        tl.sum(total, 0).to(tl.float64),
        tl.sum(squares, 0).to(tl.float64),
        tl.sum(nans, 0),
        tl.sum(posinf, 0),
        tl.sum(neginf, 0),
        tl.sum(zeros, 0),
        tl.sum(hashes, 0),
    )


@triton.jit
def _reduce_tensor(
    pid,
    x_ptr,
    numel,
    first,
    after,
    slot,
    table_ptr,
    scratch_ptr,
    counter_ptr,
    fingerprint_ptr,
    scratch_fingerprint_ptr,
    row,
    scratch_row,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    PROGRAMS: tl.constexpr,
    STATS: tl.constexpr,
    HASH: tl.constexpr,
    BITS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Program ``pid``'s share of the tensor at ``x_ptr`` (``numel`` elements, reduced by programs
    ``[first, after)``) into table row ``row + slot``: written there directly by a lone program, else
    as a partial row in scratch, which the tensor's last program to finish combines.

    When the float32 sum or sum of squares of its share overflowed with no infinity among the values,
    a program takes its share again in float64: values beyond 1e19 are rare, so the common case is one
    read. That retake walks blocks a quarter as wide, because a thread's registers are those of the
    kernel's widest path, the rare one included."""
    programs = after - first
    share = tl.cdiv(tl.cdiv(numel, programs), BLOCK) * BLOCK
    start = (pid - first) * share
    end = tl.minimum(start + share, numel)
    low, high, total, squares, nans, posinf, neginf, zeros, hashed = _share_sums(
        x_ptr, start, end, WIDE, BLOCK, STATS, HASH, BITS, STAGES
    )
    if STATS and not WIDE:
        overflowed = (total != total) | (total == float("inf")) | (total == float("-inf")) | (squares == float("inf"))
        if overflowed & (posinf + neginf == 0) & (nans < end - start):
            low, high, total, squares, nans, posinf, neginf, zeros, _ = _share_sums(  # narrower: the docstring says why
                x_ptr, start, end, True, BLOCK // 4, True, False, BITS, 1
            )
    final = table_ptr + (row + slot) * _WIDTH
    if STATS:
        if programs == 1:
            out = final
        else:
            out = scratch_ptr + (scratch_row + pid) * _WIDTH
        tl.store(out + 0, low)
        tl.store(out + 1, high)
        tl.store(out + 2, total)
        tl.store(out + 3, squares)
        tl.store(out + 4, nans.to(tl.float64))
        tl.store(out + 5, posinf.to(tl.float64))
        tl.store(out + 6, neginf.to(tl.float64))
        tl.store(out + 7, zeros.to(tl.float64))
    if HASH:
        if programs == 1:
            tl.store(fingerprint_ptr + row + slot, _fingerprint(hashed, numel, BITS))
        else:
            tl.store(scratch_fingerprint_ptr + scratch_row + pid, hashed.to(tl.int64, bitcast=True))
    if programs > 1:
        # The last program of the tensor to finish combines its partial rows, in program order
        # (CUDA's "threadfence reduction"): a block barrier orders every thread's stores before the
        # release of the counter, and the winner's acquire and a second barrier order its loads,
        # which bypass L1 (".cg"): other SMs wrote the partial rows.
        tl.debug_barrier()
        finished = tl.atomic_add(counter_ptr + row + slot, 1, sem="acq_rel")
        if finished == programs - 1:
            tl.debug_barrier()
            part = tl.arange(0, PROGRAMS)
            present = part < programs
            if STATS:
                rows = scratch_ptr + (scratch_row + first + part) * _WIDTH
                low = tl.min(tl.load(rows + 0, mask=present, other=float("inf"), cache_modifier=".cg"), 0)
                high = tl.max(tl.load(rows + 1, mask=present, other=float("-inf"), cache_modifier=".cg"), 0)
                tl.store(final + 0, low)
                tl.store(final + 1, high)
                for column in tl.static_range(2, _WIDTH):  # sums and counts add up
                    sums = tl.load(rows + column, mask=present, other=0.0, cache_modifier=".cg")
                    tl.store(final + column, tl.sum(sums, 0))
            if HASH:
                partial = scratch_fingerprint_ptr + scratch_row + first + part
                hashes = tl.load(partial, mask=present, other=0, cache_modifier=".cg").to(tl.uint64, bitcast=True)
                tl.store(fingerprint_ptr + row + slot, _fingerprint(tl.sum(hashes, 0), numel, BITS))
            tl.store(counter_ptr + row + slot, 0)  # zero again for the table's next use: no program reads it now


# Triton specialises integer arguments on their value (== 1, divisible by 16) and compiles a
# variant per combination; sizes and row numbers change with every launch, so they are not.
@triton.jit(do_not_specialize=["n0", "n1", "n2", "n3", "first1", "first2", "first3", "row", "scratch_row"])
def _stats_kernel(
    x0,
    x1,
    x2,
    x3,
    n0,
    n1,
    n2,
    n3,
    first1,
    first2,
    first3,
    table_ptr,
    scratch_ptr,
    counter_ptr,
    fingerprint_ptr,
    scratch_fingerprint_ptr,
    row,
    scratch_row,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    PROGRAMS: tl.constexpr,
    STATS: tl.constexpr,
    HASH: tl.constexpr,
    BITS: tl.constexpr,
    STAGES: tl.constexpr,
):
    # Up to four tensors of one dtype, passed as arguments: programs [first_k, first_k+1) reduce
    # tensor k into table row ``row + k``; a slot left unused starts at the grid's end, so no program
    # takes it.
    pid = tl.program_id(0)
    x_ptr = x0
    numel = n0.to(tl.int64)
    first = pid.to(tl.int64) * 0
    after = first1.to(tl.int64)
    slot = pid * 0
    if pid >= first1:
        x_ptr, numel, first, after, slot = x1, n1.to(tl.int64), first1.to(tl.int64), first2.to(tl.int64), slot + 1
    if pid >= first2:
        x_ptr, numel, first, after, slot = x2, n2.to(tl.int64), first2.to(tl.int64), first3.to(tl.int64), slot + 1
    if pid >= first3:
        x_ptr, numel, first, slot = x3, n3.to(tl.int64), first3.to(tl.int64), slot + 1
        after = tl.num_programs(0).to(tl.int64)
    _reduce_tensor(
        pid, x_ptr, numel, first, after, slot, table_ptr, scratch_ptr, counter_ptr, fingerprint_ptr,
        scratch_fingerprint_ptr, row, scratch_row, WIDE, BLOCK, PROGRAMS, STATS, HASH, BITS, STAGES,
    )  # fmt: skip


@triton.jit(do_not_specialize=["count", "row", "scratch_row"])
def _directory_kernel(
    directory,
    count,
    template,
    table_ptr,
    scratch_ptr,
    counter_ptr,
    fingerprint_ptr,
    scratch_fingerprint_ptr,
    row,
    scratch_row,
    WIDE: tl.constexpr,
    BLOCK: tl.constexpr,
    PROGRAMS: tl.constexpr,
    STATS: tl.constexpr,
    HASH: tl.constexpr,
    BITS: tl.constexpr,
    STAGES: tl.constexpr,
    TENSORS: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    # Up to TENSORS tensors of one dtype, listed in ``directory`` (int64 on the device: ``count``
    # addresses, then their element counts, then the first program of each): each program finds its
    # tensor among the first programs in one vector load, then reduces its share as _stats_kernel
    # does. ``template``: any tensor of the dtype, whose pointer type the addresses take. ALIGNED:
    # every address is a multiple of 16 bytes, which lets the loads be vectorised (Triton knows it
    # of a pointer argument, not of an address read from memory).
    pid = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, TENSORS)
    grid = tl.num_programs(0).to(tl.int64)
    firsts = tl.load(directory + 2 * count + k, mask=k < count, other=grid)
    started = firsts <= pid
    slot = tl.sum(started.to(tl.int32), 0) - 1
    first = tl.max(tl.where(started, firsts, 0), 0)
    after = tl.min(tl.where(started, grid, firsts), 0)
    x_ptr = tl.load(directory + slot).to(template.dtype)
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
    numel = tl.load(directory + count + slot)
    _reduce_tensor(
        pid, x_ptr, numel, first, after, slot, table_ptr, scratch_ptr, counter_ptr, fingerprint_ptr,
        scratch_fingerprint_ptr, row, scratch_row, WIDE, BLOCK, PROGRAMS, STATS, HASH, BITS, STAGES,
    )  # fmt: skip


_POINTER_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}
"""Triton's names of the element types the kernel reads (statistics of :data:`DTYPES`, fingerprints of :data:`WORDS`)."""


def compile_for(
    dtype: torch.dtype,
    *,
    stats: bool,
    hashed: bool,
    directory: bool = False,
    aligned: bool = True,
    arch: int = 90,
    block: int = _BLOCK,
    warps: int = WARPS,
) -> Any:
    """The kernel compiled ahead of time for a CUDA GPU of compute capability ``arch`` (no GPU
    needed), as a launch on tensors of ``dtype`` compiles it (``directory``: the kernel that reads
    the tensors' addresses from a directory; ``aligned``: every tensor :func:`aligned`): the suite checks its PTX, and
    ``bench/triton_occupancy.py`` its registers. Returns Triton's compiled kernel (``.asm`` holds
    ``ptx`` and ``cubin``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _directory_kernel if directory else _stats_kernel
    names = list(inspect.signature(kernel.fn).parameters)
    constexprs = {
        **_constexprs(dtype, stats, hashed),
        "BLOCK": block,
        **({"TENSORS": TENSORS_PER_LAUNCH, "ALIGNED": aligned} if directory else {}),
    }
    signature = {name: "constexpr" if name in constexprs else "i32" for name in names}
    pointers = ["template"] if directory else [f"x{slot}" for slot in range(SLOTS)]
    signature.update({name: f"*{_POINTER_TYPES[dtype]}" for name in pointers})
    signature.update({"table_ptr": "*fp64", "scratch_ptr": "*fp64", "counter_ptr": "*i32", "directory": "*i64"})
    signature.update({"fingerprint_ptr": "*i64", "scratch_fingerprint_ptr": "*i64"})
    signature = {name: signature[name] for name in names}  # the directory's entry only where it is a parameter
    divisible = {(names.index(name),): [["tt.divisibility", 16]] for name in pointers} if aligned else {}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=divisible)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={**_OPTIONS, "num_warps": warps})


def programs_for(numel: int) -> int:
    """Programs one tensor of ``numel`` elements is reduced by (scratch rows it needs when > 1)."""
    return max(1, min(MAX_PROGRAMS, -(-numel // ELEMENTS_PER_PROGRAM)))


def programs_of(numels: np.ndarray) -> np.ndarray:
    """:func:`programs_for` of each of ``numels`` (int64; two ufuncs where ``np.clip`` takes 6 µs)."""
    return np.minimum(np.maximum(-(-numels // ELEMENTS_PER_PROGRAM), 1), MAX_PROGRAMS)


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
    tensors: list[torch.Tensor],
    table: torch.Tensor,
    row: int,
    scratch: torch.Tensor,
    scratch_row: int,
    counters: torch.Tensor,
    fingerprints: torch.Tensor | None = None,
    scratch_fingerprints: torch.Tensor | None = None,
    *,
    stats: bool = True,
    directory: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Reduce up to :data:`TENSORS_PER_LAUNCH` non-empty tensors of one dtype into ``table[row : row +
    len(tensors)]``, using ``scratch[scratch_row : scratch_row + scratch_rows(tensors)]`` and
    ``counters[row + k]`` (zero before the call, and again after it) for a tensor that takes several
    programs. Asynchronous.

    ``stats``: take the statistics (each tensor :func:`is_dense`, its dtype in :data:`DTYPES`).
    ``fingerprints`` (int64, with ``scratch_fingerprints`` beside ``scratch``): also store each
    tensor's fingerprint in ``fingerprints[row + k]``, in the same pass; each tensor must then be
    contiguous, and without ``stats`` of an integer dtype of :data:`WORDS`.

    Up to :data:`SLOTS` tensors take one launch. More take one launch through ``directory``:
    ``(entries, host)``, int64 vectors of :func:`directory_entries` elements on the tensors' device
    and on the host (pinned, or the same memory), which must stay untouched until the launch has run
    (the stager reuses them once it has read the table back); without one, they go :data:`SLOTS` a
    launch. Its loads are vectorised where every tensor is :func:`aligned` (pass those together)."""
    hashed = fingerprints is not None
    unused = counters  # without HASH the fingerprint columns are not read: any pointer
    rows = (table, scratch, counters, fingerprints if hashed else unused, scratch_fingerprints if hashed else unused)
    if len(tensors) > SLOTS and directory is not None:
        _launch_directory(tensors, directory, rows, row, scratch_row, stats, hashed)
        return
    for start in range(0, len(tensors), SLOTS):
        group = tensors[start : start + SLOTS]
        _launch_slots(group, rows, row + start, scratch_row, stats, hashed)
        scratch_row += scratch_rows(group)


def aligned(tensor: torch.Tensor) -> bool:
    """Whether the tensor's memory starts on a 16-byte boundary, which vectorised loads need."""
    return tensor.data_ptr() % 16 == 0


def directory_entries(tensors: list[torch.Tensor]) -> int:
    """Directory entries (int64) one :func:`launch` of ``tensors`` needs: an address, an element
    count and a first program per tensor, where there are more than :data:`SLOTS`."""
    return 3 * len(tensors) if len(tensors) > SLOTS else 0


def _firsts(tensors: list[torch.Tensor]) -> list[int]:
    """The first program of each tensor, and the grid (programs in all) last."""
    firsts = [0]
    for tensor in tensors:
        firsts.append(firsts[-1] + programs_for(tensor.numel()))
    return firsts


_OPTIONS = {"num_warps": WARPS, "enable_fp_fusion": FP_FUSION}
"""The options both kernels are compiled with."""


def _constexprs(dtype: torch.dtype, stats: bool, hashed: bool) -> dict[str, Any]:
    """The compile-time arguments both kernels take on tensors of ``dtype``."""
    return {
        "WIDE": stats and dtype == torch.float64,
        "BLOCK": _BLOCK,
        "PROGRAMS": MAX_PROGRAMS,
        "STATS": stats,
        "HASH": hashed,
        "BITS": 8 * dtype.itemsize,
        "STAGES": STAGES,
    }


def _launch_slots(tensors: list[torch.Tensor], rows: tuple, row: int, scratch_row: int, stats: bool, hashed: bool) -> None:
    """Up to :data:`SLOTS` tensors passed as the kernel's arguments; ``rows``: the table, scratch,
    counters and fingerprint columns, as :func:`launch` has them."""
    firsts = _firsts(tensors)
    grid = firsts[-1]
    slots = tensors + [tensors[0]] * (SLOTS - len(tensors))  # unused slots: any pointer, no programs
    numels = [tensor.numel() for tensor in tensors] + [0] * (SLOTS - len(tensors))
    firsts += [grid] * (SLOTS - len(tensors))
    _stats_kernel[(grid,)](
        *slots, *numels, *firsts[1:SLOTS], *rows, row, scratch_row, **_constexprs(tensors[0].dtype, stats, hashed), **_OPTIONS
    )


def _launch_directory(
    tensors: list[torch.Tensor],
    directory: tuple[torch.Tensor, torch.Tensor],
    rows: tuple,
    row: int,
    scratch_row: int,
    stats: bool,
    hashed: bool,
) -> None:
    """Up to :data:`TENSORS_PER_LAUNCH` tensors listed in a directory (:func:`launch_listed`)."""
    addresses = np.array([tensor.data_ptr() for tensor in tensors], np.int64)
    numels = np.array([tensor.numel() for tensor in tensors], np.int64)
    aligned_all = all(aligned(tensor) for tensor in tensors)
    _launch_listed(addresses, numels, tensors[0], directory, rows, row, scratch_row, stats, hashed, aligned_all)


def launch_listed(
    addresses: np.ndarray,
    numels: np.ndarray,
    template: torch.Tensor,
    table: torch.Tensor,
    row: int,
    scratch: torch.Tensor,
    scratch_row: int,
    counters: torch.Tensor,
    fingerprints: torch.Tensor | None = None,
    scratch_fingerprints: torch.Tensor | None = None,
    *,
    directory: tuple[torch.Tensor, torch.Tensor],
    aligned: bool,
) -> None:
    """:func:`launch` of the statistics (and with ``fingerprints``, the fingerprints) of up to
    :data:`TENSORS_PER_LAUNCH` tensors known by their data's ``addresses`` and element counts
    ``numels`` (int64 arrays: no Python a tensor), each non-empty and :func:`is_dense` (contiguous,
    with fingerprints), of ``template``'s dtype and device (which must hold them until the launch
    has run); ``aligned``: every address a multiple of 16 bytes. One launch through ``directory``,
    whatever their number."""
    hashed = fingerprints is not None
    rows = (table, scratch, counters, fingerprints if hashed else counters, scratch_fingerprints if hashed else counters)
    _launch_listed(addresses, numels, template, directory, rows, row, scratch_row, True, hashed, aligned)


def _launch_listed(
    addresses: np.ndarray,
    numels: np.ndarray,
    template: torch.Tensor,
    directory: tuple[torch.Tensor, torch.Tensor],
    rows: tuple,
    row: int,
    scratch_row: int,
    stats: bool,
    hashed: bool,
    aligned_all: bool,
) -> None:
    """Tensors listed in a directory: written on the host, copied to the device without waiting
    (ordered before the launch on the same stream)."""
    entries, host = directory
    count = len(addresses)
    programs = programs_of(numels)
    listing = host.numpy()  # no torch op: a tensor built from host data would be one per launch
    listing[:count] = addresses
    listing[count : 2 * count] = numels
    listing[2 * count] = 0
    np.cumsum(programs[:-1], out=listing[2 * count + 1 : 3 * count])
    if entries.data_ptr() != host.data_ptr():
        entries.copy_(host, non_blocking=host.is_pinned())
    _directory_kernel[(int(programs.sum()),)](
        entries,
        count,
        template,
        *rows,
        row,
        scratch_row,
        TENSORS=TENSORS_PER_LAUNCH,
        ALIGNED=aligned_all,
        **_constexprs(template.dtype, stats, hashed),
        **_OPTIONS,
    )


def scratch_rows(tensors: list[torch.Tensor]) -> int:
    """Scratch rows one :func:`launch` of ``tensors`` uses: a row per program, none when every
    tensor takes a single program (it writes its table row directly)."""
    programs = [programs_for(tensor.numel()) for tensor in tensors]
    return sum(programs) if max(programs) > 1 else 0
