"""Read msprobe (MindStudio Probe) dumps as torchdebug records, so either side of a compare can be one.

msprobe's ``PrecisionDebugger`` writes ``dump_path/step{N}/rank{R}/`` (``proc{pid}`` without
torch.distributed) holding ``dump.json``, ``stack.json``, ``construct.json`` and, with ``task=tensor``,
``dump_tensor_data/*.pt``. :func:`load` accepts the dump path, a step folder or a rank folder and
returns a :class:`~torchdebug.store._reader.Run`. How msprobe keys map to torchdebug names and
statistics: docs/compare.md, "Reading msprobe dumps".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from torchdebug.errors import DumpError
from torchdebug.records import MODULE_OP, NO_MODULE, Record, make_call_name, make_name
from torchdebug.store._reader import Run

__all__ = ["is_msprobe_dump", "load", "MsprobeRankDump"]

_DUMP = "dump.json"
_RANK_DIR = re.compile(r"^(rank(\d+)|proc\d+)$")
_STEP_DIR = re.compile(r"^step(\d+)$")
_FRAME = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<fn>[^,]*),?\s*\n?\s*(?P<code>.*)$", re.S)
_TORCH_FRAME = re.compile(r"[/\\](torch|msprobe)[/\\]")


def _rank_folders(path: Path) -> list[Path]:
    """Folders holding a dump.json at or below ``path`` (rank folder, step folder or dump path)."""
    if (path / _DUMP).is_file():
        return [path]
    found = sorted(child for child in path.iterdir() if child.is_dir() and (child / _DUMP).is_file())
    if found:
        return found
    return sorted(p.parent for p in path.glob(f"step*/*/{_DUMP}"))


def is_msprobe_dump(path: Path) -> bool:
    """Whether ``path`` is (or contains) an msprobe dump rather than a torchdebug one."""
    return path.is_dir() and bool(_rank_folders(path))


def _read_json(path: Path, required: bool) -> Any:
    if not path.is_file():
        if required:
            raise DumpError(f"{path}: missing; not a complete msprobe dump folder")
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DumpError(f"{path}: unreadable msprobe file ({error}); the dump is truncated or damaged") from None


def _parse_key(key: str) -> tuple[str, str, str, int]:
    """``(phase, module, op, call)`` of a dump.json key; ``module`` is only known for Module keys."""
    parts = key.split(".")
    try:
        if parts[0] == "Module" and parts[-2] in ("forward", "backward", "parameters_grad"):
            phase = "backward" if parts[-2] != "forward" else "forward"
            return phase, ".".join(parts[1:-3]) or NO_MODULE, MODULE_OP, int(parts[-1])
        if parts[-1] in ("forward", "backward"):
            return parts[-1], "", ".".join(parts[:-2]), int(parts[-2])
    except (ValueError, IndexError):
        pass
    raise DumpError(f"msprobe key {key!r} is not of the form Type.api.N.forward|backward or Module.path.Class.forward.N")


def _frames(raw: list[str]) -> list[str]:
    """msprobe frames (innermost first, ``File f, line n, in fn, \\n code``) as ours, outermost first."""
    frames = []
    for text in reversed(raw):
        match = _FRAME.match(text.strip())
        frames.append(
            f'File "{match["file"]}", line {match["line"]}, in {match["fn"]}: {match["code"].strip()}' if match else text
        )
    return frames


def _source(raw: list[str]) -> str | None:
    for text in raw:  # innermost first: the first frame outside torch and msprobe
        match = _FRAME.match(text.strip())
        if match and not _TORCH_FRAME.search(match["file"]):
            return f"{match['file']}:{match['line']} in {match['fn']}"
    return None


@dataclass
class _Folder:
    """One ``step{N}/rank{R}`` folder."""

    path: Path
    step: int


@dataclass
class MsprobeRankDump:
    """One rank of an msprobe dump, over all its steps: a :class:`~torchdebug.store._reader.RankRecords`."""

    rank: int
    folders: list[_Folder]
    complete: bool = True
    truncated: bool = False
    _stacks: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @property
    def path(self) -> Path:
        return self.folders[0].path

    @cached_property
    def _records(self) -> list[Record]:
        records: list[Record] = []
        for folder in self.folders:
            records.extend(self._read_folder(folder))
        return records

    def records(self) -> list[Record]:
        """All records, step by step, in dump.json order."""
        return self._records

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def stack(self, record: Record) -> list[str]:
        """The call stack of a record, outermost frame first."""
        self._records  # noqa: B018 - reading the folders fills the stacks
        return self._stacks.get(record.stack or "", [])

    def load_tensor(self, record: Record, device: str = "cpu") -> torch.Tensor:
        """The ``.pt`` tensor of a record (task=tensor), loaded without pickle code execution."""
        if not record.tensor or "file" not in record.tensor:
            raise DumpError(f"{record.name}: no tensor saved for this record (msprobe task=statistics)")
        path = Path(record.tensor.get("folder", self.path)) / record.tensor["file"]
        if not path.is_file():
            raise DumpError(f"{record.name}: tensor file {path} is missing")
        return torch.load(path, map_location=device, weights_only=True)

    def _read_folder(self, folder: _Folder) -> list[Record]:
        dump = _read_json(folder.path / _DUMP, required=True)
        data = dump.get("data") if isinstance(dump, dict) else None
        if not isinstance(data, dict):
            raise DumpError(f"{folder.path / _DUMP}: no 'data' object; not an msprobe dump.json")
        construct = _read_json(folder.path / "construct.json", required=False) or {}
        stack_keys: dict[str, str] = {}
        sources: dict[str, str | None] = {}
        for stack_id, entry in (_read_json(folder.path / "stack.json", required=False) or {}).items():
            if isinstance(entry, list) and len(entry) == 2:
                sid = f"step{folder.step}:{stack_id}"
                self._stacks[sid] = _frames(entry[1])
                sources[sid] = _source(entry[1])
                for key in entry[0]:
                    stack_keys[key] = sid
        records: list[Record] = []
        for seq, (key, call) in enumerate(data.items()):
            phase, module, op, number = _parse_key(key)
            if op != MODULE_OP:
                parent = construct.get(key)
                module = _parse_key(parent)[1] if parent else NO_MODULE
            sid = stack_keys.get(key)
            fwd = _forward_call(key, construct) if phase == "backward" else None
            context = {
                "step": folder.step,
                "rank": self.rank,
                "phase": phase,
                "module": module,
                "op": op,
                "call": number,
                "seq": seq,
                "stack": sid,
                "source": sources.get(sid) if sid else None,
                "fwd": fwd,
            }
            for io, arg, entry in _slots(key, call):
                records.append(_record(entry, io, arg, context, folder.path))
        return records


def _forward_call(key: str, construct: dict[str, Any]) -> str | None:
    """The call name of the forward call a backward key differentiates (its saved tensors live there)."""
    forward_key = key.replace(".backward", ".forward").replace(".parameters_grad.", ".forward.")
    _, module, op, number = _parse_key(forward_key)
    if op != MODULE_OP:
        parent = construct.get(forward_key)
        module = _parse_key(parent)[1] if parent else NO_MODULE
    return make_call_name("forward", module, op, number)


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _flatten(f"{prefix}.{index}" if prefix else str(index), item)
    elif isinstance(value, dict):
        yield prefix, value


def _slots(key: str, call: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(io, arg, entry)`` for every tensor or value of one dump.json call."""
    if ".parameters_grad." in key:
        for name, entries in call.items():
            for arg, entry in _flatten("", entries if isinstance(entries, list) else [entries]):
                yield "parameter_grad", name if arg == "0" else f"{name}.{arg}", entry
        return
    for section, io in (("input_args", "input"), ("input", "input"), ("output", "output")):
        for arg, entry in _flatten("", call.get(section) or []):
            yield io, arg, entry
    for name, entry in (call.get("input_kwargs") or {}).items():
        for arg, item in _flatten(name, entry):
            yield "input", arg, item
    for name, entry in (call.get("parameters") or {}).items():
        for arg, item in _flatten(name, entry):
            yield "parameter", arg, item


