import ctypes
import math

import pytest
import torch

import torchdebug.stats._cpu
from torchdebug.checksum import fingerprint
from torchdebug.native import fused_stats as native
from torchdebug.stats import cpu_stats, cpu_stats_and_fingerprint, device_sums, stats_from_sums, tensor_stats
from torchdebug.stats._schema import COUNT_KEYS, WIDTH
from torchdebug.stats_table import StatsStager


@pytest.fixture(params=["native", "torch ops"], autouse=True)
def cpu_path(request, monkeypatch):
    """Run every test through the native kernel and through the torch-ops fallback."""
    if request.param == "torch ops":
        monkeypatch.setattr(torchdebug.stats._cpu, "fused_stats", lambda tensor: None)
        monkeypatch.setattr(torchdebug.stats._cpu, "fused_sums_into", lambda tensor, address: False)
        monkeypatch.setattr(torchdebug.stats._cpu, "fused_sums_many_into", lambda tensors, addresses: range(len(tensors)))
        monkeypatch.setattr(torchdebug.stats._cpu, "stats_and_fingerprint", lambda tensor: None)
        monkeypatch.setattr(native, "fingerprint", lambda tensor: None)
    elif not native.available():
        pytest.skip("no C compiler: the native kernel is not built here")
    return request.param


def test_statistics_of_a_float_tensor():
    stats = tensor_stats(torch.tensor([1.0, -2.0, 3.0, 4.0]))
    assert stats["min"] == -2.0 and stats["max"] == 4.0
    assert stats["mean"] == pytest.approx(1.5)
    assert stats["norm"] == pytest.approx(math.sqrt(30))
    assert (stats["nan"], stats["posinf"], stats["neginf"]) == (0, 0, 0)


def test_statistics_ignore_nans_and_count_infinities():
    stats = tensor_stats(torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0, float("nan")]))
    assert (stats["nan"], stats["posinf"], stats["neginf"]) == (2, 1, 1)
    assert stats["min"] == -math.inf and stats["max"] == math.inf


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([0.0, -0.0, 1.0, 0.0]),
        torch.tensor([0.0, float("nan"), -0.0, float("inf"), 2.0]),  # the careful pass counts them too
        torch.relu(torch.randn(300_001, generator=torch.Generator().manual_seed(0))),  # split over threads
        torch.relu(torch.randn(40, 30, generator=torch.Generator().manual_seed(1))).t(),
        torch.tensor([1e-30, 0.0, -1e-30]).bfloat16(),  # underflows to zero in bfloat16
        torch.tensor([1e-8, 0.0, 1.0]).half(),  # the torch-op path's dtype
        torch.tensor([0.0, 3.0], dtype=torch.float64),
        torch.tensor([0, 3, 0, -1]),
        torch.tensor([True, False, False]),
        torch.tensor([0j, 3 + 4j]),
    ],
    ids=lambda t: f"{t.dtype}{list(t.shape)}",
)
def test_statistics_count_exact_zeros(tensor):
    expected = int((tensor == 0).sum())
    assert tensor_stats(tensor)["zeros"] == expected
    assert cpu_stats_and_fingerprint(tensor)[0]["zeros"] == expected
    integral = not (tensor.is_floating_point() or tensor.is_complex())
    assert stats_from_sums(device_sums(tensor).tolist(), tensor.numel(), integral)["zeros"] == expected


def test_statistics_of_an_all_nan_tensor_have_no_values():
    stats = tensor_stats(torch.full((3,), float("nan")))
    assert stats["min"] is None and stats["mean"] is None and stats["nan"] == 3


def test_statistics_of_an_empty_tensor():
    stats = tensor_stats(torch.empty(0, 3))
    assert stats["min"] is None and stats["norm"] is None and stats["nan"] == 0


def test_statistics_of_integer_tensors_are_exact_for_min_and_max():
    stats = tensor_stats(torch.tensor([3, -7, 10], dtype=torch.int64))
    assert stats["min"] == -7 and isinstance(stats["min"], int)
    assert stats["mean"] == pytest.approx(2.0)


def test_statistics_of_bool_tensors_count_true_values():
    stats = tensor_stats(torch.tensor([True, False, True]))
    assert stats["max"] == 1 and stats["mean"] == pytest.approx(2 / 3)


