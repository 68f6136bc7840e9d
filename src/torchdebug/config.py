"""Configuration of eager dumps (:class:`DebuggerConfig`) and the index-set syntax shared by filters.

Every way in — keyword arguments, a JSON or YAML file, the CLI — goes through the one constructor,
which checks each value and raises :class:`~torchdebug.errors.ConfigError` with one line naming the
key, the value received and what is allowed. The compile backend's options live beside the backend
(``torchdebug.compile``), not here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdebug.errors import ConfigError

TASKS = ("statistics", "tensor", "structure")
LEVELS = ("op", "module", "mix")
DATA_MODES = ("all", "forward", "backward", "input", "output")

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_index_set(key: str, value: Any) -> frozenset[int] | None:
    """Parse a step or rank selection; ``None`` (or empty) means "all".

    Accepts ``"0|3-5|10"``, ``[0, "3-5", 10]``, a single int, or ``None``. Ranges are inclusive.
    """
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{key}: got {value!r}, expected step/rank indices like [0, '3-5'] or '0|3-5'")
    if isinstance(value, int):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = value.split("|")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ConfigError(f"{key}: got {value!r}, expected step/rank indices like [0, '3-5'] or '0|3-5'")
    out: set[int] = set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.add(item)
            continue
        text = str(item).strip()
        match = _RANGE.match(text)
        if text.isdigit():
            out.add(int(text))
        elif match and int(match[1]) <= int(match[2]):
            out.update(range(int(match[1]), int(match[2]) + 1))
        else:
            raise ConfigError(
                f"{key}: got {item!r}, expected a non-negative integer or an inclusive range 'a-b' with a <= b"
            )
    return frozenset(out)


def read_mapping_file(path: str | Path, key: str) -> dict[str, Any]:
    """The mapping in a JSON or YAML (``.yaml``/``.yml``, needs pyyaml) file; errors name ``key``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"{key}: cannot read {path} ({error.strerror})") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # optional dependency, only for YAML files
        except ImportError:
            raise ConfigError(f"{key}: {path} is YAML; install pyyaml (pip install pyyaml) or use JSON") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{key}: {path} is not valid YAML ({error})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{key}: {path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} must hold a mapping, got {type(data).__name__}")
    return data


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        expected = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{key}: got {value!r}, expected one of {expected}")
    return value


