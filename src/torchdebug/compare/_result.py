"""The outcome of a comparison: rows, verdict counts, the first divergence, and its exports."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torchdebug.compare._checksums import DTYPE_NOTE
from torchdebug.compare._metrics import RERUN_METRICS, STATS_METRICS, TENSOR_METRICS
from torchdebug.compare._rows import OLD_COLUMNS, VERDICTS, Row
from torchdebug.compare._rules import ROUTING_CHANGED
from torchdebug.compare._structure import StructureBlock
from torchdebug.compare._verdicts import first_divergence, first_nonfinite
from torchdebug.records import MODULE_OP, Record
from torchdebug.report.compare import render_compare
from torchdebug.store import pandas, write_fault_note, write_parquet

__all__ = ["CompareResult", "Side", "CSV_COLUMNS"]

CSV_COLUMNS = (
    "rank",
    "step",
    "phase",
    "module",
    "op",
    "call",
    "io",
    "arg",
    "name",
    "name_b",
    "match",
    "kind",
    "dtype_a",
    "dtype_b",
    "shape_a",
    "shape_b",
    "verdict",
    "attribution",
    "difference",
    "tolerance",
    *TENSOR_METRICS,
    *STATS_METRICS,
    "message",
    "source",
    *OLD_COLUMNS,
)
"""Columns of :meth:`CompareResult.to_csv`, one row per tensor slot or argument (with rerun, the
:data:`~torchdebug.compare._metrics.RERUN_METRICS` are appended); the last are
:data:`~torchdebug.compare._rows.OLD_COLUMNS`, a renamed column under its former name for one release."""

_STRUCTURE_OUTCOMES = {
    "error": "change a value",
    "undecided": "cannot be decided from statistics",
    "warning": "carry a difference made before them",
    "pass": "leave the values equal",
    "unjudged": "make values no aligned op reads or that cannot be compared",
}
"""How the summary counts structure differences, by verdict."""
_NAMED_BLOCKS = 3
"""How many structure differences that change a value the summary names."""
_MIN_MATCHED = 0.5  # below this share of matched rows, the dumps probably come from different programs


@dataclass
class Side:
    """One side of a comparison: what the user passed and the opened run."""

    path: str
    run: Any = field(repr=False)

    @classmethod
    def of(cls, given: Any, run: Any) -> Side:
        return cls(path=str(getattr(given, "path", given)), run=run)

    def notes(self, label: str, rank: int) -> list[str]:
        """Notes on one rank folder: partial, or truncated (reads its records: call it where they are
        compared, so a worker reads only its own ranks)."""
        dump = self.run.ranks[rank]
        notes = []
        if not getattr(dump, "complete", True):
            notes.append(
                f"{label} rank {rank} is partial (no complete.json): the run did not close cleanly; later records are missing"
            )
        if getattr(dump, "truncated", False):
            notes.append(f"{label} rank {rank}: the records file ends in a half-written line (skipped)")
        fault = write_fault_note(rank, dump)
        if fault is not None:
            notes.append(f"{label} {fault}")
        return notes


def _unexplained_shape(row: Row) -> bool:
    """A shape difference no verdict explains: not one the runs' inputs make (``incomparable``), not
    one a changed selection makes (the routing changed: it and what follows from it)."""
    return row.verdict != "incomparable" and row.attribution != "inherited" and not row.message.startswith(ROUTING_CHANGED)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return json.dumps(value)
    return value


@dataclass
class CompareResult:
    """Rows of a comparison of dump ``a`` against the reference ``b``, with their verdicts.

    ``first_divergence`` is the earliest op whose output error its inputs do not explain (on the
    lowest rank that has one); ``first_nonfinite`` the earliest op producing a NaN/Inf the other
    side does not have. ``diverged`` is what the CLI's exit status reports.
    """

    heading: ClassVar[str] = "torchdebug compare"
    """The title of reports."""

    rows: list[Row]
    a: Side
    b: Side
    problems: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    # -- queries --------------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted({row.rank for row in self.rows})

    def rank_rows(self, rank: int) -> list[Row]:
        return [row for row in self.rows if row.rank == rank]

    def _first(self, finder: Any) -> Row | None:
        for rank in self.ranks:
            found = finder(self.rank_rows(rank))
            if found is not None:
                return found
        return None

    @property
    def first_divergence(self) -> Row | None:
        """The earliest blamed op row (lowest rank first), or ``None`` when nothing diverges."""
        return self._first(first_divergence)

    @property
    def first_nonfinite(self) -> Row | None:
        """The earliest row with a NaN/Inf that its inputs and the other side do not have."""
        return self._first(first_nonfinite)

    @property
    def structure_differences(self) -> list[StructureBlock]:
        """The structure differences: runs of ops only one side executes between aligned values,
        each listed once with its ops, modules and source lines and what it does to the values (see
        :mod:`torchdebug.compare._structure`), in execution order (lowest rank first)."""
        blocks: dict[int, StructureBlock] = {}
        for row in self.rows:
            if row.block is not None:
                blocks.setdefault(id(row.block), row.block)
        return list(blocks.values())

    def structure_lines(self) -> list[str]:
        """The summary's lines on structure differences: how many, what they do to the values, and
        the blocks that change a value (or carry a difference) named; none when the runs' ops agree."""
        blocks = self.structure_differences
        if not blocks:
            return []
        counts = Counter(block.verdict for block in blocks)
        outcomes = ", ".join(f"{counts[verdict]} {what}" for verdict, what in _STRUCTURE_OUTCOMES.items() if counts[verdict])
        lines = [f"structure differences (ops only one side runs, between aligned values): {len(blocks)} ({outcomes})"]
        named = [block for block in blocks if block.verdict in ("error", "undecided", "warning")]
        lines.extend(f"  {block.describe()}" for block in named[:_NAMED_BLOCKS])
        if len(named) > _NAMED_BLOCKS:
            lines.append(f"  and {len(named) - _NAMED_BLOCKS} more (result.structure_differences lists them all)")
        return lines

    @property
    def diverged(self) -> bool:
        return any(row.verdict == "error" for row in self.rows)

    @property
    def rerun_hint(self) -> str | None:
        """A suggestion to rerun, for a compare of two dumps with tensors run without rerun whose
        first op beyond tolerance is not blamed (nothing is, or something later is)."""
        if self.options.get("rerun") is not False:
            return None  # rerun already, or not a compare of two dumps
        over = next(
            (r for r in self.rows if r.attribution not in ("", "dtype") and r.op != MODULE_OP and "cosine" in r.metrics), None
        )
        if over is None or over is self.first_divergence:
            return None
        return (
            f"{over.name} is the first op beyond tolerance and is not blamed: an op's own error can hide in the "
            "error its inputs inherit; --rerun (rerun=True) runs the diverging ops again in float64 to measure it"
        )

    def coverage(self) -> dict[str, dict[str, Any]]:
        """How much of each side (``"a"``, ``"b"``) the comparison paired: its tensor slots, how many
        are matched and (A) how many are ``inside`` an eager op its compiled group stands for,
        counted over the phases and modules both sides hold; the slots of phases only one side holds
        (an optimizer step run outside the compiled graphs), which no matching can pair, per phase;
        and the slots of modules the other side has no record of and none of whose slots matched
        (the embedding and loss of a model whose blocks alone were compiled), per module."""
        slots: dict[str, dict[int, tuple[Record, bool, bool]]] = {"a": {}, "b": {}}
        held_a, held_b = slots["a"], slots["b"]
        for row in self.rows:
            if row.kind != "tensor":
                continue
            a, b = row.record_a, row.record_b
            matched, inside = a is not None and b is not None, row.match == "inside"
            if a is not None:
                seen = held_a.get(id(a))  # a slot of A may hold two rows
                held_a[id(a)] = (a, matched, inside) if seen is None else (a, seen[1] or matched, seen[2] or inside)
            if b is not None:
                seen = held_b.get(id(b))
                held_b[id(b)] = (b, matched, inside) if seen is None else (b, seen[1] or matched, seen[2] or inside)
        # (phase, module, matched, inside) -> slots, in the order the slots first appear
        held = {side: Counter((r.phase, r.module, m, i) for r, m, i in found.values()) for side, found in slots.items()}
        phases = {side: {phase for phase, _, _, _ in counts} for side, counts in held.items()}
        modules = {side: {module for _, module, _, _ in counts} for side, counts in held.items()}
        both = phases["a"] & phases["b"]
        out = {}
        for side, counts in held.items():
            other = modules["b" if side == "a" else "a"]
            paired = {module for _, module, matched, _ in counts if matched}
            rows = matched_rows = inside_rows = 0
            other_phases: Counter[str] = Counter()
            other_modules: Counter[str] = Counter()
            for (phase, module, matched, inside), n in counts.items():
                if phase not in both:
                    other_phases[phase] += n
                elif module in other or module in paired:
                    rows += n
                    matched_rows += n * matched
                    inside_rows += n * inside
                else:
                    other_modules[module] += n
            out[side] = {
                "rows": rows,
                "matched": matched_rows,
                "inside": inside_rows,
                "other_phases": dict(other_phases),
                "other_modules": dict(other_modules),
            }
        return out

    def coverage_text(self, side: str, coverage: dict[str, dict[str, Any]] | None = None) -> str | None:
        """One line on how much of ``side`` matched (``None`` when it has no tensor slot to count)."""
        found = (coverage or self.coverage())[side]
        if not found["rows"]:
            return None
        text = f"{found['matched']} of {found['rows']} tensor rows matched ({found['matched'] / found['rows']:.1%})"
        if found["inside"]:
            text += f", {found['inside']} inside eager ops the compiler decomposed"
        for phase, n in found["other_phases"].items():
            text += f"; its {n} {phase} rows are not compared (no {phase} phase on the other side)"
        if found["other_modules"]:
            outside = found["other_modules"]
            largest = sorted(outside, key=lambda module: -outside[module])
            text += (
                f"; its {sum(outside.values())} rows in {len(outside)} modules the other side has no record of are "
                f"not compared ({_listed(largest)}: outside its compiled graphs, or not selected there)"
            )
        return text

    def phases(self) -> dict[str, dict[str, Any]]:
        """What could be compared, per phase (in execution order): its matched rows ``compared`` and
        their ``verdicts``, the rows that are ``incomparable`` (the runs' inputs, or a checksum
        compare's dtypes, differ) and the ``unmatched`` ones."""
        out: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            phase = out.setdefault(row.phase, {"compared": 0, "incomparable": 0, "unmatched": 0, "verdicts": Counter()})
            if row.verdict in ("incomparable", "unmatched"):
                phase[row.verdict] += 1
            else:
                phase["compared"] += 1
                phase["verdicts"][row.verdict] += 1
        for phase in out.values():
            phase["verdicts"] = {verdict: phase["verdicts"][verdict] for verdict in VERDICTS if phase["verdicts"][verdict]}
        return out

    def scope_lines(self) -> list[str]:
        """The summary's lines on what could be compared, per phase; none when every matched row could."""
        phases = self.phases()
        if not any(found["incomparable"] for found in phases.values()):
            return []
        lines = ["what could be compared, per phase (rows that cannot be are 'incomparable'; their messages say why):"]
        for name, found in phases.items():
            verdicts = ", ".join(f"{n} {verdict}" for verdict, n in found["verdicts"].items())
            if not found["incomparable"]:
                lines.append(f"  {name}: compared, {found['compared']} rows ({verdicts})")
            elif not found["compared"]:
                lines.append(f"  {name}: not comparable ({found['incomparable']} rows)")
            else:
                lines.append(f"  {name}: {found['incomparable']} rows not comparable, {found['compared']} compared ({verdicts})")
        return lines

    def counts(self, rank: int | None = None) -> dict[str, int]:
        """Rows per verdict (all ranks, or one)."""
        rows = self.rows if rank is None else self.rank_rows(rank)
        counter = Counter(row.verdict for row in rows)
        return {verdict: counter.get(verdict, 0) for verdict in VERDICTS}

    def stack(self, row: Row) -> list[str]:
        """The call stack of a row's record, outermost frame first (empty when none was saved)."""
        for side, record in ((self.a, row.record_a), (self.b, row.record_b)):
            dump = side.run.ranks.get(row.rank)
            if record is not None and dump is not None:
                frames = dump.stack(record)
                if frames:
                    return list(frames)
        return []

    def check_overlap(self) -> None:
        """Fail or warn when the two dumps have little in common (different models or programs)."""
        tensors = matched = shapes = 0
        for row in self.rows:
            if row.kind == "tensor":
                tensors += 1
                if row.matched:
                    matched += 1
                    shapes += row.shape_a != row.shape_b and _unexplained_shape(row)
        if tensors and not matched:
            unfinished = self.unfinished()
            if unfinished:
                raise ValueError(
                    f"{self.a.path} and {self.b.path} have no tensor records in common: {'; '.join(unfinished)}. "
                    "Compare it once its run has ended"
                )
            raise ValueError(
                f"{self.a.path} and {self.b.path} have no tensor records in common: they come from different "
                "models or programs (or pass a mapping file for renamed modules)"
            )
        reference = self.coverage()["b"]
        if reference["rows"] and reference["matched"] < _MIN_MATCHED * reference["rows"]:
            unfinished = self.unfinished()
            why = "; ".join(unfinished) if unfinished else "the dumps look like different models or programs"
            self.problems.append(
                f"only {reference['matched']} of {reference['rows']} tensor rows of B matched: {why} "
                "(unmatched rows are listed as 'unmatched')"
            )
        if shapes:
            self.problems.append(
                f"{shapes} matched rows differ in shape: the dumps come from different model configurations or inputs"
            )

    def unfinished(self) -> list[str]:
        """A phrase for each side with a compared rank folder that has no ``complete.json`` (its run is
        still being written, or stopped before it finished)."""
        found = []
        for label, side in (("A", self.a), ("B", self.b)):
            ranks = [rank for rank in self.ranks if not getattr(side.run.ranks.get(rank), "complete", True)]
            if ranks:
                which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
                found.append(f"{label} ({side.path}) is still being written or did not finish ({which} without complete.json)")
        return found

    # -- describing ------------------------------------------------------------------------------
    def title(self) -> str:
        """The first line of the summary: what was compared with what."""
        return f"compare {self.a.path} (A) against {self.b.path} (B, reference)"

    def sides(self) -> list[tuple[str, str]]:
        """``(label, what)`` of what was compared, for reports: each side's path and how much of it matched."""
        coverage = self.coverage()
        sides = []
        for side, label, path in (("a", "A", self.a.path), ("b", "B (reference)", self.b.path)):
            text = self.coverage_text(side, coverage)
            sides.append((label, f"{path} ({text})" if text else path))
        return sides

    def describe(self, row: Row) -> dict[str, Any]:
        """A row as a dict plus its stack, for JSON output and reports."""
        return {**{k: _json_number(v) for k, v in row.to_dict().items()}, "stack": self.stack(row)}

    def summary(self) -> str:
        """A few lines for a terminal: counts per rank, first divergence, first non-finite op."""
        leading = [problem for problem in self.problems if problem.startswith(DTYPE_NOTE)]
        lines = [self.title(), *(f"note: {problem}" for problem in leading), *self.scope_lines()]
        for rank in self.ranks:
            counts = self.counts(rank)
            lines.append(f"rank {rank}: {len(self.rank_rows(rank))} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
        coverage = self.coverage()
        lines.extend(f"{side.upper()}: {text}" for side in "ba" if (text := self.coverage_text(side, coverage)))
        for title, row in (("first divergence", self.first_divergence), ("first non-finite", self.first_nonfinite)):
            if row is None:
                lines.append(f"{title}: none")
                continue
            lines.append(f"{title} (rank {row.rank}, step {row.step}, {row.phase}): {row.name}")
            lines.append(f"  op {row.op} in module {row.module}" + (f" at {row.source}" if row.source else ""))
            detail = row.message
            metrics = ", ".join(f"{k} {row.metrics[k]:.4g}" for k in ("cosine", "max_abs_err", "rel_l2") if k in row.metrics)
            lines.append(f"  {detail}" + (f" ({metrics})" if metrics else ""))
        lines.extend(self.structure_lines())
        # counted first: a cross-rank result makes the rows of agreeing ranks only when they are read
        undecided = [row for row in self.rows if row.verdict == "undecided"] if self.counts().get("undecided") else []
        rerun = sum("own_err_a" in row.metrics or "own_err_b" in row.metrics for row in undecided)
        if len(undecided) > rerun:
            lines.append(
                f"undecided: {len(undecided) - rerun} rows beyond tolerance where statistics cannot tell whether the op "
                'or its inputs made the difference; a tensor dump (task="tensor") would decide them'
            )
        if rerun:
            lines.append(
                f"undecided: {rerun} rerun rows whose own error is within two rounding units of what the CPU kernel "
                "makes of the same inputs: below what the dtype can tell apart (a lower --tolerance does not help)"
            )
        hint = self.rerun_hint
        if hint:
            lines.append(f"hint: {hint}")
        lines.extend(f"note: {problem}" for problem in self.problems if problem not in leading)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    # -- exports -------------------------------------------------------------------------------
    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of the CSV, pandas and Parquet exports (:data:`CSV_COLUMNS`, plus
        :data:`~torchdebug.compare._metrics.RERUN_METRICS` with rerun)."""
        return CSV_COLUMNS + RERUN_METRICS if self.options.get("rerun") else CSV_COLUMNS

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame``, columns :attr:`columns` (a metric a row lacks is NaN;
        needs ``pip install 'torchdebug[pandas]'``)."""
        return pandas().DataFrame([row.to_dict() for row in self.rows], columns=list(self.columns))

    def to_parquet(self, path: str | Path) -> Path:
        """The :meth:`to_pandas` table as a Parquet file (``pip install 'torchdebug[parquet]'``)."""
        return write_parquet(self.to_pandas(), path)

    def to_csv(self, path: str | Path) -> Path:
        """One line per row, columns :data:`CSV_COLUMNS`."""
        path = Path(path)
        with path.open("w", newline="") as handle:
            columns = self.columns
            writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: _cell(v) for k, v in row.to_dict().items()})
        return path

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready data (non-finite floats as strings ``"inf"``/``"nan"``)."""
        first, nonfinite = self.first_divergence, self.first_nonfinite
        return {
            "a": self.a.path,
            "b": self.b.path,
            "diverged": self.diverged,
            "counts": self.counts(),
            "coverage": self.coverage(),
            "phases": self.phases(),
            "ranks": {str(rank): self.counts(rank) for rank in self.ranks},
            "first_divergence": self.describe(first) if first else None,
            "first_nonfinite": self.describe(nonfinite) if nonfinite else None,
            "structure_differences": [block.to_dict() for block in self.structure_differences],
            "problems": self.problems,
            "options": self.options,
            "rows": [{k: _json_number(v) for k, v in row.to_dict().items()} for row in self.rows],
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        return path

    def to_html(self, path: str | Path) -> Path:
        """A self-contained HTML report (works offline; every name is escaped)."""
        path = Path(path)
        path.write_text(render_compare(self, VERDICTS), encoding="utf-8")
        return path


def _listed(names: list[str], most: int = 3) -> str:
    """The first ``most`` names, and how many more (a summary line stays one line)."""
    shown = ", ".join(names[:most])
    return f"{shown} and {len(names) - most} more" if len(names) > most else shown
