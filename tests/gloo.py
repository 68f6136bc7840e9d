"""Distributed tests on CPU: gloo processes with a file rendezvous and an orderly teardown.

``spawn(worker, tmp_path, *args)`` runs ``worker(rank, *args)`` in ``world_size`` processes that
share one default process group (``start`` runs processes without one). Every rank meets at a
barrier before the group is destroyed, so no rank tears its gloo pairs down while another still has
work on them (torch 2.11 aborted a rank with "terminate called without an active exception" when
one rank left early).

The ranks are forked from a forkserver that imported torch, FSDP2, Dynamo and inductor once per test
process (a spawned rank spent 2-5 s of a 2-core machine importing them again). The server was started by
the first call, so each process takes the caller's environment and working directory, as a spawned
process would.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

_RENDEZVOUS = itertools.count()
_PRELOAD = ["torch", "torch.distributed.fsdp", "torch._dynamo", "torchdebug", "torchdebug.compile"]  # the last: inductor


def spawn(worker: Callable[..., None], tmp_path: Path, *args: Any, world_size: int = 2) -> None:
    """Run ``worker(rank, *args)`` on ``world_size`` gloo ranks; raises when any rank fails."""
    init_file = tmp_path / f"gloo-init-{next(_RENDEZVOUS)}"  # a used rendezvous file cannot serve again
    start(_rank_main, worker, str(init_file), world_size, args, processes=world_size)


def start(function: Callable[..., None], *args: Any, processes: int = 2) -> None:
    """Run ``function(index, *args)`` in ``processes`` forked processes, in the caller's environment
    and working directory (``torch.multiprocessing.spawn``'s contract, its ``ProcessRaisedException``
    or ``ProcessExitedException`` included)."""
    multiprocessing.set_forkserver_preload(_PRELOAD)  # read when the server starts, at the first call
    caller = (dict(os.environ), os.getcwd())
    mp.start_processes(_in_caller_environment, args=(function, caller, args), nprocs=processes, start_method="forkserver")


def _in_caller_environment(index: int, function: Callable[..., None], caller: tuple[dict[str, str], str], args: tuple) -> None:
    environment, cwd = caller
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    function(index, *args)


def _rank_main(rank: int, worker: Callable[..., None], init_file: str, world_size: int, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        worker(rank, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
