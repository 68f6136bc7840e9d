"""``CompareConfig`` and ``RanksConfig``: the validated options of one comparison, and of the ranks of
one run compared with each other, declared once (the options both take share one declaration).

The same kind of object as every torchdebug config (:mod:`torchdebug.options`): a keyword-only
slotted dataclass checked when built, raising one-line :class:`~torchdebug.errors.ConfigError` s
that name the option. Its fields are also :func:`torchdebug.compare`'s keyword options and
``torchdebug compare``'s flags (generated from them). It is picklable: worker processes of a
distributed compare receive it.

The command line imports this module to build ``torchdebug compare --help``, so it imports nothing
that loads torch; the validators import what they need when they run.
"""

from __future__ import annotations

from dataclasses import field

from torchdebug.errors import ConfigError
from torchdebug.options import (
    Flag,
    Options,
    boolean,
    configclass,
    index_set,
    integer_text,
    number,
    number_text,
    option,
    optional,
)

TYPE_CHECKING = False  # typing's, without importing typing on the help path (see cli/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from torchdebug.compare._matching import NameMapping
    from torchdebug.compare._tolerances import Tolerance


def _tolerances(key: str, value: Any) -> dict[str, Tolerance]:
    from torchdebug.compare._tolerances import parse_tolerances

    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{key}: got {value!r}, expected a mapping of dtype to rtol or {{'rtol': ..., 'atol': ...}}")
    return parse_tolerances(value, key)


def _tolerance_text(text: str) -> dict[str, dict[str, float]]:
    """One ``--tolerance``: ``bfloat16=0.02`` or ``float32=1e-5,1e-6`` (rtol[,atol])."""
    dtype, _, values = text.partition("=")
    try:
        numbers = [float(v) for v in values.split(",")]
    except ValueError:
        numbers = []
    if not dtype or not 1 <= len(numbers) <= 2:
        raise ValueError(f"got {text!r}, expected DTYPE=RTOL or DTYPE=RTOL,ATOL (e.g. bfloat16=0.02)")
    return {dtype: dict(zip(("rtol", "atol"), numbers))}


def _ranks_text(text: str) -> str:
    """One ``--ranks``: ``0,2,4`` or ``0-3`` (the selection ``index_set`` reads, commas as ``|``)."""
    return text.replace(",", "|")


def _noise(key: str, value: Any) -> str | None:
    """A dump folder that exists (checked here, before a comparison that may take minutes)."""
    import os  # here: the help path imports this module

    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    expected = "the path of a dump of B's step run again with a tiny perturbation"
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")
    if not os.path.isdir(value):
        raise ConfigError(f"{key}: got {value!r}, which is not a folder; expected {expected}")
    return value


def _mapping(key: str, value: Any) -> NameMapping:
    from torchdebug.compare._matching import load_mapping

    return load_mapping(value)


# The options compare() and compare_ranks() share: one declaration each, a field per class.
def _tolerances_field() -> Any:
    return field(
        default_factory=dict,
        metadata=option(
            "Per-dtype tolerance overrides: {'bfloat16': 0.02} (rtol) or {'float32': {'rtol': 1e-5, 'atol': 1e-6}}, "
            "on the command line bfloat16=0.02 or float32=1e-5,1e-6 once per dtype; other dtypes keep torch.testing's "
            "(across ranks: they must agree bitwise).",
            _tolerances,
            flag=Flag(parse=_tolerance_text, word="tolerance", metavar="DTYPE=RTOL[,ATOL]", repeated=True),
        ),
    )


def _tensors_field() -> Any:
    return field(
        default=True,
        metadata=option(
            "Compare saved tensors where both sides have them (off: statistics only).",
            boolean,
            flag=Flag(old=("--statistics-only", "--stats-only")),
        ),
    )


def _threads_field() -> Any:
    return field(
        default=None,
        metadata=option(
            "Threads for tensor metrics and hashes per process (default: the process's share of the cores; torch's "
            "intra-op threads are set to 1 meanwhile and restored after).",
            optional(number(1, integer=True)),
            flag=Flag(parse=integer_text, metavar="N"),
        ),
    )


def _workers_field() -> Any:
    return field(
        default=1,
        metadata=option(
            "Processes to split the work over on this machine (by rank, then by tensor file; not under torchrun).",
            number(1, integer=True),
            flag=Flag(parse=integer_text, metavar="N"),
        ),
    )


@configclass
class CompareConfig(Options):
    """Options of :func:`torchdebug.compare` and ``torchdebug compare``."""

    _ALIASES = {"replay": "rerun"}  # the monitor's replay runs a whole step again

    tolerances: dict[str, Tolerance] = _tolerances_field()
    mapping: NameMapping | None = field(
        default=None,
        metadata=option(
            "Module and op renames applied to A: {'modules': {old: new}, 'ops': {old: new}}, or a JSON/YAML file of it.",
            _mapping,
            flag=Flag(metavar="FILE"),
        ),
    )
    growth: float = field(
        default=16.0,
        metadata=option(
            "How much an op may amplify the error of its inputs before it is blamed.",
            number(1),
            flag=Flag(parse=number_text),
        ),
    )
    noise: str | None = field(
        default=None,
        metadata=option(
            "A dump of B's step run again with a tiny perturbation (inputs or weights rounded through a lower "
            "precision and back, another reduction order): each slot B and it share is judged against a tolerance "
            "measured from their difference instead of its dtype's (see docs/compare.md, 'Tolerances from the run').",
            _noise,
            flag=Flag(metavar="DUMP"),
            type=["string", "null"],
        ),
    )
    tensors: bool = _tensors_field()
    threads: int | None = _threads_field()
    workers: int = _workers_field()
    rerun: bool = field(
        default=False,
        metadata=option(
            "Run every op call with an output beyond tolerance again in float64 on each side's own saved inputs, "
            "and blame a call far from its rerun even when its inputs carry inherited error (task='tensor' dumps; "
            "about one more pass over those calls) (was replay).",
            boolean,
            flag=Flag(old=("--replay", "--no-replay")),
        ),
    )

    def options(self) -> dict[str, Any]:
        """What the result records of the options (JSON-ready)."""
        tolerances = {k: [v.rtol, v.atol] for k, v in self.tolerances.items()}
        return {"growth": self.growth, "tolerances": tolerances, "rerun": self.rerun, "noise": self.noise}


@configclass
class RanksConfig(Options):
    """Options of :func:`torchdebug.compare.compare_ranks` and ``torchdebug compare --across-ranks``."""

    ranks: frozenset[int] | None = field(
        default=None,
        metadata=option(
            "With --across-ranks: the ranks of one data-parallel group, [0, 2, 4] or '0-3', on the command line "
            "0,2,4 or 0-3 (default: every rank of the run).",
            index_set,
            flag=Flag(parse=_ranks_text, metavar="RANKS"),
            type=["array", "string", "integer", "null"],
        ),
    )
    tolerances: dict[str, Tolerance] = _tolerances_field()
    tensors: bool = _tensors_field()
    threads: int | None = _threads_field()
    workers: int = _workers_field()

    def options(self) -> dict[str, Any]:
        """What the result records of the options (JSON-ready)."""
        return {"tolerances": {k: [v.rtol, v.atol] for k, v in self.tolerances.items()}}
