"""What diagnose found: the stage, the error or lost accuracy, the node and its source line, the repro."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchdebug.diagnose._accuracy import Check
from torchdebug.diagnose._finding import NodeFinding
from torchdebug.diagnose._graph_breaks import CompileEvents
from torchdebug.diagnose._program import first_line
from torchdebug.diagnose._stages import StageResult
from torchdebug.report.diagnose import render_diagnose


@dataclass(slots=True)
class DiagnoseResult:
    """The answer of :func:`torchdebug.diagnose`. ``stage`` is ``None`` when every stage passed."""

    stages: list[StageResult]
    finding: NodeFinding | None = None
    repro_path: Path | None = None
    compile_events: CompileEvents = field(default_factory=CompileEvents)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    not_localised: str | None = None
    """Why no node is named although a compiler stage fails (also the last of ``notes``)."""
    skipped: list[str] = field(default_factory=list)
    """Stages of the ladder that did not need to run (they come before the last of ``stages``): the
    last stage runs them all, and it matched, or its own node values named the node."""

    @property
    def failed_stage(self) -> StageResult | None:
        last = self.stages[-1] if self.stages else None
        return last if last is not None and last.failed else None

    @property
    def stage(self) -> str | None:
        """The first stage that raises or loses accuracy (``uncompiled``, ``aot_eager``, ``inductor``, ...)."""
        failed = self.failed_stage
        return failed.stage.label if failed else None

    @property
    def kind(self) -> str | None:
        """``"exception"`` or ``"accuracy"``."""
        failed = self.failed_stage
        return failed.kind if failed else None

    @property
    def error(self) -> BaseException | None:
        failed = self.failed_stage
        return failed.run.error if failed else None

    @property
    def user_frame(self) -> str | None:
        """Where in user code: the culprit node's source line, else the exception's innermost user frame."""
        if self.finding is not None and self.finding.source:
            return self.finding.source
        failed = self.failed_stage
        return failed.run.user_frame if failed else None

    @property
    def failed_checks(self) -> list[Check]:
        failed = self.failed_stage
        return [c for c in failed.checks if not c.passed] if failed else []

    @property
    def node(self) -> str | None:
        return self.finding.node if self.finding else None

    @property
    def module(self) -> str | None:
        return self.finding.module if self.finding else None

    @property
    def source(self) -> str | None:
        return self.finding.source if self.finding else None

    @property
    def ok(self) -> bool:
        return self.stage is None

    def summary(self) -> str:
        """A few lines for the console."""
        lines = [f"torchdebug diagnose ({self.seconds:.1f} s)"]
        for index, result in enumerate(self.stages):
            if index == len(self.stages) - 1:
                why = f"{result.stage.label} includes it and " + ("matches" if self.ok else "its own values name the node")
                lines.extend(f"  {label:<28} not run    ({why})" for label in self.skipped)
            lines.append(f"  {result.stage.label:<28} {result.kind:<10} {result.seconds:6.2f} s")
        if self.ok:
            lines.append(
                f"{self.stages[-1].stage.label} matches the fp64 eager reference (the stages it includes were not run)"
                if self.skipped
                else "every stage matches the fp64 eager reference"
            )
        elif self.error is not None:
            lines.append(f"stage {self.stage} raises {type(self.error).__name__}: {first_line(self.error)}")
        else:
            checks = self.failed_checks
            shown = ", ".join(f"{c.name} ({c.describe()})" for c in checks[:3])
            more = f" and {len(checks) - 3} more" if len(checks) > 3 else ""
            lines.append(f"stage {self.stage} loses accuracy: {shown}{more}")
        if self.finding is not None:
            lines.append(f"first bad node: {self.finding.describe()}")
            if self.finding.code:
                lines.append(f"    {self.finding.code}")
        elif self.not_localised is not None:
            lines.append("first bad node: not found (the last note says why)")
        if self.finding is None and self.user_frame:
            lines.append(f"user frame: {self.user_frame}")
        if self.repro_path is not None and self.finding is not None:
            shows = "" if self.finding.reproduced is not False else "; it does not show the problem (see the notes)"
            lines.append(f"repro: python {self.repro_path} ({self.finding.scope}{shows})")
        lines.append(f"compile: {self.compile_events.summary()}")
        for event in self.compile_events.events:
            lines.append(f"  {event.kind} at {event.source or 'an unknown line'}: {event.reason.splitlines()[0]}")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)

    def to_html(self, path: str | Path) -> Path:
        """Write a self-contained HTML page (no network) and return its path."""
        target = Path(path)
        target.write_text(render_diagnose(self))
        return target
