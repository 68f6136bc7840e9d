"""The native statistics kernel: built once, cached, equal to the torch-ops reference, and optional;
its fingerprint equals the torch-op fingerprint of torchdebug.checksum bit for bit."""

import ctypes
import gc
import math
import os
import shutil
import sys
import sysconfig
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from torchdebug.checksum import fingerprint
from torchdebug.native import build, fused_stats
from torchdebug.native.addresses import c_array, data_address
from torchdebug.stats._schema import COLUMNS, COUNT_KEYS
from torchdebug.stats._torch_ops import device_sums

needs_compiler = pytest.mark.skipif(
    build._compiler() is None or os.environ.get(build.DISABLE_ENV) == "0",
    reason="no C compiler, or native kernels switched off (TORCHDEBUG_NATIVE=0)",
)


def _reference(tensor: torch.Tensor) -> list[float | None]:
    """The sums vector from torch ops, ``None`` where the kernel gives NaN: a NaN sum (+inf and -inf
    added), min and max when every element is NaN."""
    sums = [None if value != value else value for value in device_sums(tensor).tolist()]
    if sums[COLUMNS.index("nan")] == tensor.numel():
        sums[0] = sums[1] = None
    return sums


def _cases() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    cases = []
    for n in (1, 15, 16, 17, 4095, 4096, 4097, 100_003):
        cases.append((f"f32[{n}]", torch.randn(n, generator=generator) * 3 + 1))
    holes = torch.randn(10_000, generator=generator)
    holes[[3, 4_500, 9_999]] = float("nan")
    holes[[7, 8_000]] = float("inf")
    holes[2] = -float("inf")
    cases.append(("nan and inf, in blocks and tail", holes))
    cases.append(("all nan", torch.full((40,), float("nan"))))
    cases.append(("+inf and -inf", torch.tensor([1.0, float("inf"), -float("inf")] * 10)))
    cases.append(("bfloat16", (torch.randn(5_000, generator=generator) * 50).to(torch.bfloat16)))
    cases.append(("float64", torch.randn(3_333, generator=generator, dtype=torch.float64) * 1e200))
    cases.append(("transpose", torch.randn(64, 48, generator=generator).t()))
    cases.append(("permute", torch.randn(4, 5, 6, generator=generator).permute(2, 0, 1)))
    cases.append(("squares overflow float32", torch.tensor([3e20, 4e20] * 20)))
    cases.append(("squares underflow float32", torch.full((64,), 1e-25)))
    cases.append(("zeros", torch.zeros(100)))
    cases.append(
        ("exact zeros and -0.0 in blocks, tail and threads", torch.relu(torch.randn(300_001, generator=generator)).neg())
    )
    cases.append(("bfloat16 zeros, careful pass", torch.tensor([0.0, -0.0, float("nan"), 1e-30, 1.0] * 999).bfloat16()))
    cases.append(("column slice", torch.randn(64, 48, generator=generator)[:, 5:30]))
    cases.append(("every other row", torch.randn(40, 33, generator=generator)[::2]))
    cases.append(("broadcast", torch.randn(5, 1, generator=generator).expand(5, 7)))
    cases.append(("strided 1-d (copied first)", torch.randn(100, generator=generator)[::3]))
    cases.append(("sliced 4-d permute", torch.randn(3, 4, 5, 6, generator=generator)[:, 1:3].permute(3, 1, 0, 2)))
    big = torch.randn(300_001, generator=generator)  # split over the threads of torch's pool
    big[[0, 150_000, 300_000]] = float("nan")
    big[[10, 290_000]] = float("inf")
    big[200_000] = -float("inf")
    cases.append(("nan and inf in every thread's chunk", big))
    cases.append(("bfloat16, parallel", (torch.randn(200_000, generator=generator) * 7).to(torch.bfloat16)))
    cases.append(("float64, parallel", torch.randn(150_000, generator=generator, dtype=torch.float64)))
    for dtype, low, high in ((torch.int64, -(10**12), 10**12), (torch.int32, -(2**31), 2**31 - 1), (torch.int16, -500, 500)):
        cases.append((f"{dtype}", torch.randint(low, high, (4_097,), generator=generator, dtype=dtype)))
    cases.append(("int8, every value", torch.arange(-128, 128, dtype=torch.int8).repeat(20)))
    cases.append(("uint8, zeros in blocks and tail", torch.randint(0, 3, (5_003,), generator=generator, dtype=torch.uint8)))
    cases.append(("bool", torch.rand(1_000, generator=generator) > 0.3))
    cases.append(("token ids, parallel", torch.randint(0, 50_000, (300_001,), generator=generator)))
    cases.append(("int64 transpose", torch.randint(-9, 9, (30, 40), generator=generator).t()))
    return cases


