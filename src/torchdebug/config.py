"""Configuration of eager dumps (:class:`DebuggerConfig`) and reading config files.

Every way in — keyword arguments, a JSON or YAML file, the CLI — goes through the one constructor,
which checks each value and raises :class:`~torchdebug.errors.ConfigError` with one line naming the
key, the value received and what is allowed (:mod:`torchdebug.options` holds the shared kind of
config object and its validators). The compile backend's options live beside the backend
(``torchdebug.compile``), compare's and diagnose's beside theirs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from torchdebug.errors import ConfigError
from torchdebug.options import AtLeast, Check, Folder, Indices, Options, Patterns, configclass, one_of, option, patterns

OnWriteError = Literal["continue", "raise"]
"""What a failed write of the dump does (``on_write_error``, of the Debugger and the Monitor)."""
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
"""The modes ``torch.compile`` takes (``compile_mode``, of the compile backend and of diagnose)."""

TENSOR_BYTES_IN_FLIGHT = 256 * 2**20
"""Default of ``tensor_bytes_in_flight`` (256 MiB); the tensor writer's default too."""

PTDBG_LEVELS = {"L0": "module", "L1": "op"}
"""ptdbg's and msprobe's ``level`` codes, accepted in config files."""


def read_mapping_file(path: str | Path, key: str) -> dict[str, Any]:
    """The mapping in a JSON or YAML (``.yaml``/``.yml``, needs pyyaml) file; errors name ``key``."""
    path = Path(path)
    try:
        content = path.read_text()
    except OSError as error:
        raise ConfigError(f"{key}: cannot read {path} ({error.strerror})") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # optional dependency, only for YAML files
        except ImportError:
            raise ConfigError(f"{key}: {path} is YAML; install pyyaml (pip install pyyaml) or use JSON") from None
        try:
            data = yaml.safe_load(content) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{key}: {path} is not valid YAML ({error})") from None
    else:
        try:
            data = json.loads(content)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{key}: {path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} must hold a mapping, got {type(data).__name__}")
    return data


def _call_range(key: str, value: Any) -> list[str]:
    names = patterns(key, value)
    if names and len(names) != 2:
        raise ConfigError(f"{key}: got {value!r}, expected two call names [FROM, TO]")
    return names


def _stack(key: str, value: Any) -> str | list[str]:
    if isinstance(value, str):
        one_of("all", "none")(key, value)
        return value
    names = patterns(key, value)
    if len(names) != 2:
        raise ConfigError(f"{key}: got {value!r}, expected 'all', 'none' or two call names [FROM, TO]")
    return names


