"""The device-side statistics table: every implementation equals the reference statistics and the
reference fingerprint, results wait for one read per flush, memory stays bounded, and capture reads
the device a constant number of times per step however many ops ran."""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchdebug
from tests.triton_interpreter import interpreter_skip, run_in_interpreter
from torchdebug import stats_table
from torchdebug.checksum import fingerprint
from torchdebug.native.fused_stats import finish_sums
from torchdebug.records import STATS_NOT_TAKEN
from torchdebug.stats import tensor_stats
from torchdebug.stats._schema import COUNT_KEYS, WIDTH, empty_stats, stats_from_sums
from torchdebug.stats_table import LandedSums, StatsStager
from torchdebug.store._slot_columns import _finished

ROOT = Path(__file__).resolve().parents[1]


def _edge_cases() -> dict[str, torch.Tensor]:
    """One tensor per edge case the statistics must survive."""
    torch.manual_seed(0)
    nan, inf = float("nan"), float("inf")
    base = torch.randn(6, 8)
    cases = {
        "float32": torch.randn(1000),
        "large (several programs)": torch.randn(70_001) * 3 + 1,
        "all NaN": torch.full((5,), nan),
        "NaN and infinities": torch.tensor([1.0, nan, inf, -inf, 2.0, nan]),
        "only +inf": torch.full((4,), inf),
        "denormals": torch.full((7,), 1e-40),
        "huge (float32 squares overflow)": torch.full((9,), 3e30),
        # the float64 retake's loop of whole blocks; off zero, so that the float32 sum is well conditioned on any CPU
        "huge, whole blocks (several programs)": (torch.randn(70_001) + 3) * 1e20,
        "float64": torch.randn(300, dtype=torch.float64),
        "bfloat16": torch.randn(513).bfloat16(),
        "float16": torch.randn(100).half(),
        "int64": torch.tensor([3, -7, 10, 2**40]),
        "bool": torch.tensor([True, False, True]),
        "complex64": torch.tensor([3 + 4j, 0 + 1j]),
        "transposed": base.t(),
        "permuted, with a storage offset": torch.randn(5, 6, 7)[1:].permute(2, 0, 1),
        "sliced": base[:, ::2],
        "expanded": torch.randn(1, 8).expand(5, 8),
        "0-d": torch.tensor(2.5),
        "exact zeros and -0.0 (several programs)": torch.relu(torch.randn(70_001)) * (torch.arange(70_001) % 2 - 0.5),
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):  # newer dtypes, absent from older torch releases
            cases[name] = torch.randn(64).to(getattr(torch, name))
    return cases


def _assert_same_stats(got: dict, want: dict, case: str) -> None:
    assert got.keys() == want.keys(), case
    for key, value in want.items():
        if value is None or isinstance(value, int) and key in COUNT_KEYS:
            assert got[key] == value, (case, key)
        elif math.isnan(value) or math.isinf(value):
            assert got[key] == value or (math.isnan(got[key]) and math.isnan(value)), (case, key)
        else:  # float32 accumulation: a mean near zero is exact only up to the tensor's scale
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-5), (case, key)


@pytest.fixture
def on_device(monkeypatch):
    """Make CPU tensors take the accelerator path: reduced into the table, read at flush."""
    monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)


def _reference(tensor: torch.Tensor) -> dict:
    return tensor_stats(tensor)


def _reference_fingerprint(tensor: torch.Tensor) -> int:
    return int(fingerprint(tensor)) & (2**64 - 1)


def _fingerprint_cases() -> dict[str, torch.Tensor]:
    """The statistics' edge cases and more dtypes and layouts, for the fingerprint."""
    torch.manual_seed(1)
    cases = _edge_cases()
    cases.update(
        {
            "int8": torch.arange(-100, 100, dtype=torch.int8),
            "int16": torch.arange(-3000, 3000, 7, dtype=torch.int16),
            "int32, transposed": torch.arange(600, dtype=torch.int32).reshape(20, 30).t(),
            "uint8, large": torch.randint(0, 256, (70_001,), dtype=torch.uint8),
            "bool, large": torch.rand(40_000) > 0.3,
            "complex128": torch.randn(257, dtype=torch.complex128),
            "complex64 conjugate": torch.randn(20, dtype=torch.complex64).conj(),
            "float64, large": torch.randn(70_001, dtype=torch.float64),
            "bfloat16, transposed": torch.randn(33, 65).bfloat16().t(),
            "float16, large": torch.randn(100_003).half(),
            "broadcast rows": torch.randn(1, 5).expand(7, 5),
        }
    )
    return cases


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_device_table_statistics_equal_the_reference_statistics(case, on_device):
    tensor = _edge_cases()[case]
    stager = StatsStager()
    got: list[dict] = []
    stager.add(tensor, got.append)
    assert got == [] and len(stager) == 1  # nothing is read before the flush
    stager.flush()
    _assert_same_stats(got[0], _reference(tensor), case)


@pytest.mark.parametrize("path", ["now", "table"])
def test_a_stager_that_does_not_finish_delivers_the_sums_its_statistics_come_from(path, monkeypatch):
    """``StatsStager(finish=False)`` (the flight recorder's) hands sinks the sums vector, on the CPU
    at once and from the table at the flush: finished, they are the reference statistics."""
    if path == "table":
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    cases = {name: t for name, t in _edge_cases().items() if t.is_floating_point() or t.is_complex()}
    cases["empty"] = torch.empty(0, 3)
    stager = StatsStager(finish=False)
    got: dict[str, list[float]] = {}
    stager.add_all([(tensor, lambda sums, name=name: got.setdefault(name, sums)) for name, tensor in cases.items()])
    stager.flush()
    for name, tensor in cases.items():
        assert len(got[name]) == WIDTH, name
        _assert_same_stats(stats_from_sums(got[name], tensor.numel()), _reference(tensor), name)