@pytest.mark.parametrize(
    "values",
    [
        np.arange(6, dtype=np.int64),
        np.zeros((3, 4), np.int8),
        np.arange(6, dtype=np.int64)[2:],
        np.arange(6, dtype=np.int64)[::2],  # strided: no contiguous buffer to view
        np.frombuffer(bytes(16), np.int64),  # read-only
        np.zeros(0),
    ],
    ids=["plain", "2d", "offset", "strided", "read-only", "empty"],
)
def test_an_arrays_address_is_the_one_numpy_gives(values):
    assert data_address(values) == values.ctypes.data


def test_a_ctypes_array_type_is_made_once_and_held():
    """``c_array`` holds the types it makes: ctypes' own cache of them is weak, and one the garbage
    collector freed is made again (8 µs) at the next call."""
    held = weakref.ref(c_array(ctypes.c_uint16, 13))
    gc.collect()
    assert held() is c_array(ctypes.c_uint16, 13)
    values = c_array(ctypes.c_uint16, 13)(*range(13))
    assert type(values)._type_ is ctypes.c_uint16 and len(values) == 13 and values[12] == 12


@needs_compiler
def test_kernel_is_built_where_a_compiler_exists():
    assert fused_stats.available()


@needs_compiler
@pytest.mark.parametrize("label,tensor", _cases(), ids=[label for label, _ in _cases()])
def test_kernel_agrees_with_torch_ops(label, tensor):
    got = fused_stats.fused_stats(tensor)
    assert got is not None, label
    want = _reference(tensor.to(torch.float64) if tensor.dtype == torch.bfloat16 else tensor)
    assert len(got) == len(want) == len(COLUMNS)
    for key, value, expected in zip(COLUMNS, got, want):
        if expected is None:
            assert math.isnan(value), key
        elif math.isinf(expected) or key in ("min", "max", *COUNT_KEYS):
            assert value == expected, key
        else:
            assert value == pytest.approx(expected, rel=1e-5, abs=1e-3 * math.sqrt(tensor.numel())), key


def _lane_sums(values: torch.Tensor) -> tuple[float, float]:
    """The sum and the sum of squares of a finite contiguous float32 tensor, in the kernel's order
    (``stats.c``'s ``FAST_RUN``): in blocks of 4096 elements, 16 float32 lanes each summing every
    16th element in turn (a square rounded to float32 before it is added), the lanes added into
    float64 in order at the block's end; the last elements past the lanes' whole rounds in float64."""
    data = values.numpy()
    total = squares = 0.0
    whole = data.size // 16 * 16
    for begin in range(0, whole, 4096):
        block = data[begin : min(begin + 4096, whole)].reshape(-1, 16)
        sums, square_sums = np.cumsum(block, 0, np.float32)[-1], np.cumsum(block * block, 0, np.float32)[-1]
        for lane in range(16):
            total += float(sums[lane])
            squares += float(square_sums[lane])
    for value in data[whole:].tolist():
        total += value
        squares += value * value
    return total, squares