def _overflow_nums(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1, or -1 for no limit")
    return value


_NAMES = {"type": "array", "items": {"type": "string"}}
CallRange = Annotated[list[str], Check(_call_range, schema={**_NAMES, "minItems": 2, "maxItems": 2})]
Stack = Annotated[str | list[str], Check(_stack, schema={"type": ["string", "array"]})]


@configclass
class DebuggerConfig(Options):
    """What an eager dump captures and where it writes (docs/capture.md, "Options"; ``torchdebug config schema``)."""

    dump_path: Folder = option("Folder of the dump; each run gets a new subfolder.", default="./dump")
    task: Literal["statistics", "tensor", "structure", "overflow_check", "checksum"] = option(
        "statistics: dtype, shape and statistics per slot; tensor: also the tensors (safetensors); "
        "structure: names, shapes and stacks only; overflow_check: check every op's outputs for NaN/Inf and "
        "record only the overflowing ops, with their tensors; checksum: a 64-bit fingerprint of every tensor's bits.",
        default="statistics",
    )
    level: Literal["op", "module", "mix"] = option(
        "op: every aten op; module: nn.Module inputs, outputs, parameters and parameter grads (needs a model); mix: both.",
        default="op",
    )
    data_mode: list[Literal["all", "forward", "backward", "input", "output"]] = option(
        "Which slots to keep: any of all, forward, backward, input, output "
        "(forward/backward select phases, input/output select slots; optimizer ops count as forward).",
        default=["all"],
    )
    step: Indices = option("Steps to dump, e.g. [0, '3-5'] or '0|3-5|10'; empty means every step.", default=None)
    rank: Indices = option("Ranks that dump, same syntax as step; empty means every rank.", default=None)
    list: Patterns = option(
        "Dump only op calls whose name matches one entry: an exact call name, a substring, or 're:REGEX'.", default=[]
    )
    range: CallRange = option(
        "[FROM, TO]: dump the op calls from the first call matching FROM to the first later call matching TO, inclusive.",
        default=[],
    )
    tensor_list: Patterns = option(
        "With task=tensor: save tensors only for calls matching these patterns; statistics for everything else.", default=[]
    )
    stack: Stack = option(
        "Call stacks to record: 'all', 'none', or [FROM, TO] to record stacks only for that range of calls.", default="all"
    )
    sample_stride: Annotated[int, AtLeast(0)] = option(
        "With task=tensor: save big tensors sampled as the first 256, every k-th and the last 256 elements "
        "(k = sample_stride); 0 or 1 saves whole tensors.",
        default=0,
    )
    tensor_bytes_in_flight: Annotated[int, AtLeast(2**20)] = option(
        "With task=tensor or overflow_check: bytes of host buffers (pinned when CUDA is present) that hold tensor "
        "snapshots until they are written (device copies made for transfers from CUDA stay within the same figure); "
        "once they are full, capture waits for the disk instead of taking more memory. At least 1 MiB (1048576); "
        "default 256 MiB (268435456).",
        default=TENSOR_BYTES_IN_FLIGHT,
    )
    compiled_code: Literal["as_run", "eager"] = option(
        "torch.compile'd code in a captured step. as_run: it runs compiled, and the dump holds only the ops it "
        "calls through aten (inductor's extern kernels, not what its fused kernels compute; the torchdebug "
        "backend's data dump records those). eager: captured steps run it eagerly "
        "(torch.compiler.set_stance('force_eager')), so every op is recorded with its module path and source line; "
        "the other steps stay compiled.",
        default="as_run",
    )
    overflow_nums: Annotated[int, Check(_overflow_nums, schema={"type": "integer", "minimum": -1, "not": {"const": 0}})] = option(
        "With task=overflow_check: stop recording after this many overflowing op calls in the run; -1 records them all.",
        default=1,
    )
    on_write_error: OnWriteError = option(
        "When writing the dump fails (a full disk, a quota, a read-only or broken filesystem): continue: one warning, "
        "capture stops, training goes on and the dump is marked truncated; raise: DumpError from the next "
        "start/stop/step/flush/close.",
        default="continue",
    )
    checksum: bool = option(
        "Also store a 64-bit fingerprint of each tensor's bits (task=statistics, tensor or overflow_check), "
        "so that two dumps can be compared bit for bit; task=checksum stores only that.",
        default=False,
    )

    def check(self) -> None:
        if self.tensor_list and self.task != "tensor":
            raise ConfigError(f"tensor_list: needs task='tensor', got task={self.task!r}")
        if self.overflow_nums != 1 and self.task != "overflow_check":
            raise ConfigError(f"overflow_nums: needs task='overflow_check', got task={self.task!r}")
        if self.task == "overflow_check" and self.level != "op":
            raise ConfigError(f"level: task='overflow_check' checks op calls, expected level='op', got {self.level!r}")
        if self.checksum and self.task == "structure":
            raise ConfigError("checksum: needs task='statistics', 'tensor', 'overflow_check' or 'checksum', got task='structure'")

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> DebuggerConfig:
        """Load a JSON or YAML (``.yaml``/``.yml``, needs pyyaml) file; ``overrides`` win.

        ptdbg's and msprobe's ``level`` codes ``L0``/``L1`` in a file are read as ``module``/``op``.
        """
        data = read_mapping_file(path, "config")
        if data.get("level") in PTDBG_LEVELS:
            data["level"] = PTDBG_LEVELS[data["level"]]
        return cls.from_dict({**data, **overrides})