@pytest.mark.parametrize("with_stats", [True, False], ids=["with statistics", "alone"])
def test_device_table_fingerprints_equal_the_reference_fingerprint(with_stats, on_device):
    """Without Triton (this machine, or TORCHDEBUG_NATIVE=0) each row holds the torch-op fingerprint."""
    cases = _fingerprint_cases()
    stats: dict[str, dict] = {}
    prints: dict[str, int] = {}
    stager = StatsStager()
    stager.add_all(
        [
            (
                tensor,
                (lambda value, k=case: stats.__setitem__(k, value)) if with_stats else None,
                lambda v, k=case: prints.__setitem__(k, v),
            )
            for case, tensor in cases.items()
        ]
    )
    assert prints == {} and stats == {}  # nothing is read before the flush
    stager.flush()
    for case, tensor in cases.items():
        assert prints[case] == _reference_fingerprint(tensor), case
        if with_stats:
            _assert_same_stats(stats[case], _reference(tensor), case)
    assert stats.keys() == (cases.keys() if with_stats else set())


@pytest.mark.parametrize("with_stats", [True, False], ids=["with statistics", "alone"])
def test_cpu_fingerprints_are_delivered_at_once_and_equal_the_reference(with_stats):
    for case, tensor in _fingerprint_cases().items():
        got: list = []
        StatsStager().add_all([(tensor, got.append if with_stats else None, got.append)])
        assert got[-1] == _reference_fingerprint(tensor), case
        if with_stats:
            _assert_same_stats(got[0], _reference(tensor), case)


@pytest.mark.parametrize("path", ["now", "table"])
def test_a_dict_takes_the_statistics_and_a_container_the_fingerprint_at_its_key_with_no_object_a_row(path, monkeypatch):
    """Sinks that make no object a tensor (``NativeStepCapture``'s stagings hold thousands a step): a
    statistics dict the statistics update, a ``(container, key)`` the fingerprint lands in; on the
    device path the table holds them until the flush, and with them no object a row."""
    if path == "table":
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    tensors = [torch.arange(float(i), float(i) + 6).reshape(2, 3) for i in range(64)] + [torch.empty(0)]
    stats: list[dict] = [{} for _ in tensors]
    prints: dict[int, int | None] = dict.fromkeys(range(len(tensors)))
    stager = StatsStager()
    stager.add_all([(tensors[0], {}, None)])  # (its table made, and let go for the next)
    stager.flush()
    before = len(gc.get_objects())
    stager.add_all([(tensor, stats[at], (prints, at)) for at, tensor in enumerate(tensors)])
    held = len(gc.get_objects()) - before
    stager.flush()
    for at, tensor in enumerate(tensors):
        _assert_same_stats(stats[at], _reference(tensor), str(at))
        assert prints[at] == _reference_fingerprint(tensor)
    assert held < 10