def test_statistics_of_complex_tensors_use_magnitudes():
    stats = tensor_stats(torch.tensor([3 + 4j, 0 + 1j]))
    assert stats["max"] == pytest.approx(5.0) and stats["min"] == pytest.approx(1.0)


def test_statistics_of_quantized_tensors_are_those_of_their_dequantized_values():
    quantized = torch.quantize_per_tensor(torch.tensor([-1.0, 0.5, 2.0]), 0.5, 2, torch.qint8)
    stats = tensor_stats(quantized)
    assert (stats["min"], stats["max"], stats["mean"]) == (-1.0, 2.0, pytest.approx(0.5))


def test_dtypes_of_bits_or_packed_values_have_no_statistics():
    from torchdebug.stats import has_statistics

    no = [torch.bits8, torch.uint4, torch.int4, torch.float4_e2m1fn_x2]
    yes = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.bool, torch.complex64, torch.uint16, torch.qint8]
    assert [has_statistics(dtype) for dtype in no + yes] == [False] * len(no) + [True] * len(yes)


def test_statistics_of_bfloat16_accumulate_in_float32():
    x = torch.full((4096,), 1.0 + 2**-7, dtype=torch.bfloat16)
    stats = tensor_stats(x)
    assert stats["mean"] == pytest.approx(1.0 + 2**-7)
    assert stats["norm"] == pytest.approx(math.sqrt(4096) * (1 + 2**-7), rel=1e-6)


def test_statistics_of_non_contiguous_tensors():
    x = torch.arange(12.0).reshape(3, 4).t()
    assert tensor_stats(x)["norm"] == pytest.approx(torch.arange(12.0).norm().item())


def test_norm_survives_float32_overflow_of_squares():
    stats = tensor_stats(torch.tensor([3e20, 4e20]))
    assert stats["norm"] == pytest.approx(5e20, rel=1e-6)


@pytest.mark.parametrize(
    "tensor",
    [torch.randn(100), torch.tensor([1.0, float("nan"), -float("inf")]), torch.arange(5), torch.randn(7, dtype=torch.float64)],
)
def test_device_path_agrees_with_cpu_path(tensor):
    integral = not tensor.is_floating_point()
    via_sums = stats_from_sums(device_sums(tensor).tolist(), tensor.numel(), integral)
    direct = tensor_stats(tensor)
    assert via_sums.keys() == direct.keys()
    for key, value in direct.items():
        # float32 accumulation: a mean near zero is exact only up to the tensor's scale
        assert via_sums[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


def test_stager_delivers_statistics_at_flush_for_staged_tensors():
    stager = StatsStager()
    results: list[dict] = []
    stager.add(torch.ones(3), results.append)  # CPU: delivered at once
    stager.add(torch.empty(0), results.append)
    assert len(results) == 2 and results[0]["mean"] == 1.0
    stager.flush()
    assert len(stager) == 0


@pytest.mark.gpu
def test_stager_batches_cuda_statistics_into_one_copy():
    stager = StatsStager()
    results: list[dict] = []
    for value in (1.0, 2.0, 3.0):
        stager.add(torch.full((10,), value, device="cuda"), results.append)
    assert results == [] and len(stager) == 3
    stager.flush()
    assert [r["mean"] for r in results] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(100),
        torch.randn(300_001) * 4,  # split over threads by the native pass
        torch.tensor([1.0, float("nan"), -float("inf")]),
        torch.randn(40, 30).t(),
        torch.randn(513).bfloat16(),
        torch.randn(7, dtype=torch.float64),
        torch.randn(9).half(),
        torch.arange(5),
        torch.tensor([True, False]),
        torch.tensor([3 + 4j, 1j]),
    ],
    ids=lambda t: f"{t.dtype}{list(t.shape)}",
)
def test_statistics_and_fingerprint_in_one_call_equal_each_taken_alone(tensor):
    stats, value = cpu_stats_and_fingerprint(tensor)
    assert value == int(fingerprint(tensor)) & (2**64 - 1)
    alone = cpu_stats(tensor)
    for key, expected in alone.items():
        if expected is None or key in COUNT_KEYS:
            assert stats[key] == expected, key
        else:  # a walk in logical order may add in another order than the statistics' own walk
            assert stats[key] == pytest.approx(expected, rel=1e-6, abs=1e-6), key


