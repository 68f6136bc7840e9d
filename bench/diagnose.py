"""Time-to-answer of ``torchdebug.diagnose`` against PyTorch's accuracy minifier, on one planted bug.

    python bench/diagnose.py [--model gpt|llama|unet] [--bug planted|inductor] [--minifier-timeout 900]
                             [--skip-minifier] [--layers 2] [--cold]

Three programs, forward and backward, on the CPU. The first two carry inductor's planted
``cpp.inject_relu_bug_TESTING_ONLY = "accuracy"`` (every relu inductor generates adds 1):

- ``gpt`` (default): the GPT example (``examples/gpt.py``; 2 layers, d_model 64, 4 heads, seq 32,
  vocab 128, batch 4, loss) with its MLP activation swapped for ``torch.relu`` (inductor's planted
  bug hits relu only). The right answer: stage inductor, node ``relu``, module ``layers.0.mlp``,
  the relu line.
- ``llama``: a Llama-3-style decoder written below (2 layers, dim 64, 4 heads, seq 32, vocab 128,
  batch 2, logits): fused QKV projection, RoPE from a complex64 frequency buffer (``torch.polar``,
  ``view_as_complex``), ``F.scaled_dot_product_attention`` (the CPU flash kernel, a multi-output
  op) and a ReLU-GLU feed-forward. The right answer: stage inductor, node ``relu``, module
  ``layers.0.ffn``, the relu line.
- ``unet``: the diagnose tests' diffusers-style UNet (``tests/diagnose/unet.py``: two down and two up
  blocks, GroupNorm, SiLU, a time embedding, nearest upsampling; 8x8 images, batch 2) with a
  backward bug that shows only with its neighbour: ``--bug planted`` (default) installs the tests'
  ``ScatterReadTooEarly`` post-grad pass (what reads nearest upsampling's backward scatter reads the
  zero buffer before the scatter); ``--bug inductor`` plants nothing and relies on inductor's own
  bug on this model (torch 2.13: the same gradients come out 0). The right answer: stage inductor,
  a backward ``aten.div.Tensor`` in ``up_blocks.0.resnets.1``, the ``OUTPUT LINE`` (with the planted
  bug on torch 2.14, which drops a div by 1.0: the shortcut convolution's backward, the
  ``SHORTCUT LINE``); and ``repro.py`` must exit 1.

What runs:

- torchdebug: ``torchdebug.diagnose(model, *inputs)`` in a fresh process; we time the call (wall
  and the process's CPU time; inductor's C++ compiles run in other processes) and the whole process,
  check the answer and report inductor's FX graph cache hits and misses (on a warm cache the
  instrumented forward and backward graphs are hits), then run the ``repro.py`` it wrote and report
  its exit status and verdict line. With ``--profile`` the call runs under cProfile and the
  functions that took the most cumulative time are printed (where the time goes).
- PyTorch: ``TORCHDYNAMO_REPRO_AFTER=aot TORCHDYNAMO_REPRO_LEVEL=4`` on the same training step
  (detects the loss and writes ``minifier_launcher.py``), then ``minifier_launcher.py minify`` with a
  time limit; we time both and check whether the minified ``repro.py`` holds ``aten.relu``.
- Baseline: the same training step compiled with plain inductor (no diagnose), so the time of the
  compile any run of the model pays can be told from what diagnose adds.
Each runs on inductor's caches as this machine has them, or with ``--cold`` on empty ones
(``TORCHINDUCTOR_CACHE_DIR`` in the run's temporary folder). Each prints one JSON line, then
``uptime`` (other jobs share the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_GPT = """
import sys, time
sys.path.insert(0, {root!r})
import torch
from examples.gpt import GPT, GPTConfig, MLP, make_batch
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
EXPECTED_MODULE, EXPECTED_TARGET, MARKER = "layers.0.mlp", "aten.relu.default", "RELU LINE"
LINE_FILE = __file__


class ReluMLP(MLP):
    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))  # RELU LINE


def make_model_and_inputs():
    torch.manual_seed(0)
    config = GPTConfig(n_layer={layers}, d_model=64, n_head=4, seq_len=32, vocab=128)
    model = GPT(config)
    for block in model.layers:
        block.mlp.__class__ = ReluMLP
    return model, make_batch(config, batch=4)