@pytest.mark.parametrize("path", ["now", "table"])
@pytest.mark.parametrize("hashed", [False, True], ids=["statistics", "with fingerprints"])
def test_sums_landed_by_key_finish_at_once_into_the_reference_statistics(path, hashed, monkeypatch):
    """``(landed, key)`` sinks (``NativeStepCapture``'s stagings): each tensor's unfinished sums land
    at its key of one ``LandedSums`` (on the CPU the kernel's dtypes in one native call, at once; from
    the table at the flush), across two stagings that grow it, and finished all at once as the drain
    finishes them (``fused_stats.finish_sums``) they are the reference statistics; the keys not
    given, not expected."""
    if path == "table":
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
    cases = {**_edge_cases(), "empty": torch.empty(0, 3), "float32, a second": torch.randn(5, 7)}
    names = list(cases)
    keys = {name: 3 * at + 1 for at, name in enumerate(names)}  # (apart: the keys between are not given)
    landed = LandedSums()
    prints: dict[int, int | None] = {}
    stager = StatsStager()
    for part in (names[: len(names) // 2], names[len(names) // 2 :]):  # the second grows the table
        landed.expect([keys[name] for name in part])
        stager.add_all([(cases[name], (landed, keys[name]), (prints, keys[name]) if hashed else None) for name in part])
    if path == "table":  # nothing is read before the flush (an empty tensor's sums land at once)
        assert landed.arrived.nonzero()[0].tolist() == [keys["empty"]]
    stager.flush()
    rows = np.array([keys[name] for name in names])
    assert landed.arrived[rows].all() and landed.arrived.sum() == len(names)
    assert all(landed.holds(key) for key in rows.tolist()) and not landed.holds(0) and not landed.holds(10**6)
    done = finish_sums(rows, landed.sums.reshape(-1), np.ones(len(landed.numels), np.int8), landed.numels)
    column = _finished(done).to_pylist()  # (the column the drain makes)
    for at, name in enumerate(names):
        _assert_same_stats(column[at], _reference(cases[name]) if cases[name].numel() else empty_stats(), name)
        if hashed:
            assert prints[keys[name]] == _reference_fingerprint(cases[name]), name


class _ListedKernel:
    """What ``StatsStager.add_landed`` asks of ``triton_stats``, on the CPU without Triton: each launch
    writes the CPU sums of the tensors it is given, or finds by address those listed, into the
    table's rows, and says what it was given (launches of at most 5 tensors, 2 as arguments, 1 to 4
    programs a tensor)."""

    DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
    WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    TENSORS_PER_LAUNCH, SLOTS = 5, 2

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.at = {tensor.data_ptr(): tensor for tensor in tensors if tensor.numel()}
        self.launches: list[tuple[str, int, bool]] = []

    @staticmethod
    def interpreted() -> bool:
        return True  # (CPU tensors are the kernel's)

    @staticmethod
    def is_dense(tensor: torch.Tensor) -> bool:
        return tensor.is_contiguous()

    @staticmethod
    def programs_of(numels: np.ndarray) -> np.ndarray:
        return np.clip(-(-numels // 256), 1, 4)

    @staticmethod
    def aligned(tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() % 16 == 0

    def programs_for(self, numel: int) -> int:
        return int(self.programs_of(np.array([numel]))[0])

    def scratch_rows(self, tensors: list[torch.Tensor]) -> int:
        programs = self.programs_of(np.array([tensor.numel() for tensor in tensors]))
        return int(programs.sum()) if programs.max() > 1 else 0

    @staticmethod
    def directory_entries(tensors: list[torch.Tensor]) -> int:
        return 0  # (add_all's launches: their tensors as arguments)

    def _fits(self, scratch_row: int, numels: np.ndarray) -> None:
        programs = self.programs_of(numels)
        assert programs.max() == 1 or scratch_row + programs.sum() <= stats_table.SCRATCH_ROWS

    def launch(self, tensors, table, row, scratch, scratch_row, counters, fingerprints=None, *rest, **options) -> None:
        assert options.get("directory") is None
        self._fits(scratch_row, np.array([tensor.numel() for tensor in tensors]))
        self.launches.append(("slots", len(tensors), all(tensor.data_ptr() % 16 == 0 for tensor in tensors)))
        self._write(tensors, table, row, fingerprints, options.get("stats", True))

    def launch_listed(
        self, addresses, numels, template, table, row, scratch, scratch_row, counters, fingerprints=None, *_, directory, aligned
    ):
        assert self.SLOTS < len(addresses) <= self.TENSORS_PER_LAUNCH and len(directory[1]) == 3 * len(addresses)
        self._fits(scratch_row, numels)
        assert aligned == all(address % 16 == 0 for address in addresses.tolist())
        self.launches.append(("listed", len(addresses), aligned))
        tensors = [self.at[address] for address in addresses.tolist()]
        assert [tensor.numel() for tensor in tensors] == numels.tolist() and {t.dtype for t in tensors} == {template.dtype}
        self._write(tensors, table, row, fingerprints, True)

    @staticmethod
    def _write(tensors, table, row, fingerprints, stats: bool) -> None:
        for at, tensor in enumerate(tensors):
            if stats:
                table[row + at] = torch.tensor(stats_table.cpu_sums(tensor), dtype=torch.float64)
            if fingerprints is not None:
                assert tensor.is_contiguous()  # (the fingerprint reads the elements in their order)
                fingerprints[row + at] = fingerprint(tensor)


@pytest.mark.parametrize("path", ["now", "table"])
@pytest.mark.parametrize("hashed", [False, True], ids=["statistics", "with fingerprints"])
def test_sums_listed_by_array_land_at_their_keys_in_launches_of_one_dtype_and_alignment(path, hashed, monkeypatch):
    """``StatsStager.add_landed`` (a staging's tensors, with where each one's elements are, as the
    observer says): the kernel's tensors of one dtype and alignment take launches by array, cut by
    the launch's tensors and its scratch's programs, each one run of rows; those it does not read
    (empty, not dense, not contiguous for a fingerprint, an integer dtype) the per-tensor path; on a
    device the host reads at no cost, one native call (statistics alone). Every sum and fingerprint
    lands at its tensor's key, and finished the sums are the reference statistics."""
    torch.manual_seed(0)
    base = torch.randn(101)
    cases = {
        "float32": torch.randn(1000),
        "several programs": torch.randn(70_001) * 3 + 1,
        "unaligned": base[1:],
        "float64": torch.randn(40, dtype=torch.float64),
        "bfloat16": torch.randn(33).to(torch.bfloat16),
        "permuted": torch.randn(6, 8).t(),
        "strided": torch.randn(6, 8)[:, ::2],
        "empty": torch.empty(0, 3),
        "int64": torch.arange(10),
        **{f"small {at}": torch.randn(7 + at) for at in range(12)},
        "unaligned too": base[5:],
    }
    tensors = list(cases.values())
    flags = {"strided": 0, "empty": 0, "permuted": stats_table.DENSE}
    codes = {dtype: code for code, dtype in enumerate(sorted({tensor.dtype for tensor in tensors}, key=str))}
    memory = np.array(
        [
            [tensor.data_ptr() if tensor.numel() else 0, tensor.numel(), codes[tensor.dtype], 0, flags.get(name, 3)]
            for name, tensor in cases.items()
        ],
        np.int64,
    )
    kernel = _ListedKernel(tensors)
    if path == "table":
        monkeypatch.setattr(stats_table, "_resolves_now", lambda tensor: False)
        monkeypatch.setattr(stats_table, "_triton", lambda: kernel)
        monkeypatch.setattr(stats_table, "SCRATCH_ROWS", 6)
    keys = 2 * np.arange(len(tensors)) + 3  # (apart, not from 0)
    landed = LandedSums()
    landed.expect(keys)
    stager = StatsStager()
    stager.add_landed(tensors, landed, keys, memory, hashed)
    stager.flush()
    assert landed.arrived[keys].all() and landed.arrived.sum() == len(tensors)
    assert len(landed.fingerprints) == (len(tensors) if hashed else 0)
    if hashed:
        assert [landed[key] for key in keys.tolist()] == [_reference_fingerprint(tensor) for tensor in tensors]
    done = finish_sums(keys, landed.sums.reshape(-1), np.ones(len(landed.numels), np.int8), landed.numels)
    for name, got in zip(cases, _finished(done).to_pylist()):
        _assert_same_stats(got, _reference(cases[name]) if cases[name].numel() else empty_stats(), name)
    if path == "table":
        listed = [launch for launch in kernel.launches if launch[0] == "listed"]
        assert {aligned for _, _, aligned in listed} == {True} and max(count for _, count, _ in listed) == 5
        assert ("slots", 2, False) in kernel.launches  # the two unaligned float32 tensors together
        # (add_all's launches too: without fingerprints strided and int64 take torch ops; no launch reads the empty one)
        assert sum(count for _, count, _ in kernel.launches) == len(tensors) - (1 if hashed else 3)
    else:
        assert not kernel.launches


def test_an_empty_tensor_gets_fingerprint_zero_at_once(on_device):
    got: list = []
    StatsStager().add_all([(torch.empty(0, 3), None, got.append)])
    assert got == [0]


def test_integer_statistics_keep_integer_min_and_max(on_device):
    stager = StatsStager()
    got: list[dict] = []
    stager.add(torch.tensor([3, -7, 10]), got.append)
    stager.flush()
    assert got[0]["min"] == -7 and isinstance(got[0]["min"], int) and got[0]["max"] == 10


def test_empty_tensors_are_delivered_at_once(on_device):
    stager = StatsStager()
    got: list[dict] = []
    stager.add(torch.empty(0, 3), got.append)
    assert got == [empty_stats()] and got[0]["min"] is None and got[0]["nan"] == 0


def test_results_arrive_in_the_order_they_were_added_across_full_tables(on_device, monkeypatch):
    monkeypatch.setattr(stats_table, "TABLE_ROWS", 4)
    stager = StatsStager()
    got: list[float] = []
    staged: list[list] = []
    for value in range(11):
        stager.add(torch.full((3,), float(value)), lambda stats: got.append(stats["mean"]))
        if value % 4 == 0:
            stager.stage(torch.tensor([value, value + 1]), staged.append)
    stager.flush()
    assert got == [float(v) for v in range(11)]
    assert staged == [[0, 1], [4, 5], [8, 9]]
    # never more than two tables: one filling, one in flight
    assert stager.memory_bytes() <= 2 * stats_table._Table(torch.device("cpu")).nbytes
    assert len(stager) == 0


def test_send_then_deliver_without_blocking_hands_over_finished_transfers(on_device):
    stager = StatsStager()
    got: list[dict] = []
    stager.add(torch.ones(4), got.append)
    stager.send()
    assert got == []
    assert stager.deliver(block=False)  # CPU copies are done at once
    assert got[0]["mean"] == 1.0


def test_cpu_tensors_are_resolved_at_once_without_a_table():
    stager = StatsStager()
    got: list[dict] = []
    stager.add(torch.ones(3), got.append)
    assert got[0]["mean"] == 1.0 and stager.memory_bytes() == 0


class _FakeKernel:
    """Stands in for ``triton_stats`` on machines without Triton: records each launch and fills the
    rows with torch ops, as the kernel would."""

    SLOTS = 2
    TENSORS_PER_LAUNCH = 3
    DTYPES = frozenset({torch.float32, torch.float64})
    WORDS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    @staticmethod
    def is_dense(tensor: torch.Tensor) -> bool:
        return tensor.is_contiguous()

    @staticmethod
    def aligned(tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() % 16 == 0

    @staticmethod
    def programs_for(numel: int) -> int:
        return 3

    @staticmethod
    def scratch_rows(tensors: list[torch.Tensor]) -> int:
        return 3 * len(tensors)

    def directory_entries(self, tensors: list[torch.Tensor]) -> int:
        return 3 * len(tensors) if len(tensors) > self.SLOTS else 0

    def launch(
        self,
        tensors,
        table,
        row,
        scratch,
        scratch_row,
        counters,
        fingerprints=None,
        scratch_fingerprints=None,
        *,
        stats=True,
        directory=None,
    ):  # noqa: ANN001
        hashed = fingerprints is not None
        if directory is not None:  # the stager's slices of its directory, on the device and on the host
            assert [len(part) for part in directory] == [3 * len(tensors)] * 2
        self.launches.append(
            (tensors[0].dtype, len(tensors), row, scratch_row, directory is not None) + ((stats, hashed) if hashed else ())
        )
        for k, tensor in enumerate(tensors):
            if stats:
                table[row + k].copy_(stats_table.device_sums(tensor))
            if hashed:
                assert tensor.is_contiguous()
                fingerprints[row + k].copy_(fingerprint(tensor))


def _fake_kernel(monkeypatch) -> _FakeKernel:  # noqa: ANN001
    fake = _FakeKernel()
    monkeypatch.setattr(stats_table, "_triton", lambda: fake)
    monkeypatch.setattr(stats_table, "_kernel_on", lambda tensor: fake)
    return fake


def test_an_ops_tensors_are_reduced_together_by_dtype_and_alignment(on_device, monkeypatch):
    """Tensors of one dtype share launches (more than SLOTS through a directory, at most
    TENSORS_PER_LAUNCH), aligned ones apart from the others, whose loads cannot be vectorised."""
    fake = _fake_kernel(monkeypatch)
    tensors = [
        torch.full((4,), 1.0),
        torch.full((3,), 2.0, dtype=torch.float64),
        torch.full((2,), 3.0),
        torch.arange(6),  # integers: torch ops
        torch.full((5,), 4.0),
        torch.full((4, 2), 5.0).t(),  # not dense for this kernel: torch ops
        torch.full((1,), 6.0),
        torch.full((2,), 7.0, dtype=torch.float64),
        torch.full((9,), 8.0)[1:],  # 4 bytes past an aligned start
        torch.full((4,), 9.0),
    ]
    got: dict[int, dict] = {}
    stager = StatsStager()
    stager.add_all([(tensor, lambda stats, k=k: got.__setitem__(k, stats)) for k, tensor in enumerate(tensors)])
    assert got == {}
    stager.flush()
    assert [got[k]["mean"] for k in range(len(tensors))] == [1.0, 2.0, 3.0, 2.5, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    # rows 0-1 went to the torch-op tensors; then aligned float32, three through a directory and two
    # as arguments, float64, the unaligned float32 tensor; one stream: each launch reuses the scratch
    assert fake.launches == [
        (torch.float32, 3, 2, 0, True),
        (torch.float32, 2, 5, 0, False),
        (torch.float64, 2, 7, 0, False),
        (torch.float32, 1, 9, 0, False),
    ]


@pytest.mark.parametrize(
    "limit,value,groups",
    [
        ("TABLE_ROWS", 1 << 16, [3, 3, 1]),  # at most TENSORS_PER_LAUNCH a launch
        ("SCRATCH_ROWS", 7, [2, 2, 2, 1]),  # programs (3 a tensor here) that fit the scratch
        ("DIRECTORY_ENTRIES", 10, [3, 3, 1]),  # a table whose directory is full is sent, another filled
    ],
)
def test_many_tensors_go_in_launches_that_fit_a_table(on_device, monkeypatch, limit, value, groups):
    fake = _fake_kernel(monkeypatch)
    monkeypatch.setattr(stats_table, limit, value)
    got: list[float] = []
    stager = StatsStager()
    stager.add_all([(torch.full((4,), float(k)), lambda stats: got.append(stats["mean"])) for k in range(7)])
    stager.flush()
    assert got == [float(k) for k in range(7)]
    assert [launch[1] for launch in fake.launches] == groups
    assert [launch[4] for launch in fake.launches] == [n > fake.SLOTS for n in groups]  # directories over SLOTS
    if limit == "DIRECTORY_ENTRIES":  # 9 entries a launch of three: the second takes a fresh table
        assert [launch[2] for launch in fake.launches] == [0, 0, 3]


def test_launches_on_one_stream_reuse_the_scratch_and_others_take_rows_after_it(on_device, monkeypatch):
    """A launch starts after the one before it on its stream, so while every launch since the table
    was read back ran on one stream each starts at scratch row 0; one on another stream may run
    beside them, so it takes rows after every row in use, and so does every launch until the
    read-back, when the scratch is free again. A full scratch sends the table and fills another."""
    fake = _fake_kernel(monkeypatch)  # three scratch rows a tensor
    monkeypatch.setattr(stats_table, "SCRATCH_ROWS", 20)
    stream = ["A"]
    monkeypatch.setattr(stats_table, "_current_stream", lambda device: stream[0])
    stager = StatsStager()
    got: list[float] = []

    def launch_on(name: str, tensors: int) -> None:
        stream[0] = name
        stager.add_all([(torch.full((2,), 1.0), lambda stats: got.append(stats["mean"])) for _ in range(tensors)])

    for name, tensors in [("A", 2), ("A", 3), ("A", 1), ("B", 2), ("A", 1), ("A", 2)]:
        launch_on(name, tensors)
    stager.flush()
    launch_on("B", 2)
    stager.flush()
    scratch = [(launch[1], launch[3]) for launch in fake.launches]
    # A's launches at 0 (the furthest reaching row 9); B after them; then A after B; A's last does
    # not fit (21 > 20), so it goes to a fresh table, at 0; after the read-back, B at 0
    assert scratch == [(2, 0), (3, 0), (1, 0), (2, 9), (1, 15), (2, 0), (2, 0)]
    assert [launch[2] for launch in fake.launches] == [0, 2, 5, 6, 8, 0, 0]  # table rows
    assert got == [1.0] * 13


def test_fingerprints_share_the_statistics_launch_or_go_by_word_width(on_device, monkeypatch):
    """With statistics, a kernel dtype's fingerprint is taken in the same launch (a non-contiguous
    tensor copied first); without, or for other dtypes, tensors go as integers of their width."""
    fake = _fake_kernel(monkeypatch)
    tensors = [
        torch.full((4,), 1.0),
        torch.arange(6.0).reshape(2, 3).t(),  # float32, transposed: copied, then with the others
        torch.arange(6, dtype=torch.int32),  # statistics by torch ops, fingerprint as int32 words
        torch.tensor([True, False]),  # int8 words
    ]
    stats: dict[int, dict] = {}
    prints: dict[int, int] = {}
    stager = StatsStager()
    stager.add_all(
        [(t, lambda v, k=k: stats.__setitem__(k, v), lambda v, k=k: prints.__setitem__(k, v)) for k, t in enumerate(tensors)]
    )
    stager.flush()
    assert prints == {k: _reference_fingerprint(t) for k, t in enumerate(tensors)}
    assert [stats[k]["mean"] for k in range(4)] == [1.0, 2.5, 2.5, 0.5]
    assert fake.launches == [
        (torch.float32, 2, 2, 0, False, True, True),  # rows 0-1: the int32 and bool statistics (torch ops)
        (torch.int32, 1, 4, 0, False, False, True),
        (torch.int8, 1, 5, 0, False, False, True),
    ]
    fake.launches.clear()
    prints.clear()
    stager.add_all([(t, None, lambda v, k=k: prints.__setitem__(k, v)) for k, t in enumerate(tensors)])
    stager.flush()
    assert prints == {k: _reference_fingerprint(t) for k, t in enumerate(tensors)}
    assert fake.launches == [  # three tensors of 4-byte words (over SLOTS: a directory), then one of bytes
        (torch.int32, 3, 0, 0, True, False, True),
        (torch.int8, 1, 3, 0, False, False, True),
    ]


# -- the Triton kernel, run by Triton's interpreter on the CPU ------------------------------------------
_TRITON_SCRIPT = """
import collections, json, sys
import torch
sys.path.insert(0, {tests!r})
from test_stats_table import _edge_cases, _reference
from torchdebug import stats_table

stats_table._resolves_now = lambda tensor: False
results = {{}}
for case, tensor in _edge_cases().items():
    value = tensor.abs() if tensor.is_complex() else tensor
    kernel = stats_table._kernel_for(value)
    used = kernel is not None and kernel.is_dense(value)
    runs = []
    for _ in range(2):
        stager = stats_table.StatsStager()
        got = []
        stager.add(tensor, got.append)
        stager.flush()
        runs.append(got[0])
    results[case] = {{"kernel": used, "got": runs[0], "again": runs[1], "want": _reference(tensor)}}

# every case in one call: the kernel's tensors of one dtype and alignment go together, more than
# SLOTS through the directory; tensors that take several programs beside ones that take one
kernel = stats_table._triton()
launches = []
for name in ("_launch_slots", "_launch_directory"):
    def counted(tensors, *rest, _name=name, _launch=getattr(kernel, name)):
        launches.append([_name, len(tensors)])
        _launch(tensors, *rest)
    setattr(kernel, name, counted)
cases = {{**_edge_cases(), "large, second": torch.randn(100_000) - 2, "small, third": torch.randn(33)}}
together = {{case: [] for case in cases}}
stager = stats_table.StatsStager()
stager.add_all([(tensor, together[case].append) for case, tensor in cases.items()])
stager.flush()
results["together"] = {{case: {{"got": together[case][0], "want": _reference(tensor)}} for case, tensor in cases.items()}}
groups = collections.Counter()
for tensor in cases.values():
    value = tensor.abs() if tensor.is_complex() else tensor
    if value.numel() and stats_table._kernel_for(value) is not None and kernel.is_dense(value):
        groups[value.dtype, kernel.aligned(value)] += 1
expected = [["_launch_directory" if n > kernel.SLOTS else "_launch_slots", n] for n in groups.values()]
results["launches"] = {{"made": sorted(launches), "expected": sorted(expected), "float32": groups[torch.float32, True]}}

# programs of 1024 elements, at most 8 per tensor: every case takes several programs, and the last
# program of a 20,000-element tensor starts past its end (8 shares of 3,072)
stats_table._triton().ELEMENTS_PER_PROGRAM, stats_table._triton().MAX_PROGRAMS = 1024, 8
cases["past the end"] = torch.randn(20_000)
small = {{case: [] for case in cases}}
stager = stats_table.StatsStager()
# twice in the same table, every row one further on the second time: the kernel set the counters back to zero
for shift in ([], [(torch.randn(7), lambda stats: None)]):
    stager.add_all(shift + [(tensor, small[case].append) for case, tensor in cases.items()])
    stager.flush()
results["small programs"] = {{
    case: {{"got": small[case][0], "again": small[case][1], "want": _reference(tensor)}} for case, tensor in cases.items()
}}
print(json.dumps(results))
"""


def test_triton_kernel_equals_the_reference_statistics_in_the_interpreter():
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    results = run_in_interpreter(_TRITON_SCRIPT.format(tests=str(ROOT / "tests")))
    together, launches, small = results.pop("together"), results.pop("launches"), results.pop("small programs")
    kernel_cases = {case for case, result in results.items() if result["kernel"]}
    # every float32/16/bf16/64 layout that fills one dense span goes through the kernel
    assert {
        "float32",
        "large (several programs)",
        "transposed",
        "bfloat16",
        "float64",
        "huge (float32 squares overflow)",
        "huge, whole blocks (several programs)",
        "exact zeros and -0.0 (several programs)",
    } <= kernel_cases
    assert not {"sliced", "expanded", "int64", "bool"} & kernel_cases
    for case, result in results.items():
        _assert_same_stats(result["got"], result["want"], case)
        assert json.dumps(result["got"]) == json.dumps(result["again"]), case  # deterministic bits
    for case, result in together.items():
        _assert_same_stats(result["got"], result["want"], f"{case}, in one add_all")
    for case, result in small.items():
        _assert_same_stats(result["got"], result["want"], f"{case}, programs of 1024 elements")
        assert json.dumps(result["got"]) == json.dumps(result["again"]), case  # the tables reused
    # one launch per dtype and alignment (over ten aligned float32 tensors: the directory kernel)
    assert launches["float32"] > 8 and launches["made"] == launches["expected"], launches


_CAPTURE_SCRIPT = """
import json, sys, tempfile
import torch
import torchdebug
import torchdebug.debugger
from torchdebug import stats_table

# the table's launches are the dispatch mode's (the native path reads CPU tensors in its own pass)
torchdebug.debugger.why_not_native = lambda config, model: "the test holds it on the dispatch mode"
launches = []
if sys.argv[1] == "kernel":
    stats_table._resolves_now = lambda tensor: False
    kernel = stats_table._triton()
    launch = kernel.launch
    def counted(tensors, *rest, stats=True, **options):
        launches.append(len(tensors) if len(rest) == 5 else [len(tensors), stats])  # [n, stats]: with fingerprints
        launch(tensors, *rest, stats=stats, **options)
    kernel.launch = counted
task = sys.argv[2]
options = dict(task="statistics", checksum=True) if task == "statistics+checksum" else dict(task=task)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
debugger = torchdebug.Debugger(dump_path=tempfile.mkdtemp(), **options)
debugger.start(model)
model(torch.randn(8, 16)).square().mean().backward()
optimizer.step()
debugger.stop()
debugger.close()
records = torchdebug.load(debugger.run_dir).ranks[0].records()
stats = {{r.name: r.stats for r in records if r.stats}}
checksums = {{r.name: r.checksum for r in records if r.kind == "tensor"}}
print(json.dumps({{"stats": stats, "checksums": checksums, "launches": launches}}))
"""


def test_a_captured_step_through_the_triton_kernel_equals_the_cpu_capture():
    """The whole path (session, table, launches of several tensors, delivery to the right records)
    in Triton's interpreter, against the native CPU statistics of the same step."""
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    runs = {}
    for arm in ("cpu", "kernel"):
        runs[arm] = run_in_interpreter(_CAPTURE_SCRIPT.format(), arm, "statistics")
    cpu, kernel = runs["cpu"]["stats"], runs["kernel"]["stats"]
    assert cpu.keys() == kernel.keys() and len(cpu) > 100
    for name, want in cpu.items():
        _assert_same_stats(kernel[name], want, name)
    launches = runs["kernel"]["launches"]
    # a foreach optimizer op's three lists of six in one launch through the directory: AdamW's addcdiv_
    # reads the parameters, the moments and the denominators, each written in place since it was read
    assert max(launches) == 18
    assert sum(count > 1 for count in launches) >= 5  # a linear's weight and bias, and the like


@pytest.mark.parametrize("task", ["checksum", "statistics+checksum"])
def test_a_captured_steps_fingerprints_through_the_triton_kernel_equal_the_torch_op_fingerprints(task):
    """Every record's checksum from the Triton kernel (interpreter) equals the torch-op fingerprint
    (TORCHDEBUG_NATIVE=0) of the same step, record by record; with statistics, in the same launches."""
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    runs = {}
    for arm, env in (("reference", {"TORCHDEBUG_NATIVE": "0"}), ("kernel", {})):
        runs[arm] = run_in_interpreter(_CAPTURE_SCRIPT.format(), arm, task, **env)
    reference, kernel = runs["reference"]["checksums"], runs["kernel"]["checksums"]
    assert len(reference) > 100 and all(reference.values())
    assert kernel == reference
    launches = [launch for launch in runs["kernel"]["launches"] if isinstance(launch, list)]
    assert launches and max(n for n, _ in launches) == 18  # a foreach op's lists' fingerprints in one launch (above)
    assert any(stats for _, stats in launches) == (task == "statistics+checksum")  # one pass for both
    if task == "statistics+checksum":
        for name, want in runs["reference"]["stats"].items():
            _assert_same_stats(runs["kernel"]["stats"][name], want, name)


_FINGERPRINT_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, {tests!r})
from test_stats_table import _fingerprint_cases
from torchdebug import stats_table

stats_table._resolves_now = lambda tensor: False
kernel = stats_table._triton()
launched = []
launch = kernel.launch
def counted(tensors, *rest, stats=True, **options):
    if len(rest) == 7:  # with the fingerprint columns
        launched.append(len(tensors))
    launch(tensors, *rest, stats=stats, **options)
kernel.launch = counted
cases = _fingerprint_cases()
results = {{}}
for arm in ("with statistics", "alone", "with statistics, programs of 1024", "alone, programs of 1024"):
    if arm.endswith("1024"):  # every tensor over 1024 elements takes several programs; some start past the end
        kernel.ELEMENTS_PER_PROGRAM, kernel.MAX_PROGRAMS = 1024, 8
    launched.clear()
    prints = {{}}
    stats = {{}}
    stager = stats_table.StatsStager()
    stager.add_all([
        (tensor, (lambda v, k=case: stats.__setitem__(k, v)) if arm.startswith("with") else None,
         lambda v, k=case: prints.__setitem__(k, v))
        for case, tensor in cases.items()
    ])
    stager.flush()
    results[arm] = {{"prints": prints, "stats": stats, "launched": sum(launched)}}
print(json.dumps(results))
"""


def test_triton_kernel_fingerprints_equal_the_torch_op_fingerprints_in_the_interpreter():
    """Every dtype and layout, with the statistics and alone, one program per tensor and several
    (the partial sums combined by the last program), all in the same launches."""
    reason = interpreter_skip()
    if reason:
        pytest.skip(reason)
    results = run_in_interpreter(_FINGERPRINT_SCRIPT.format(tests=str(ROOT / "tests")))
    cases = _fingerprint_cases()
    for arm, result in results.items():
        assert result["launched"] == len(cases), arm  # every fingerprint came from the kernel
        for case, tensor in cases.items():
            assert result["prints"][case] == _reference_fingerprint(tensor), (arm, case)
            if arm.startswith("with"):
                _assert_same_stats(result["stats"][case], _reference(tensor), f"{case}, {arm}")


_KERNEL_VARIANTS = [(dtype, True, False) for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
_KERNEL_VARIANTS += [(torch.float32, True, True), (torch.bfloat16, True, True), (torch.float64, True, True)]
_KERNEL_VARIANTS += [(dtype, False, True) for dtype in (torch.int8, torch.int16, torch.int32, torch.int64)]


_VECTOR_LOADS = ("ld.global.v4.b32", "ld.global.v2.b64", "ld.global.v2.b32")


@pytest.mark.parametrize("directory", [False, True], ids=["arguments", "directory"])
@pytest.mark.parametrize(
    "dtype,stats,hashed",
    _KERNEL_VARIANTS,
    ids=[
        f"{dtype}{' statistics' if stats else ''}{' fingerprint' if hashed else ''}" for dtype, stats, hashed in _KERNEL_VARIANTS
    ],
)
def test_triton_kernel_compiles_for_an_h100_with_vector_loads_and_an_ordered_combine(
    dtype, stats, hashed, directory, monkeypatch
):
    """Compiled for sm_90 (no GPU needed): aligned tensors are read with 128-bit loads (also when
    their addresses come from the directory, where only the launch's word says they are aligned),
    and the combine of partial rows keeps its memory ordering (acquire-release counter, block
    barriers, L1-bypassing loads), which the interpreter cannot show. The sums use fused
    multiply-adds whatever Triton's default (off from Triton 3.10, or set so here)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (torch's CPU builds do not ship it)")
    from torchdebug.native import triton_stats

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")

    ptx = triton_stats.compile_for(dtype, stats=stats, hashed=hashed, directory=directory).asm["ptx"]
    unaligned = triton_stats.compile_for(dtype, stats=stats, hashed=hashed, directory=directory, aligned=False).asm["ptx"]
    vector_loads = [sum(text.count(load) for load in _VECTOR_LOADS) for text in (ptx, unaligned)]
    assert vector_loads[0] > vector_loads[1], vector_loads  # the tensors' reads are vectorised, and only where aligned
    assert "atom.global.gpu.acq_rel.add" in ptx and "bar.sync" in ptx and "ld.global.cg" in ptx
    mix = str(0xBF58476D1CE4E5B9 - 2**64)  # splitmix64's first multiplier, as PTX writes an int64
    assert ("mul.lo.s64" in ptx and mix in ptx) == hashed  # only where the fingerprint is taken
    # each word's product from 32-bit multiplies (mul.lo and mul.hi), not an emulated 64-bit one: a
    # thread's words of a block in the loop, and again in the masked rest
    words = triton_stats._BLOCK // (32 * triton_stats.WARPS) * (2 if dtype.itemsize == 8 else 1)
    assert ptx.count("mul.hi.u32") == (2 * words if hashed else 0), ptx.count("mul.hi.u32")
    assert ("fma.rn." in ptx) == stats and "mul.rn.f" not in ptx  # no multiply rounds apart from its add


# -- no host read per op ------------------------------------------------------------------------------------
class _HostReads(TorchDispatchMode):
    """Counts the aten calls that read a value on the host or build a tensor from host data."""

    READS = {"aten.item.default", "aten._local_scalar_dense.default", "aten.lift_fresh.default", "aten.lift_fresh_copy.default"}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if str(func) in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _host_reads_of_a_step(tmp_path: Path, layers: int, task: str) -> tuple[int, int]:
    """Host reads that capture adds to one training step (the optimizer reads its own step counts),
    and the records it wrote."""
    reads = {}
    for captured in (False, True):
        torch.manual_seed(0)
        blocks = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)) for _ in range(layers)]
        model = torch.nn.Sequential(*blocks)
        optimizer = torch.optim.AdamW(model.parameters())
        debugger = torchdebug.Debugger(dump_path=str(tmp_path / f"{task}{layers}"), task=task) if captured else None
        with _HostReads() as counter:
            if debugger:
                debugger.start(model)
            model(torch.randn(4, 8)).square().mean().backward()
            optimizer.step()
            if debugger:
                debugger.stop()
                debugger.step()
        reads[captured] = counter.count
    debugger.close()
    records = torchdebug.load(debugger.run_dir).ranks[0].records()
    return reads[True] - reads[False], len(records)


@pytest.mark.parametrize("task", ["statistics", "overflow_check", "checksum"])
def test_capture_reads_the_device_a_constant_number_of_times_per_step(tmp_path, on_device, task):
    few, few_records = _host_reads_of_a_step(tmp_path, 1, task)
    many, many_records = _host_reads_of_a_step(tmp_path, 6, task)
    if task != "overflow_check":
        assert many_records > 3 * few_records  # six times the ops...
    assert many == few  # ...and not one more host read


# -- on a GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_edge_cases()))
def test_cuda_statistics_equal_the_reference_statistics(case):
    tensor = _edge_cases()[case]
    stager = StatsStager()
    got: list[dict] = []
    stager.add(tensor.cuda(), got.append)
    assert got == []
    stager.flush()
    _assert_same_stats(got[0], _reference(tensor), case)


@pytest.mark.gpu
def test_cuda_tensors_reduced_together_by_many_programs_equal_the_reference_every_run():
    """Several tensors per launch, each big enough for the most programs (the partial rows are
    combined by whichever program finishes last, on real hardware): right, and the same bits on
    every run."""
    torch.manual_seed(0)
    tensors = [torch.randn(n, device="cuda") * scale for n, scale in ((50_000_000, 1.0), (33_554_433, 1e3), (1_000, 2.0))]
    tensors.append(torch.randn(20_000_000, device="cuda").bfloat16())
    tensors[1][12345] = float("nan")
    runs = []
    for _ in range(3):
        got: list[list[dict]] = [[] for _ in tensors]
        stager = StatsStager()
        stager.add_all([(tensor, got[k].append) for k, tensor in enumerate(tensors)])
        stager.flush()
        runs.append(json.dumps([g[0] for g in got]))
    for k, tensor in enumerate(tensors):
        want = _reference(tensor.double().cpu()) if tensor.dtype == torch.float32 else _reference(tensor.cpu())
        _assert_same_stats(json.loads(runs[0], parse_constant=float)[k], want, f"tensor {k}")
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.gpu
@pytest.mark.parametrize("with_stats", [True, False], ids=["with statistics", "alone"])
def test_cuda_fingerprints_equal_the_cpu_reference_the_same_bits_every_run(with_stats):
    """Every dtype and layout, and tensors big enough for the most programs (their partial sums
    combined by whichever program finishes last, on real hardware), several per launch."""
    cases = _fingerprint_cases()
    torch.manual_seed(2)
    cases.update(
        {"50M": torch.randn(50_000_000), "33M bf16": torch.randn(33_554_433).bfloat16(), "int64 20M": torch.arange(20_000_000)}
    )
    runs = []
    for _ in range(3):
        prints: dict[str, int] = {}
        stats: dict[str, dict] = {}
        stager = StatsStager()
        stager.add_all(
            [
                (
                    tensor.cuda(),
                    (lambda v, k=case, into=stats: into.__setitem__(k, v)) if with_stats else None,
                    lambda v, k=case, into=prints: into.__setitem__(k, v),
                )
                for case, tensor in cases.items()
            ]
        )
        assert prints == {}
        stager.flush()
        runs.append(prints)
    for case, tensor in cases.items():
        assert runs[0][case] == _reference_fingerprint(tensor), case
        if with_stats and tensor.numel() < 1_000_000:
            _assert_same_stats(stats[case], _reference(tensor), case)
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.gpu
def test_cuda_rows_written_on_another_stream_are_read_back_once_written():
    """The op capture reduces an op's outputs on the op's stream (an FSDP all-gather's, say); the
    table's copy, on the current stream, waits for that stream's work, and the host does not."""
    x = torch.randn(1 << 24, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    stager = StatsStager()
    got: list[dict] = []
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # tens of milliseconds of GPU time ahead of the launch
        stager.add(x, got.append)
    stager.flush()
    _assert_same_stats(got[0], _reference(x.cpu()), "written on a side stream")


@pytest.mark.gpu
def test_cuda_statistics_use_the_triton_kernel_where_triton_is_installed():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    assert stats_table._kernel_for(torch.ones(3, device="cuda")) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("task", ["statistics", "overflow_check", "checksum"])
def test_a_captured_cuda_training_step_never_synchronises_with_the_host(tmp_path, task):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(16, 64, device="cuda")
    debugger = torchdebug.Debugger(dump_path=str(tmp_path), task=task)
    for _ in range(2):  # the second step reuses the tables and pinned buffers of the first
        debugger.start(model)
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            debugger.stop()  # one wait for the table's copy: an event, not a synchronising op
        finally:
            torch.cuda.set_sync_debug_mode("default")
        debugger.step()
    debugger.close()
    records = torchdebug.load(debugger.run_dir).ranks[0].records()
    if task == "statistics":
        assert records and all(r.stats and r.stats["norm"] is not None for r in records if r.kind == "tensor" and r.shape)
    elif task == "checksum":
        assert records and all(r.checksum for r in records if r.kind == "tensor")


def test_the_completion_marker_reports_the_memory_of_the_statistics_tables(tmp_path, on_device, monkeypatch):
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")  # an accelerator's capture: the native path reads CPU tensors only
    torch.manual_seed(0)
    with torchdebug.dump(tmp_path, task="statistics") as debugger:
        torch.randn(8, 8).relu().sum()
    completion = torchdebug.load(debugger.run_dir).ranks[0].completion
    table = stats_table._Table(torch.device("cpu")).nbytes
    assert completion["statistics_table_bytes"] == table  # one table: nothing was in flight when it filled


def test_a_lost_delivery_of_statistics_keeps_the_records_and_says_so_without_raising(tmp_path, on_device, monkeypatch, caplog):
    """A stager that fails to deliver (a device lost, memory) is a fault of ours: the step goes on,
    every record is written, those whose statistics were lost say so, one warning tells it, and the
    next step's statistics arrive again."""
    monkeypatch.setenv("TORCHDEBUG_NATIVE", "0")  # the device path: statistics read at the flush
    failing = {"deliveries": 1}

    def deliver(self, block=True, oldest_only=False):  # noqa: ANN001, ANN202
        if failing["deliveries"] and self._in_flight:
            failing["deliveries"] -= 1
            raise RuntimeError("device lost")
        return original(self, block, oldest_only)

    original = stats_table.StatsStager.deliver
    monkeypatch.setattr(stats_table.StatsStager, "deliver", deliver)
    model = torch.nn.Linear(4, 4)
    with caplog.at_level(logging.WARNING, logger="torchdebug"), torchdebug.Debugger(tmp_path, task="statistics") as debugger:
        for _ in range(2):
            debugger.start(model)
            model(torch.randn(2, 4)).sum().backward()
            debugger.step()
    records = [r for r in torchdebug.load(debugger.run_dir).ranks[0].records() if r.kind == "tensor" and r.dtype == "float32"]
    lost = [r for r in records if r.capture_error == STATS_NOT_TAKEN]
    assert lost and {r.step for r in lost} == {0} and all(r.stats is None for r in lost)
    assert all(r.stats for r in records if r not in lost)  # delivered before the failure, or at the next step
    assert [m for m in caplog.messages if "were lost (RuntimeError: device lost)" in m] != []


def test_capture_on_the_cpu_holds_no_statistics_table(tmp_path):
    with torchdebug.dump(tmp_path, task="statistics") as debugger:
        torch.randn(8, 8).relu().sum()
    assert torchdebug.load(debugger.run_dir).ranks[0].completion["statistics_table_bytes"] == 0