@needs_compiler
@pytest.mark.parametrize("n", [1, 17, 4095, 4097, 20_000])
def test_kernel_sums_float32_in_its_lane_order_bit_for_bit(n):
    """Whichever vector loop the CPU takes (``stats.c``'s ``MULTIVERSION``: AVX-512, AVX2 or plain),
    the sums are those of the lane order: statistics are the same bits on every machine."""
    values = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3 + 1
    sums = fused_stats.fused_stats(values)
    assert (sums[2], sums[3]) == _lane_sums(values)


@needs_compiler
@pytest.mark.parametrize(
    "tensor", [torch.arange(10).to(torch.uint16), torch.randn(6, dtype=torch.float16)], ids=["uint16", "float16"]
)
def test_kernel_declines_what_it_does_not_handle(tensor):
    assert fused_stats.fused_stats(tensor) is None


@needs_compiler
def test_kernel_declines_negative_views():
    assert fused_stats.fused_stats(torch._neg_view(torch.randn(8))) is None


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty cache folder and no library loaded yet in this process."""
    monkeypatch.setenv("TORCHDEBUG_CACHE_DIR", str(tmp_path))
    build.load_library.cache_clear()
    build.load_python_library.cache_clear()
    fused_stats._kernels.cache_clear()
    yield tmp_path
    build.load_library.cache_clear()
    build.load_python_library.cache_clear()
    fused_stats._kernels.cache_clear()


@needs_compiler
def test_library_is_built_once_and_then_loaded_from_the_cache(fresh_build, monkeypatch):
    assert build.load_library("stats") is not None
    (built,) = fresh_build.rglob("stats.so")
    assert not list(fresh_build.rglob("*.tmp")), "the temporary build output was renamed into place"
    build.load_library.cache_clear()
    monkeypatch.setattr(build, "_build", lambda *args: pytest.fail("rebuilt although cached"))
    assert build.load_library("stats") is not None
    assert list(fresh_build.rglob("stats.so")) == [built]


@needs_compiler
@pytest.mark.skipif(
    not Path(sysconfig.get_paths()["include"], "Python.h").is_file(), reason="this Python's headers are not installed"
)
def test_a_library_read_against_pythons_headers_is_built_per_python_version(fresh_build, monkeypatch):
    """``load_python_library``: built against the running Python's headers (its internal ones too:
    ``py_frames.c`` reads the interpreter's frames) and cached per Python version, whose internal
    structures may change between releases; not built when native code is disabled."""
    library = build.load_python_library("py_frames")
    supported = (3, 11) <= sys.version_info[:2] <= (3, 13) and not sysconfig.get_config_var("Py_GIL_DISABLED")
    assert library is not None and library.td_frames_supported() == int(supported)
    build.load_python_library.cache_clear()
    monkeypatch.setattr(build.platform, "python_version", lambda: "3.99.0")
    assert build.load_python_library("py_frames") is not None
    assert len(list(fresh_build.rglob("py_frames.so"))) == 2
    build.load_python_library.cache_clear()
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    assert build.load_python_library("py_frames") is None


def test_an_edited_header_builds_the_sources_that_include_it_anew(fresh_build, monkeypatch):
    """A header beside a source that the source includes with quotes (and one that header includes)
    is part of the cache key: an edited AddressMap reaches the observer and the walk."""
    monkeypatch.setattr(build, "_build", lambda compiler, flags, source, target, link=(): target.write_bytes(b"built"))
    (fresh_build / "outer.h").write_text('#include "inner.h"\n')
    (fresh_build / "inner.h").write_text("int inner;\n")
    (fresh_build / "unused.h").write_text("int unused;\n")
    source = fresh_build / "library.c"
    source.write_text('#include <stdint.h>\n#include "outer.h"\nint answer(void) { return 42; }\n')
    assert build.local_headers(source) == [fresh_build / "outer.h", fresh_build / "inner.h"]
    first = build._built(["cc"], ("-shared",), source)
    (fresh_build / "unused.h").write_text("int changed;\n")
    assert build._built(["cc"], ("-shared",), source) == first
    (fresh_build / "inner.h").write_text("int changed;\n")
    assert build._built(["cc"], ("-shared",), source) != first
    native = Path(build.__file__).parent
    assert build.local_headers(native / "observer.cpp") == [native / "address_map.h"]
    assert build.local_headers(native / "slot_walk.cpp") == [native / "address_map.h"]


def test_disabled_by_environment(fresh_build, monkeypatch):
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")
    assert build.load_library("stats") is None
    assert fused_stats.fused_stats(torch.randn(10)) is None
    assert fused_stats.fingerprint(torch.randn(10)) is None
    assert fused_stats.stats_and_fingerprint(torch.randn(10)) is None
    assert not list(fresh_build.iterdir())


def test_a_failing_compiler_falls_back_with_a_warning(fresh_build, monkeypatch, caplog):
    monkeypatch.delenv(build.DISABLE_ENV, raising=False)  # the compiler is tried, and fails
    monkeypatch.setenv("CC", shutil.which("false") or "false")
    assert build.load_library("stats") is None
    assert "torch ops instead" in caplog.text
    assert fused_stats.fused_stats(torch.randn(10)) is None


@needs_compiler
def test_copy_with_stats_copies_and_agrees_with_the_kernel_on_big_tensors():
    tensor = torch.randn(300_001, generator=torch.Generator().manual_seed(1))
    tensor[123_456] = float("nan")
    target = torch.empty_like(tensor)
    sums = fused_stats.copy_with_stats(tensor, target.data_ptr())
    assert torch.equal(target.isnan(), tensor.isnan()) and torch.equal(target.nan_to_num(), tensor.nan_to_num())
    want = fused_stats.fused_stats(tensor)
    assert sums[:2] == want[:2] and sums[4:] == want[4:] and want[COLUMNS.index("nan")] == 1.0
    assert sums[2:4] == pytest.approx(want[2:4], rel=1e-9)


@needs_compiler
def test_results_do_not_depend_on_the_thread_count_beyond_rounding():
    tensor = torch.randn(500_000, generator=torch.Generator().manual_seed(2)) * 3
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fused_stats.fused_stats(tensor)
        torch.set_num_threads(max(2, threads))
        many = fused_stats.fused_stats(tensor)
        assert fused_stats.fused_stats(tensor) == many, "the same thread count gives the same bits"
    finally:
        torch.set_num_threads(threads)
    assert one[:2] == many[:2] and one[4:] == many[4:]
    assert one[2:4] == pytest.approx(many[2:4], rel=1e-5, abs=1e-3 * math.sqrt(tensor.numel()))  # float32 blocks


@needs_compiler
@pytest.mark.skipif(not build.torch_uses_gnu_openmp(), reason="torch does not run on GNU OpenMP here")
def test_kernel_shares_torchs_openmp_runtime(fresh_build):
    library = build.load_library("stats")
    assert library is not None
    assert b"libgomp.so.1" in Path(library._name).read_bytes(), "built with -fopenmp"
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "/libgomp" in line}
    assert len(runtimes) == 1, f"one OpenMP runtime in the process, not {sorted(runtimes)}"


def test_walk_covers_views_without_copying():
    base = torch.randn(64, 48)
    assert fused_stats._runs(base[:, 5:30]) == ([64, 25], [48, 1])
    assert fused_stats._runs(base.t()) == ([3072], [1])  # one run in memory order, not logical order
    assert fused_stats._runs(torch.randn(5, 1).expand(5, 7)) == ([7, 5], [0, 1])  # broadcast dim outermost
    assert fused_stats._runs(torch.randn(1, 5).expand(7, 5)) == ([7, 5], [0, 1])
    assert fused_stats._runs(torch.randn(100)[::3]) is None  # no stride-1 dim: copied first
    assert fused_stats._runs(torch.randn(5, 8)[:, ::2]) is None


# -- the fingerprint, in the statistics' pass or alone --------------------------------------------------------
def _reference_fingerprint(tensor: torch.Tensor) -> int:
    return int(fingerprint(tensor)) & (2**64 - 1)


def _fingerprint_cases() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)

    def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype)

    cases = [(f"f32[{n}]", randn(n)) for n in (1, 15, 16, 17, 4097)]
    cases += [
        ("f32, parallel (past the threshold, odd size)", randn(300_001)),
        ("f32, parallel, exactly the threshold", randn(65_536)),
        ("bfloat16, parallel", randn(200_003).bfloat16()),
        ("float16, parallel", randn(70_001).half()),
        ("float64, parallel", randn(150_001, dtype=torch.float64)),
        ("float64 with nan and inf", torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -0.0], dtype=torch.float64)),
        ("f32 with nan (the careful pass keeps the fingerprint)", torch.tensor([1.0, float("nan")] * 40)),
        ("int8", torch.arange(-100, 100, dtype=torch.int8)),
        ("uint8", torch.arange(0, 250, dtype=torch.uint8)),
        ("int16", torch.arange(-3000, 3000, 7, dtype=torch.int16)),
        ("int32", torch.randint(-(2**31), 2**31 - 1, (5_000,), generator=generator, dtype=torch.int32)),
        ("int64, parallel", torch.randint(-(2**62), 2**62, (100_000,), generator=generator)),
        ("bool", torch.rand(1_000, generator=generator) > 0.5),
        ("complex64", randn(333, dtype=torch.complex64)),
        ("complex128 (two words an element)", randn(257, dtype=torch.complex128)),
        ("complex128, transposed", randn(9, 7, dtype=torch.complex128).t()),
        ("complex64 conjugate view", randn(50, dtype=torch.complex64).conj()),
        ("negative view", torch._neg_view(randn(40))),
        ("0-d", torch.tensor(2.5)),
        ("transpose", randn(64, 48).t()),
        ("big transpose (one run per column)", randn(700, 300).t()),
        ("permute", randn(4, 5, 6).permute(2, 0, 1)),
        ("column slice", randn(64, 48)[:, 5:30]),
        ("every other row", randn(40, 33)[::2]),
        ("broadcast", randn(5, 1).expand(5, 7)),
        ("broadcast rows", randn(1, 5).expand(7, 5)),
        ("strided 1-d (copied first)", randn(100)[::3]),
        ("sliced 4-d permute", randn(3, 4, 5, 6)[:, 1:3].permute(3, 1, 0, 2)),
        ("bfloat16 transpose", randn(33, 65).bfloat16().t()),
        ("int32 transpose", torch.arange(600, dtype=torch.int32).reshape(20, 30).t()),
        ("float64 transpose (two words an element, strided keys)", randn(41, 37, dtype=torch.float64).t()),
        ("float64 big transpose, rows split over threads", randn(400, 300, dtype=torch.float64).t()),
        ("float32 transpose, rows cut by the statistics' blocks", randn(150, 40).t()),
        ("int32 transpose, more rows than a hasher call", torch.arange(6000, dtype=torch.int32).reshape(150, 40).t()),
        ("int64 permute", torch.randint(-(2**62), 2**62, (3, 70, 9), generator=generator).permute(2, 0, 1)),
        ("complex64 transpose", randn(13, 11, dtype=torch.complex64).t()),
        ("float16 transpose", randn(70, 33).half().t()),
        ("int16 column slice", torch.arange(-4000, 4000, dtype=torch.int16).reshape(80, 100)[:, 3:77]),
        ("bool transpose", (randn(31, 29) > 0).t()),
        ("uint8, parallel", torch.randint(0, 256, (200_003,), generator=generator, dtype=torch.uint8)),
        ("int8 broadcast", torch.arange(-6, 6, dtype=torch.int8).reshape(12, 1).expand(12, 5)),
    ]
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):  # newer dtypes, absent from older torch releases
            cases.append((name, randn(500).to(getattr(torch, name))))
    return cases


_FINGERPRINT_CASES = _fingerprint_cases()


_HASHERS = {"picked": 0, "portable": 1, "avx2 at most": 2}


@pytest.fixture(params=list(_HASHERS))
def hashers(request):
    """The fingerprint's inner loops the library picked for this CPU (AVX-512 where it has it), the
    portable ones, and AVX2 at most (the same as another where the CPU lacks AVX-512 or AVX2): each
    must give the reference's bits."""
    library = fused_stats._kernels()
    if library is None:
        pytest.skip("no C compiler: the native kernel is not built here")
    library.pick_hashers(_HASHERS[request.param])
    yield library.hashers().decode()
    library.pick_hashers(0)