def test_statistics_and_fingerprint_take_one_native_pass_for_the_kernels_dtypes(cpu_path, monkeypatch):
    taken_alone = []
    monkeypatch.setattr(torchdebug.stats._cpu, "cpu_stats", lambda tensor: taken_alone.append(tensor) or {})
    cpu_stats_and_fingerprint(torch.randn(10))
    cpu_stats_and_fingerprint(torch.randn(10).bfloat16())
    assert (taken_alone == []) == (cpu_path == "native")
    cpu_stats_and_fingerprint(torch.arange(3))  # integers too
    assert (taken_alone == []) == (cpu_path == "native")
    cpu_stats_and_fingerprint(torch.arange(3).half())  # float16: torch-op statistics, then the fingerprint
    assert len(taken_alone) == (1 if cpu_path == "native" else 4)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(5, 7),
        torch.randn(6, 9).t(),  # not contiguous: walked in memory order
        torch.randn(300).bfloat16(),
        torch.randn(40, dtype=torch.float64),
        torch.tensor([1.0, float("nan"), float("-inf"), 0.0]),
        torch.randn(33).half(),  # no native kernel: torch ops
        torch.randn(8, dtype=torch.complex64),  # magnitudes
        torch.randn(4, requires_grad=True) * 2,  # part of an autograd graph
    ],
    ids=["float32", "transposed", "bfloat16", "float64", "nan and -inf", "float16", "complex64", "requires grad"],
)
def test_sums_written_into_memory_are_the_sums_cpu_sums_returns(tensor):
    """The flight recorder's ring takes CPU sums at an address (:func:`cpu_sums_into`): the same
    numbers as :func:`cpu_sums` of the tensor's values, by whichever path the dtype takes."""
    from torchdebug.stats._cpu import cpu_sums, cpu_sums_into
    from torchdebug.stats._schema import WIDTH
    from torchdebug.stats._torch_ops import as_real

    out = (ctypes.c_double * WIDTH)()
    cpu_sums_into(tensor, ctypes.addressof(out))
    assert list(out) == pytest.approx(cpu_sums(as_real(tensor.detach())), nan_ok=True)


def test_sums_of_many_tensors_written_in_one_call_are_each_tensors_own_bit_for_bit(cpu_path):
    """The flight recorder reduces a step's parameters in one native call: each row holds, bit for
    bit, what a call of its own writes, whatever the dtype, layout, size (threads share a big one)
    or values (NaN and Inf take the careful loop); the kernel leaves the layouts and dtypes it does
    not read to the call of their own."""
    tensors = [
        torch.randn(7),
        torch.randn(3, 5).t(),
        torch.randn(70_000),
        torch.tensor([1.0, float("nan"), float("inf"), -2.0]),
        torch.randn(6, dtype=torch.bfloat16),
        torch.randn(5, dtype=torch.float64),
        torch.randn(4, dtype=torch.float16),
        torch.randn(3, dtype=torch.complex64),
        torch.randn(9),
    ]
    together = (ctypes.c_double * (WIDTH * len(tensors)))(*[math.nan] * (WIDTH * len(tensors)))
    alone = (ctypes.c_double * (WIDTH * len(tensors)))(*[math.nan] * (WIDTH * len(tensors)))
    rows = [ctypes.addressof(together) + 8 * WIDTH * i for i in range(len(tensors))]
    torchdebug.stats._cpu.cpu_sums_many_into(tensors, rows)
    for i, tensor in enumerate(tensors):
        torchdebug.stats._cpu.cpu_sums_into(tensor, ctypes.addressof(alone) + 8 * WIDTH * i)
    assert bytes(together) == bytes(alone)
    assert not any(math.isnan(together[WIDTH * i + 2]) for i in range(len(tensors)))  # every sum written
    if cpu_path == "native":
        left = native.fused_sums_many_into(tensors, rows)
        assert left == [1, 6, 7]  # the transposed view, float16, complex64