def _record(entry: dict[str, Any], io: str, arg: str, context: dict[str, Any], folder: Path) -> Record:
    name = make_name(context["phase"], context["module"], context["op"], context["call"], io, arg)
    if entry.get("type") != "torch.Tensor":
        return Record(name=name, io=io, arg=arg, kind="value", value=entry.get("value"), **context)
    data_name = entry.get("data_name")
    return Record(
        name=name,
        io=io,
        arg=arg,
        kind="tensor",
        dtype=str(entry.get("dtype", "")).removeprefix("torch.") or None,
        shape=list(entry.get("shape") or []),
        requires_grad=entry.get("requires_grad"),
        stats={"min": entry.get("Min"), "max": entry.get("Max"), "mean": entry.get("Mean"), "norm": entry.get("Norm")},
        tensor={"file": f"dump_tensor_data/{data_name}", "key": "", "folder": str(folder)} if data_name else None,
        **context,
    )


def load(path: str | Path) -> Run:
    """Open an msprobe dump path, step folder or rank folder as a run of ranks. Tensor files are read
    from the folder that holds each ``dump.json``, never from the absolute paths written inside it."""
    path = Path(path)
    if not path.is_dir():
        raise DumpError(f"{path}: no such msprobe dump folder")
    folders = _rank_folders(path)
    if not folders:
        raise DumpError(f"{path}: no msprobe dump here (no dump.json in it, in rank*/proc* or in step*/rank*)")
    by_rank: dict[int, list[_Folder]] = {}
    seen: dict[tuple[int, int], Path] = {}
    for folder in folders:
        match = _RANK_DIR.match(folder.name)
        rank = int(match[2]) if match and match[2] else 0
        step_match = _STEP_DIR.match(folder.parent.name)
        step = int(step_match[1]) if step_match else 0
        if (rank, step) in seen:
            raise DumpError(
                f"{folder.parent}: several process folders ({seen[(rank, step)].name}, {folder.name}) for rank {rank}; "
                "msprobe ran twice into the same dump path: pass the one folder to compare"
            )
        seen[(rank, step)] = folder
        by_rank.setdefault(rank, []).append(_Folder(folder, step))
    ranks = {rank: MsprobeRankDump(rank=rank, folders=sorted(fs, key=lambda f: f.step)) for rank, fs in by_rank.items()}
    return Run(path=path, ranks=ranks)  # type: ignore[arg-type]  # dict is invariant; MsprobeRankDump is a RankRecords