"""

_LLAMA = """
import sys, time
sys.path.insert(0, {root!r})
import torch
import examples.llama
from examples.llama import Llama
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
EXPECTED_MODULE, EXPECTED_TARGET, MARKER = "layers.0.ffn", "aten.relu.default", "RELU LINE"
LINE_FILE = examples.llama.__file__


def make_model_and_inputs():
    torch.manual_seed(0)
    model = Llama(layers={layers})
    return model, (torch.randint(0, 128, (2, 32)),)
"""

_UNET = """
import sys, time
sys.path.insert(0, {root!r})
import torch
import tests.diagnose.unet
from tests.diagnose.models import ScatterReadTooEarly
from tests.diagnose.unet import tiny_unet
if {planted!r}:
    torch._inductor.config.post_grad_custom_post_pass = ScatterReadTooEarly()
EXPECTED_MODULE, EXPECTED_TARGET, MARKER = "up_blocks.0.resnets.1", "aten.div.Tensor", "OUTPUT LINE"
if torch.torch_version.TorchVersion(torch.__version__) >= "2.14":  # torch 2.14 drops a div by 1.0
    EXPECTED_MODULE, EXPECTED_TARGET, MARKER = (
        "up_blocks.0.resnets.1.conv_shortcut", "aten.convolution_backward.default", "SHORTCUT LINE"
    )
LINE_FILE = tests.diagnose.unet.__file__


def make_model_and_inputs():
    return tiny_unet()  # two blocks each way, one ResNet each (--layers does not apply)
"""

_PROGRAMS = {"gpt": _GPT, "llama": _LLAMA, "unet": _UNET}

_OURS = """
import cProfile, json, os, pstats, subprocess, torchdebug.diagnose as td
start, cpu = time.perf_counter(), time.process_time()
model, inputs = make_model_and_inputs()
profile = cProfile.Profile() if {profile!r} else None
if profile:
    profile.enable()
report = td.diagnose(model, *inputs, output_dir={out!r})
if profile:
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
print(report.summary(), file=sys.stderr)
line = next(i for i, l in enumerate(open(LINE_FILE), 1) if l.rstrip().endswith("# " + MARKER))
right = report.stage == "inductor" and report.finding is not None and report.finding.target == EXPECTED_TARGET \\
    and report.module == EXPECTED_MODULE \\
    and report.source is not None and report.source.startswith(f"{{LINE_FILE}}:{{line}} ")
env = {{**os.environ, "PYTHONPATH": {root!r}}}  # the planted pass is imported from tests/ by the repro
repro = report.repro_path and subprocess.run([sys.executable, str(report.repro_path)], capture_output=True, text=True, env=env)
repro_says = [l for l in repro.stdout.splitlines() if l.startswith(("REPRO:", "no problem"))] if repro else []
fx_cache = {{k: v for k, v in torch._dynamo.utils.counters["inductor"].items() if k.startswith("fxgraph_cache")}}
print(json.dumps({{"tool": "torchdebug.diagnose", "seconds": seconds, "cpu_seconds": cpu, "right": right,
                  "stages": {{s.stage.label: round(s.seconds, 2) for s in report.stages}}, "fx_graph_cache": fx_cache,
                  "answer": report.finding.describe() if report.finding else None, "notes": report.notes,
                  "repro": getattr(report.finding, "scope", None),
                  "repro_exit": repro.returncode if repro else None, "repro_says": repro_says[-1:]}}))
"""

_PLAIN = """
import json
start = time.perf_counter()
model, batch = make_model_and_inputs()
out = torch.compile(model)(*batch)
(out if out.dim() == 0 else out.square().mean()).backward()
print(json.dumps({"tool": "plain inductor compile + step", "seconds": time.perf_counter() - start}))
"""

_MINIFIER_RUN = """
model, batch = make_model_and_inputs()
compiled = torch.compile(model)
try:
    out = compiled(*batch)
    (out if out.dim() == 0 else out.square().mean()).backward()
    print("no accuracy error detected")
except Exception as error:
    print(type(error).__name__, str(error).splitlines()[0] if str(error) else "")
