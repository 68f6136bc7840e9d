"""Step and compile time of the compiled GPT training step with a statistics dump of every node vs without.

    python bench/graph_dump.py [--sizes 768x1024,256x128] [--steps 10] [--batch 8] [--device cpu|cuda]
    python bench/graph_dump.py --recompile [--sizes 256x128] [--batch 8] [--model gpt|llama]

For each size ``DxS`` (d_model x seq_len, one layer): one process, two compiled copies of the same
model (inductor through the torchdebug backend; one with ``dump_config.enable_dump`` and
``task="statistics"``, every node selected). Compile time is the first training step of each copy
(forward and backward graphs compiled, plus the step itself) with every compile cache off for both,
so the plain copy pays the same cold compile as the dumped one (the dump turns the caches off; a
warm FX graph cache would otherwise make the plain compile look ten times faster); a throwaway
compile first takes the process's one-time inductor start-up out of both. After one more untimed
step each, the arms alternate step by step (ABBA) and the median step time of each is reported
with their ratio. Targets (issue 17 on an H100): step ratio at most 1.15 at d768 and 2 at d256,
compile with the dump at most 2x the plain compile. On ``--device cuda`` each step is timed between
two ``torch.cuda.synchronize()`` calls.

``--recompile`` times the recompile with symbolic shapes instead (issue 26): each copy compiles and
runs a step at ``seq_len``, then one at ``seq_len / 2`` (Dynamo's automatic dynamic shapes recompile
the model with a symbolic sequence length: that step is timed, forward and backward graphs), then
one at ``3 seq_len / 4``, which reuses the symbolic graph (its time shows no compile). Wall time and
CPU time (this process and the compiler processes it waited for) are printed: on a shared box the
CPU time is the steadier figure. Target: recompile with the dump at most 2x the plain recompile.
``--model llama`` runs issue 26's model instead (``examples/llama.py``: 2 layers, dim 64, fused
QKV, complex RoPE buffer, SDPA; batch 2, lengths 32, 16, 24; ``--sizes`` is ignored).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.gpt import GPT, GPTConfig, make_batch, train_step  # noqa: E402
from examples.llama import Llama  # noqa: E402
from torchdebug.compile import CompilerConfig, get_backend  # noqa: E402
from torchdebug.store._reader import RankDump  # noqa: E402


def _compiled(model: torch.nn.Module, dump: bool) -> tuple[object, torch.nn.Module, torch.optim.Optimizer]:
    """``(backend, compiled model, optimizer)``: inductor through torchdebug's backend, with a
    statistics dump of every node into a fresh temporary folder when ``dump``."""
    options = CompilerConfig()
    if dump:
        options.dump_config.enable_dump = True
        options.dump_config.dump_path = tempfile.mkdtemp(prefix="torchdebug_graph_dump_")
        options.dump_config.task = "statistics"
    backend = get_backend(options)
    return backend, torch.compile(model, backend=backend), torch.optim.AdamW(model.parameters(), lr=1e-4)


class _Arm:
    """One compiled copy of the model: its backend, optimizer and compile time."""

    def __init__(self, config: GPTConfig, dump: bool, device: str, batch: int, sync: object) -> None:
        torch.manual_seed(0)
        self.model = GPT(config).to(device)
        self.backend, self.compiled, self.optimizer = _compiled(self.model, dump)
        with torch.compiler.config.patch(force_disable_caches=True):
            start = time.perf_counter()
            self.step(make_batch(config, batch, seed=0, device=device))
            sync()  # type: ignore[operator]
            self.compile_s = time.perf_counter() - start
        self.step(make_batch(config, batch, seed=1, device=device))

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        train_step(self.compiled, self.optimizer, batch)


def _cpu_seconds() -> float:
    """CPU time of this process and of the child processes it waited for (inductor's C++ compiles)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class _RecompileArm:
    """One compiled copy, run at three sequence lengths; the second one recompiles with symbolic sizes."""

    def __init__(self, config: GPTConfig, dump: bool, device: str, batch: int, sync: object, model: str) -> None:
        torch.manual_seed(0)
        self.config, self.batch, self.device, self.sync = config, batch, device, sync
        if model == "llama":
            self.model = Llama(
                vocab=config.vocab, dim=config.d_model, heads=config.n_head, layers=config.n_layer, seq=config.seq_len
            )
        else:
            self.model = GPT(config)
        self.model.to(device)
        self.backend, self.compiled, self.optimizer = _compiled(self.model, dump)
        self.first = self._timed(config.seq_len)
        self.recompile = self._timed(config.seq_len // 2)
        self.reuse = self._timed(config.seq_len * 3 // 4)

    def _timed(self, length: int) -> tuple[float, float]:
        """``(wall, CPU)`` seconds of one training step at ``length`` tokens, caches off."""
        tokens, targets = make_batch(self.config, self.batch, seed=length, device=self.device)
        batch = tokens[:, :length].contiguous(), targets[:, :length].contiguous()
        with torch.compiler.config.patch(force_disable_caches=True):
            cpu, start = _cpu_seconds(), time.perf_counter()
            train_step(self.compiled, self.optimizer, batch)
            self.sync()  # type: ignore[operator]
            return time.perf_counter() - start, _cpu_seconds() - cpu


def _bench_recompile(d_model: int, seq_len: int, args: argparse.Namespace) -> None:
    sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)
    if args.model == "llama":
        config = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab=128)
        title = "Llama layers=2 dim=64 (fused QKV, complex RoPE, SDPA)"
    else:
        config = GPTConfig(n_layer=1, d_model=d_model, n_head=4, seq_len=seq_len, vocab=512)
        title = f"GPT n_layer=1 d_model={d_model}"
    seq_len = config.seq_len
    arms = {}
    for name in ("plain", "dump"):
        # Dynamo keeps which sizes changed per code object: a second arm would compile the length
        # as symbolic from its first step. Each arm starts from a fresh Dynamo (the first arm is done).
        torch._dynamo.reset()
        arms[name] = _RecompileArm(config, name == "dump", args.device, args.batch, sync, args.model)
    print(f"{title} batch={args.batch} on {args.device}, every node dumped, caches off:")
    for label, part in (("first compile", "first"), ("recompile", "recompile"), ("reused", "reuse")):
        (wall_p, cpu_p), (wall_d, cpu_d) = (getattr(arms[name], part) for name in ("plain", "dump"))
        print(
            f"  {label:<13} plain {wall_p:6.1f} s (CPU {cpu_p:6.1f} s), dump {wall_d:6.1f} s (CPU {cpu_d:6.1f} s), "
            f"ratio {wall_d / wall_p:.2f} (CPU {cpu_d / cpu_p:.2f})"
        )
    backend = arms["dump"].backend
    backend.data_dump.close()
    records = len(RankDump.open(backend.data_dump.rank_dir).records())
    print(f"  {records} records in 3 steps (lengths {seq_len}, {seq_len // 2}, {seq_len * 3 // 4})")


def _warm_up_inductor(device: str) -> None:
    """Compile something small once, so that neither arm pays inductor's process start-up."""
    with torch.compiler.config.patch(force_disable_caches=True):
        torch.compile(lambda x: (x.sin() * 2).sum())(torch.randn(8, device=device))


def _bench(d_model: int, seq_len: int, args: argparse.Namespace) -> None:
    sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)
    config = GPTConfig(n_layer=1, d_model=d_model, n_head=4, seq_len=seq_len, vocab=512)
    arms = {
        "plain": _Arm(config, False, args.device, args.batch, sync),
        "dump": _Arm(config, True, args.device, args.batch, sync),
    }
    times: dict[str, list[float]] = {"plain": [], "dump": []}
    for step in range(args.steps):
        order = ("plain", "dump", "dump", "plain")[step % 2 * 2 :][:2]
        for name in order:
            batch = make_batch(config, args.batch, seed=step, device=args.device)
            sync()
            start = time.perf_counter()
            arms[name].step(batch)
            sync()
            times[name].append(time.perf_counter() - start)
    backend = arms["dump"].backend
    backend.data_dump.close()
    records = len(RankDump.open(backend.data_dump.rank_dir).records()) // (args.steps + 2)
    plain, dump = statistics.median(times["plain"]), statistics.median(times["dump"])
    compile_plain, compile_dump = arms["plain"].compile_s, arms["dump"].compile_s
    print(f"GPT n_layer=1 d_model={d_model} seq_len={seq_len} batch={args.batch} on {args.device}, every node dumped:")
    ratio = compile_dump / compile_plain
    print(f"  compile (first step, caches off): plain {compile_plain:.1f} s, dump {compile_dump:.1f} s, ratio {ratio:.2f}")
    print(
        f"  median step: plain {plain * 1e3:.1f} ms, dump {dump * 1e3:.1f} ms, ratio {dump / plain:.3f}, {records} records a step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="768x1024,256x128", help="d_model x seq_len per row, comma-separated")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--recompile", action="store_true", help="time the recompile with symbolic shapes instead")
    parser.add_argument("--model", choices=("gpt", "llama"), default="gpt", help="--recompile: the model (default gpt)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    _warm_up_inductor(args.device)
    sizes = args.sizes.split(",") if not (args.recompile and args.model == "llama") else ["64x32"]
    for size in sizes:
        d_model, seq_len = (int(part) for part in size.split("x"))
        (_bench_recompile if args.recompile else _bench)(d_model, seq_len, args)


if __name__ == "__main__":
    main()
