"""Configuration of eager dumps (:class:`DebuggerConfig`) and reading config files.

Every way in — keyword arguments, a JSON or YAML file, the CLI — goes through the one constructor,
which checks each value and raises :class:`~torchdebug.errors.ConfigError` with one line naming the
key, the value received and what is allowed (:mod:`torchdebug.options` holds the shared kind of
config object and its validators). The compile backend's options live beside the backend
(``torchdebug.compile``), compare's and diagnose's beside theirs.
"""

from __future__ import annotations

import json
from dataclasses import field
from pathlib import Path
from typing import Any

from torchdebug.errors import ConfigError
from torchdebug.options import Options, boolean, choices, configclass, index_set, number, one_of, option, patterns, text

ON_WRITE_ERROR = ("continue", "raise")
"""What a failed write of the dump does (``on_write_error``, of the Debugger and the Monitor)."""

TASKS = ("statistics", "tensor", "structure", "overflow_check", "checksum")
COMPILED_CODE = ("as_run", "eager")
LEVELS = ("op", "module", "mix")
DATA_MODES = ("all", "forward", "backward", "input", "output")

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
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


def _pair(what: str) -> Any:
    def check(key: str, value: Any) -> list[str]:
        names = patterns(key, value)
        if names and len(names) != 2:
            raise ConfigError(f"{key}: got {value!r}, expected {what}")
        return names

    return check


def _stack(key: str, value: Any) -> str | list[str]:
    if isinstance(value, str):
        return one_of("all", "none")(key, value)
    names = patterns(key, value)
    if len(names) != 2:
        raise ConfigError(f"{key}: got {value!r}, expected 'all', 'none' or two call names [FROM, TO]")
    return names


def _overflow_nums(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        raise ConfigError(f"{key}: got {value!r}, expected an integer >= 1, or -1 for no limit")
    return value


@configclass
class DebuggerConfig(Options):
    """What an eager dump captures and where it writes (docs/capture.md, "Options"; ``torchdebug config schema``)."""

    dump_path: str = field(
        default="./dump",
        metadata=option("Folder of the dump; each run gets a new subfolder.", text("a folder path"), type="string"),
    )
    task: str = field(
        default="statistics",
        metadata=option(
            "statistics: dtype, shape and statistics per slot; tensor: also the tensors (safetensors); "
            "structure: names, shapes and stacks only; overflow_check: check every op's outputs for NaN/Inf and "
            "record only the overflowing ops, with their tensors; checksum: a 64-bit fingerprint of every tensor's bits.",
            one_of(*TASKS),
            enum=list(TASKS),
        ),
    )
    level: str = field(
        default="op",
        metadata=option(
            "op: every aten op; module: nn.Module inputs, outputs, parameters and parameter grads (needs a model); mix: both.",
            one_of(*LEVELS),
            enum=list(LEVELS),
        ),
    )
    data_mode: list[str] = field(
        default_factory=lambda: ["all"],
        metadata=option(
            "Which slots to keep: any of all, forward, backward, input, output "
            "(forward/backward select phases, input/output select slots; optimizer ops count as forward).",
            choices(DATA_MODES),
            type="array",
            items={"enum": list(DATA_MODES)},
        ),
    )
    step: frozenset[int] | None = field(
        default=None,
        metadata=option(
            "Steps to dump, e.g. [0, '3-5'] or '0|3-5|10'; empty means every step.",
            index_set,
            type=["array", "string", "integer", "null"],
        ),
    )
    rank: frozenset[int] | None = field(
        default=None,
        metadata=option(
            "Ranks that dump, same syntax as step; empty means every rank.",
            index_set,
            type=["array", "string", "integer", "null"],
        ),
    )
    list: list[str] = field(
        default_factory=lambda: [],
        metadata=option(
            "Dump only op calls whose name matches one entry: an exact call name, a substring, or 're:REGEX'.",
            patterns,
            type="array",
            items={"type": "string"},
        ),
    )
    range: list[str] = field(
        default_factory=lambda: [],
        metadata=option(
            "[FROM, TO]: dump the op calls from the first call matching FROM to the first later call matching TO, inclusive.",
            _pair("two call names [FROM, TO]"),
            type="array",
            items={"type": "string"},
            minItems=2,
            maxItems=2,
        ),
    )
    tensor_list: list[str] = field(
        default_factory=lambda: [],
        metadata=option(
            "With task=tensor: save tensors only for calls matching these patterns; statistics for everything else.",
            patterns,
            type="array",
            items={"type": "string"},
        ),
    )
    stack: str | list[str] = field(
        default="all",
        metadata=option(
            "Call stacks to record: 'all', 'none', or [FROM, TO] to record stacks only for that range of calls.",
            _stack,
            type=["string", "array"],
        ),
    )
    sample_stride: int = field(
        default=0,
        metadata=option(
            "With task=tensor: save big tensors sampled as the first 256, every k-th and the last 256 elements "
            "(k = sample_stride); 0 or 1 saves whole tensors.",
            number(0, integer=True),
            type="integer",
            minimum=0,
        ),
    )
    tensor_bytes_in_flight: int = field(
        default=TENSOR_BYTES_IN_FLIGHT,
        metadata=option(
            "With task=tensor or overflow_check: bytes of host buffers (pinned when CUDA is present) that hold tensor "
            "snapshots until they are written (device copies made for transfers from CUDA stay within the same figure); "
            "once they are full, capture waits for the disk instead of taking more memory. At least 1 MiB (1048576); "
            "default 256 MiB (268435456).",
            number(2**20, integer=True),
            type="integer",
            minimum=2**20,
        ),
    )

    compiled_code: str = field(
        default="as_run",
        metadata=option(
            "torch.compile'd code in a captured step. as_run: it runs compiled, and the dump holds only the ops it "
            "calls through aten (inductor's extern kernels, not what its fused kernels compute; the torchdebug "
            "backend's data dump records those). eager: captured steps run it eagerly "
            "(torch.compiler.set_stance('force_eager')), so every op is recorded with its module path and source line; "
            "the other steps stay compiled.",
            one_of(*COMPILED_CODE),
            enum=[*COMPILED_CODE],
        ),
    )

    overflow_nums: int = field(
        default=1,
        metadata=option(
            "With task=overflow_check: stop recording after this many overflowing op calls in the run; -1 records them all.",
            _overflow_nums,
            type="integer",
            minimum=-1,
            **{"not": {"const": 0}},
        ),
    )
    on_write_error: str = field(
        default="continue",
        metadata=option(
            "When writing the dump fails (a full disk, a quota, a read-only or broken filesystem): continue: one warning, "
            "capture stops, training goes on and the dump is marked truncated; raise: DumpError from the next "
            "start/stop/step/flush/close.",
            one_of(*ON_WRITE_ERROR),
            enum=[*ON_WRITE_ERROR],
        ),
    )
    checksum: bool = field(
        default=False,
        metadata=option(
            "Also store a 64-bit fingerprint of each tensor's bits (task=statistics, tensor or overflow_check), "
            "so that two dumps can be compared bit for bit; task=checksum stores only that.",
            boolean,
            type="boolean",
        ),
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
        return cls.from_dict({**data, **overrides})  # type: ignore[return-value]