@needs_compiler
@pytest.mark.parametrize("label,tensor", _FINGERPRINT_CASES, ids=[label for label, _ in _FINGERPRINT_CASES])
def test_kernel_fingerprint_equals_the_torch_op_fingerprint(label, tensor, hashers):
    want = _reference_fingerprint(tensor)
    assert fused_stats.fingerprint(tensor) == want, label
    both = fused_stats.stats_and_fingerprint(tensor)
    if _summed(tensor):
        sums, value = both
        assert value == want, label
        alone = fused_stats.fused_stats(tensor)  # the statistics of the same pass: as the kernel takes them alone
        assert sums[:2] == alone[:2] or all(math.isnan(v) for v in sums[:2] + alone[:2]), label
        assert sums[4:] == alone[4:], label
        assert sums[2:4] == pytest.approx(alone[2:4], rel=1e-5, abs=1e-3 * math.sqrt(tensor.numel()), nan_ok=True), label
    else:
        assert both is None, label  # statistics of other dtypes are torch ops: the fingerprint alone


def _summed(tensor: torch.Tensor) -> bool:
    """Whether the kernel takes the statistics of ``tensor`` (its dtype, not a negative view)."""
    floating = (torch.float32, torch.bfloat16, torch.float64)
    integral = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
    return tensor.dtype in floating + integral and not tensor.is_neg()


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float64, torch.complex128])
def test_kernel_fingerprint_of_every_length_and_offset_equals_the_reference(dtype, hashers):
    """Lengths 1 to 70 (the vector loops' whole iterations and every tail) from every offset into a
    block of 16 elements (unaligned starts): the vector loops and their tails give the reference's bits."""
    base = (torch.randn(90, generator=torch.Generator().manual_seed(6)) * 40).to(dtype)
    for start in range(16):
        for length in range(1, 71):
            piece = base[start : start + length]
            assert fused_stats.fingerprint(piece) == _reference_fingerprint(piece), (start, length)


