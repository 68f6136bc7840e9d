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

from typing import Annotated, Any

from torchdebug.errors import ConfigError
from torchdebug.options import AtLeast, Check, Flag, Indices, Options, configclass, option

TYPE_CHECKING = False  # typing's: these modules load torch, which the command line's help must not
if TYPE_CHECKING:
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


Tolerances = Annotated[
    "dict[str, Tolerance]",
    Check(
        _tolerances,
        schema={"type": "object", "additionalProperties": {"type": ["number", "object"]}},
        accepts="Mapping[str, float | Mapping[str, float] | Tolerance] | None",
    ),
]
Threads = Annotated[int, AtLeast(1)] | None
Workers = Annotated[int, AtLeast(1)]

# The options compare() and compare_ranks() share: one declaration each, used by both classes.
_TOLERANCES_DOC = (
    "Per-dtype tolerance overrides: {'bfloat16': 0.02} (rtol) or {'float32': {'rtol': 1e-5, 'atol': 1e-6}}, "
    "on the command line bfloat16=0.02 or float32=1e-5,1e-6 once per dtype; other dtypes keep torch.testing's "
    "(across ranks: they must agree bitwise)."
)
_TOLERANCES_FLAG = Flag(parse=_tolerance_text, word="tolerance", metavar="DTYPE=RTOL[,ATOL]", repeated=True)
_TENSORS_DOC = "Compare saved tensors where both sides have them (off: statistics only)."
_THREADS_DOC = (
    "Threads for tensor metrics and hashes per process (default: the process's share of the cores; torch's "
    "intra-op threads are set to 1 meanwhile and restored after)."
)
_WORKERS_DOC = "Processes to split the work over on this machine (by rank, then by tensor file; not under torchrun)."


_RANKS_DOC = (
    "With one dump (compare(dump), --across-ranks): the ranks of one data-parallel group, [0, 2, 4] or '0-3', "
    "on the command line 0,2,4 or 0-3 (default: every rank of the run)."
)
_RANKS_FLAG = Flag(parse=_ranks_text, metavar="RANKS")


@configclass
class CompareConfig(Options):
    """Options of :func:`torchdebug.compare` and ``torchdebug compare``."""

    _ALIASES = {"replay": "rerun"}  # the monitor's replay runs a whole step again

    tolerances: Tolerances = option(_TOLERANCES_DOC, default={}, flag=_TOLERANCES_FLAG)
    mapping: Annotated[
        NameMapping | None,
        Check(
            _mapping,
            schema={"type": ["object", "string", "null"]},
            accepts="NameMapping | Mapping[str, object] | str | Path | None",
        ),
    ] = option(
        "Module and op renames applied to A: {'modules': {old: new}, 'ops': {old: new}}, or a JSON/YAML file of it.",
        default=None,
        flag=Flag(metavar="FILE"),
    )
    growth: Annotated[float, AtLeast(1)] = option(
        "How much an op may amplify the error of its inputs before it is blamed.", default=16.0
    )
    noise: Annotated[str | None, Check(_noise, schema={"type": ["string", "null"]}, accepts="str | Path | None")] = option(
        "A dump of B's step run again with a tiny perturbation (inputs or weights rounded through a lower "
        "precision and back, another reduction order): each slot B and it share is judged against a tolerance "
        "measured from their difference instead of its dtype's (see docs/compare.md, 'Tolerances from the run').",
        default=None,
        flag=Flag(metavar="DUMP"),
    )
    tensors: bool = option(_TENSORS_DOC, default=True)
    threads: Threads = option(_THREADS_DOC, default=None, flag=Flag(metavar="N"))
    workers: Workers = option(_WORKERS_DOC, default=1, flag=Flag(metavar="N"))
    ranks: Indices = option(_RANKS_DOC, default=None, flag=_RANKS_FLAG)
    rerun: bool = option(
        "Run every op call with an output beyond tolerance again in float64 on each side's own saved inputs, "
        "and blame a call far from its rerun even when its inputs carry inherited error (task='tensor' dumps; "
        "about one more pass over those calls) (was replay).",
        default=False,
        flag=Flag(old=("--replay", "--no-replay")),
    )

    def options(self) -> dict[str, Any]:
        """What the result records of the options (JSON-ready)."""
        tolerances = {k: [v.rtol, v.atol] for k, v in self.tolerances.items()}
        return {"growth": self.growth, "tolerances": tolerances, "rerun": self.rerun, "noise": self.noise}


@configclass
class RanksConfig(Options):
    """Options of one dump's ranks compared with each other, as ``compare(dump)`` reads them from a
    :class:`CompareConfig` (and the deprecated ``compare_ranks`` takes them, for one release)."""

    ranks: Indices = option(_RANKS_DOC, default=None, flag=_RANKS_FLAG)
    tolerances: Tolerances = option(_TOLERANCES_DOC, default={}, flag=_TOLERANCES_FLAG)
    tensors: bool = option(_TENSORS_DOC, default=True)
    threads: Threads = option(_THREADS_DOC, default=None, flag=Flag(metavar="N"))
    workers: Workers = option(_WORKERS_DOC, default=1, flag=Flag(metavar="N"))

    def options(self) -> dict[str, Any]:
        """What the result records of the options (JSON-ready)."""
        return {"tolerances": {k: [v.rtol, v.atol] for k, v in self.tolerances.items()}}
