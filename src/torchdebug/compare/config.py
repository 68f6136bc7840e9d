"""``CompareConfig``: the validated options of one comparison.

The same kind of object as every torchdebug config (:mod:`torchdebug.options`): a keyword-only
slotted dataclass checked when built, raising one-line :class:`~torchdebug.errors.ConfigError` s
that name the option. It is picklable: worker processes of a distributed compare receive it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from torchdebug.compare.matching import NameMapping, load_mapping
from torchdebug.compare.tolerances import Tolerance, parse_tolerances
from torchdebug.errors import ConfigError
from torchdebug.options import Options, boolean, configclass, number, option, optional


def _tolerances(key: str, value: Any) -> dict[str, Tolerance]:
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{key}: got {value!r}, expected a mapping of dtype to rtol or {{'rtol': ..., 'atol': ...}}")
    return parse_tolerances(value, key)


def _mapping(key: str, value: Any) -> NameMapping:
    return load_mapping(value)


@configclass
class CompareConfig(Options):
    """Options of :func:`torchdebug.compare` (see its docstring for what each one does)."""

    tolerances: dict[str, Tolerance] = field(
        default_factory=dict,
        metadata=option("Per dtype: rtol, or {'rtol': ..., 'atol': ...}; others keep their defaults.", _tolerances),
    )
    mapping: NameMapping = field(
        default_factory=NameMapping,
        metadata=option(
            "Module and op renames between the dumps: a dict or a JSON/YAML file {'modules': ..., 'ops': ...}.", _mapping
        ),
    )
    growth: float = field(
        default=16.0, metadata=option("How much an op may amplify the error of its inputs before it is blamed.", number(1))
    )
    tensors: bool = field(default=True, metadata=option("Compare saved tensors where both sides have them.", boolean))
    threads: int | None = field(
        default=None,
        metadata=option(
            "Threads for tensor metrics per process (None: every core of the process's share).", optional(number(1, integer=True))
        ),
    )
    workers: int = field(default=1, metadata=option("Processes to split the work over.", number(1, integer=True)))
    replay: bool = field(
        default=False,
        metadata=option("Replay calls with an output beyond tolerance in float64 to measure each op's own error.", boolean),
    )

    def options(self) -> dict[str, Any]:
        """What the result records of the options (JSON-ready)."""
        tolerances = {k: [v.rtol, v.atol] for k, v in self.tolerances.items()}
        return {"growth": self.growth, "tolerances": tolerances, "replay": self.replay}