@needs_compiler
@pytest.mark.parametrize("tensor", [torch.empty(0), torch.empty(3, 0, 2), torch.empty(0, dtype=torch.int64)], ids=str)
def test_kernel_fingerprint_of_an_empty_tensor_is_zero(tensor):
    assert fused_stats.fingerprint(tensor) == _reference_fingerprint(tensor) == 0


@needs_compiler
@pytest.mark.parametrize("sizes", [(3, 0), (0, 4), (2, 0, 5)], ids=str)
def test_kernel_walk_of_an_empty_layout_ends(sizes):
    """The library's entry points handed an empty walk (the Python callers stop before it) return at
    once: its rows of no element must not hold a thread (and the training job) forever."""
    library = fused_stats._kernels()
    dims = len(sizes)
    layout = [(ctypes.c_int64 * dims)(*values) for values in (sizes, [0] * (dims - 1) + [1], [1] * dims)]
    memory = torch.zeros(1)
    got = {}

    def walk() -> None:
        got["fingerprint"] = library.fingerprint[4](memory.data_ptr(), dims, *layout, 1)
        value, sums = ctypes.c_uint64(), (ctypes.c_double * 8)()
        library.stats[torch.float32][2](memory.data_ptr(), dims, *layout, sums, ctypes.byref(value), 1)
        got["both"] = value.value

    thread = threading.Thread(target=walk, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the kernel walked an empty layout for 30 s"
    assert got == {"fingerprint": 0, "both": 0}


@needs_compiler
@pytest.mark.parametrize(
    "shape,view",
    [((500_001,), lambda x: x), ((700, 300), lambda x: x.t()), ((3, 200, 170), lambda x: x.permute(2, 0, 1))],
    ids=["contiguous", "transposed (rows split over threads)", "permuted"],
)
def test_kernel_fingerprint_does_not_depend_on_the_thread_count(hashers, shape, view):
    tensor = view(torch.randn(*shape, generator=torch.Generator().manual_seed(4)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fused_stats.fingerprint(tensor), fused_stats.stats_and_fingerprint(tensor)[1]
        torch.set_num_threads(max(2, threads))
        many = fused_stats.fingerprint(tensor), fused_stats.stats_and_fingerprint(tensor)[1]
    finally:
        torch.set_num_threads(threads)
    assert one == many == (_reference_fingerprint(tensor),) * 2  # a sum modulo 2**64: exact in any order


@needs_compiler
def test_kernel_fingerprint_tracks_single_bits_and_positions():
    x = torch.randn(70_000, generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y.view(torch.int32)[69_999] ^= 1  # one bit of the last element, in the last thread's chunk
    swapped = x.clone()
    swapped[[10, 60_000]] = x[[60_000, 10]]
    prints = {fused_stats.fingerprint(t) for t in (x, y, swapped, x.view(350, 200).t())}
    assert len(prints) == 4


@needs_compiler
def test_kernel_fingerprint_declines_what_it_cannot_read():
    assert fused_stats.fingerprint(torch.empty(4, device="meta")) is None
    assert fused_stats.fingerprint(torch.eye(3).to_sparse()) is None
    assert fused_stats.stats_and_fingerprint(torch.arange(5).to(torch.uint16)) is None


def test_fingerprint_walk_follows_memory_and_knows_logical_positions():
    base = torch.randn(64, 48)
    assert fused_stats._ordered_runs(base) == ([3072], [1], [1])
    assert fused_stats._ordered_runs(base.t()) == ([64, 48], [48, 1], [1, 64])  # memory order, logical steps
    assert fused_stats._ordered_runs(base[:, 5:30]) == ([64, 25], [48, 1], [25, 1])
    assert fused_stats._ordered_runs(torch.randn(5, 1).expand(5, 7)) == ([7, 5], [0, 1], [1, 7])
    assert fused_stats._ordered_runs(torch.randn(2, 3, 4).permute(1, 0, 2)) == ([2, 3, 4], [12, 4, 1], [4, 8, 1])
    assert fused_stats._ordered_runs(torch.randn(100)[::3]) is None  # no stride-1 dim: copied first


def test_processes_building_one_library_at_once_build_it_once(fresh_build, monkeypatch):
    """The second builder waits for the first one's lock and loads what it built (two threads: each
    opens the lock file, so each holds a lock of its own, as processes do)."""
    import fcntl
    import threading

    building, release, waiting = threading.Event(), threading.Event(), threading.Event()
    builds = []
    real_flock = fcntl.flock

    def build_slowly(compiler, flags, source, target, link=()):
        builds.append(threading.current_thread().name)
        building.set()
        release.wait(60)
        target.write_bytes(b"built")

    def flock(lock, operation):
        if threading.current_thread().name == "second":
            waiting.set()  # about to wait for the first builder's lock
        real_flock(lock, operation)

    monkeypatch.setattr(build, "_build", build_slowly)
    monkeypatch.setattr(fcntl, "flock", flock)
    source = fresh_build / "library.c"
    source.write_text("int answer(void) { return 42; }\n")
    found = {}

    def builder(name):
        found[name] = build._built(["cc"], ("-shared",), source)

    first = threading.Thread(target=builder, args=("first",), name="first")
    first.start()
    assert building.wait(60)
    second = threading.Thread(target=builder, args=("second",), name="second")
    second.start()
    while second.is_alive() and not (waiting.is_set() or len(builds) > 1):  # it waits for the lock, or (unlocked) builds
        waiting.wait(0.01)
    release.set()
    first.join(60)
    second.join(60)
    assert builds == ["first"] and found["first"] == found["second"] and found["first"].read_bytes() == b"built"