def _name_list(key: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: got {value!r}, expected a list of non-empty name patterns")
    for pattern in value:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as error:
                raise ConfigError(f"{key}: pattern {pattern!r} is not a valid regex ({error})") from None
    return list(value)


def _doc(text: str, **schema: Any) -> dict[str, Any]:
    return {"doc": text, "schema": schema}


@dataclass(kw_only=True, slots=True)
class DebuggerConfig:
    """What an eager dump captures and where it writes (README "Options"; ``torchdebug config schema``)."""

    dump_path: str = field(default="./dump", metadata=_doc("Folder of the dump; each run gets a new subfolder.", type="string"))
    task: str = field(
        default="statistics",
        metadata=_doc(
            "statistics: dtype, shape and statistics per slot; tensor: also the tensors (safetensors); "
            "structure: names, shapes and stacks only.",
            enum=list(TASKS),
        ),
    )
    level: str = field(
        default="op",
        metadata=_doc(
            "op: every aten op; module: nn.Module inputs, outputs, parameters and parameter grads "
            "(needs a model); mix: both.",
            enum=list(LEVELS),
        ),
    )
    data_mode: list[str] = field(
        default_factory=lambda: ["all"],
        metadata=_doc(
            "Which slots to keep: any of all, forward, backward, input, output "
            "(forward/backward select phases, input/output select slots; optimizer ops count as forward).",
            type="array",
            items={"enum": list(DATA_MODES)},
        ),
    )
    step: frozenset[int] | None = field(
        default=None,
        metadata=_doc("Steps to dump, e.g. [0, '3-5'] or '0|3-5|10'; empty means every step.", type=["array", "string", "integer", "null"]),
    )
    rank: frozenset[int] | None = field(
        default=None,
        metadata=_doc("Ranks that dump, same syntax as step; empty means every rank.", type=["array", "string", "integer", "null"]),
    )
    list: list[str] = field(
        default_factory=lambda: [],
        metadata=_doc(
            "Dump only op calls whose name matches one entry: an exact call name, a substring, or 're:REGEX'.",
            type="array",
            items={"type": "string"},
        ),
    )
    range: list[str] = field(
        default_factory=lambda: [],
        metadata=_doc(
            "[FROM, TO]: dump the op calls from the first call matching FROM to the first later call matching TO, inclusive.",
            type="array",
            items={"type": "string"},
            minItems=2,
            maxItems=2,
        ),
    )
    tensor_list: list[str] = field(
        default_factory=lambda: [],
        metadata=_doc(
            "With task=tensor: save tensors only for calls matching these patterns; statistics for everything else.",
            type="array",
            items={"type": "string"},
        ),
    )
    stack: str | list[str] = field(
        default="all",
        metadata=_doc(
            "Call stacks to record: 'all', 'none', or [FROM, TO] to record stacks only for that range of calls.",
            type=["string", "array"],
        ),
    )
    sample_stride: int = field(
        default=0,
        metadata=_doc(
            "With task=tensor: save big tensors sampled as the first 256, every k-th and the last 256 elements "
            "(k = sample_stride); 0 or 1 saves whole tensors.",
            type="integer",
            minimum=0,
        ),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.dump_path, (str, Path)) or not str(self.dump_path):
            raise ConfigError(f"dump_path: got {self.dump_path!r}, expected a folder path")
        self.dump_path = str(self.dump_path)
        _choice("task", self.task, TASKS)
        _choice("level", self.level, LEVELS)
        modes = [self.data_mode] if isinstance(self.data_mode, str) else self.data_mode
        if not isinstance(modes, (list, tuple)) or not modes:
            raise ConfigError(f"data_mode: got {self.data_mode!r}, expected a list of {', '.join(DATA_MODES)}")
        self.data_mode = [_choice("data_mode", m, DATA_MODES) for m in modes]
        self.step = parse_index_set("step", self.step)
        self.rank = parse_index_set("rank", self.rank)
        self.list = _name_list("list", self.list)
        self.range = _name_list("range", self.range)
        if self.range and len(self.range) != 2:
            raise ConfigError(f"range: got {self.range!r}, expected two call names [FROM, TO]")
        self.tensor_list = _name_list("tensor_list", self.tensor_list)
        if self.tensor_list and self.task != "tensor":
            raise ConfigError(f"tensor_list: needs task='tensor', got task={self.task!r}")
        if isinstance(self.stack, str):
            _choice("stack", self.stack, ("all", "none"))
        else:
            self.stack = _name_list("stack", self.stack)
            if len(self.stack) != 2:
                raise ConfigError(f"stack: got {self.stack!r}, expected 'all', 'none' or two call names [FROM, TO]")
        if isinstance(self.sample_stride, bool) or not isinstance(self.sample_stride, int) or self.sample_stride < 0:
            raise ConfigError(f"sample_stride: got {self.sample_stride!r}, expected an integer >= 0 (0 disables sampling)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DebuggerConfig:
        """Build from a plain dict, rejecting unknown keys by name."""
        if not isinstance(data, dict):
            raise ConfigError(f"config: got {type(data).__name__}, expected a mapping of option names to values")
        known = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in known:
                raise ConfigError(f"{key}: unknown config key, expected one of {', '.join(known)}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> DebuggerConfig:
        """Load a JSON or YAML (``.yaml``/``.yml``, needs pyyaml) file; ``overrides`` win."""
        data = read_mapping_file(path, "config")
        return cls.from_dict({**data, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (index sets as sorted lists)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = sorted(value) if isinstance(value, frozenset) else value
        return out

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """JSON schema of the config file, generated from the field metadata."""
        properties = {}
        for f in dataclasses.fields(cls):
            prop = {"description": f.metadata["doc"], **f.metadata["schema"]}
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            prop["default"] = default
            properties[f.name] = prop
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "torchdebug DebuggerConfig",
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
