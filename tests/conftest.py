"""Shared fixtures: a tiny model and a helper to dump one training step of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for `examples.gpt`


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test``) each worker takes its share of the cores for torch's
    intra-op threads, and so do the processes its tests start (``OMP_NUM_THREADS`` unless set: gloo
    ranks, fresh interpreters, the demo): two workers on two cores each running two OpenMP threads
    would oversubscribe (the demo beside a busy core took 58 s with two threads, 35 s with one).
    Inductor compiles in the worker itself, not in a pool of compile processes that each worker
    would start beside the other (two files of compiled models, timed once on a loaded machine: 62.7 s
    of user CPU with the pool, 51.6 s without; the whole suite's CPU time did not visibly move)."""
    _scalar_inductor_cpu_kernels()
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        share = max(1, torch.get_num_threads() // int(workers))
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(share))


@pytest.fixture(scope="session", autouse=True)
def _native_code_loaded() -> None:
    """The native libraries, loaded before any test runs. Each loads once per process
    (``functools.cache``) and reads ``TORCHDEBUG_NATIVE`` then: a test that sets it to ``0`` (to take
    the dispatch mode) before the first load would leave native code off for every later test of its
    worker. ``why_not_native`` reads the variable at each capture, so such a test still gets the
    mode; tests of the loaders themselves clear their caches (``tests/test_native.py``)."""
    from torchdebug.capture.native_values import load_slot_walk
    from torchdebug.native import fused_stats
    from torchdebug.native.observer import load_observer

    fused_stats.available()
    load_observer()
    load_slot_walk()


def _scalar_inductor_cpu_kernels() -> None:
    """Inductor's C++ kernels are generated without SIMD (``TORCHINDUCTOR_VEC_ISA_OK=0``, inherited by
    the fresh interpreters the tests start): scalar code is the same on every CPU, where the vector
    ISA inductor picks (AVX2, AVX-512, NEON) changes a reduction's rounding, and it compiles faster
    (the suite on 2 cores and an empty inductor cache: 374 s with vectorised kernels, 291 s without;
    about 0.5 s less of g++ per kernel). The tests check what torchdebug sees of a graph and its
    values, which the vector ISA does not change; unset it to run them on vectorised kernels."""
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    if "torch._inductor.config" in sys.modules:  # imported by a plugin before this hook: set it there too
        setting = {"1": True, "0": False}.get(os.environ["TORCHINDUCTOR_VEC_ISA_OK"])
        sys.modules["torch._inductor.config"].cpp.vec_isa_ok = setting


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def tiny() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet()


def _slow_files_first(items: list[pytest.Item]) -> None:
    """The files holding a ``slow`` test run first, each in its own order: ``make test`` hands the
    files to its workers in this order, so the long ones start early and the short ones fill the
    end, where a long file would keep one worker busy while the other waits (longest first)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