"""


def _run(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str] | None]:
    start = time.perf_counter()
    try:
        result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, None
    return time.perf_counter() - start, result


def _env(folder: Path, cold: bool) -> dict[str, str]:
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor_cache")} if cold else dict(os.environ)


def _program(model: str, layers: int, bug: str) -> str:
    return _PROGRAMS[model].format(root=str(ROOT), layers=layers, planted=bug == "planted")


def ours(folder: Path, model: str, layers: int, cold: bool, bug: str = "planted", profile: bool = False) -> dict[str, object]:
    script = folder / "ours.py"
    script.write_text(_program(model, layers, bug) + _OURS.format(out=str(folder / "out"), profile=profile, root=str(ROOT)))
    wall, result = _run([sys.executable, str(script)], folder, 1800, _env(folder, cold))
    if profile and result is not None:
        print(result.stderr, file=sys.stderr)
    assert result is not None and result.returncode == 0, result.stderr if result else "timed out"
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["process_seconds"] = wall
    return row


def plain(folder: Path, model: str, layers: int, cold: bool, bug: str = "planted") -> dict[str, object]:
    script = folder / "plain.py"
    script.write_text(_program(model, layers, bug) + _PLAIN)
    wall, result = _run([sys.executable, str(script)], folder, 600, _env(folder, cold))
    assert result is not None and result.returncode == 0, result.stderr if result else "timed out"
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["process_seconds"] = wall
    return row


def minifier(folder: Path, model: str, layers: int, limit: float, cold: bool, bug: str = "planted") -> dict[str, object]:
    script = folder / "minifier_run.py"
    script.write_text(_program(model, layers, bug) + textwrap.dedent(_MINIFIER_RUN))
    env = {
        **_env(folder, cold),
        "TORCHDYNAMO_REPRO_AFTER": "aot",
        "TORCHDYNAMO_REPRO_LEVEL": "4",
        "TORCH_COMPILE_DEBUG_DIR": str(folder),
    }
    detect, result = _run([sys.executable, str(script)], folder, limit, env)
    launchers = sorted(folder.rglob("minifier_launcher.py"))
    row: dict[str, object] = {
        "tool": "accuracy minifier",
        "detect_seconds": detect,
        "right": False,
        "detected": result.stdout.strip()[-200:] if result else "timed out",
    }
    if not launchers:
        row["seconds"] = detect
        return row
    minify, done = _run([sys.executable, str(launchers[-1]), "minify"], launchers[-1].parent, max(limit - detect, 1), env)
    repros = sorted(launchers[-1].parent.rglob("repro.py"))
    text = repros[-1].read_text() if repros else ""
    row.update(
        {
            "minify_seconds": minify,
            "seconds": detect + minify,
            "timed_out": done is None,
            "right": "aten.relu" in text and text.count("torch.ops.aten.") <= 3,
        }
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minifier-timeout", type=float, default=600.0, help="seconds for detection plus minification")
    parser.add_argument("--skip-minifier", action="store_true")
    parser.add_argument("--model", choices=sorted(_PROGRAMS), default="gpt", help="the program with the planted bug")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="empty inductor cache for each tool")
    parser.add_argument(
        "--bug", choices=("planted", "inductor"), default="planted", help="unet: the planted pass or inductor's own bug"
    )
    parser.add_argument("--profile", action="store_true", help="run diagnose under cProfile and print where the time goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "ours").mkdir()
        rows = [ours(Path(tmp) / "ours", args.model, args.layers, args.cold, args.bug, args.profile)]
        (Path(tmp) / "plain").mkdir()
        rows.append(plain(Path(tmp) / "plain", args.model, args.layers, args.cold, args.bug))
        if not args.skip_minifier:
            (Path(tmp) / "minifier").mkdir()
            rows.append(minifier(Path(tmp) / "minifier", args.model, args.layers, args.minifier_timeout, args.cold, args.bug))
    for row in rows:
        print(json.dumps(row))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    bug = f" ({args.bug} bug)" if args.model == "unet" else ""
    print(f"model: {args.model}{bug}; cache: {'cold' if args.cold else 'as found'}; load: {load}")


if __name__ == "__main__":
    main()
