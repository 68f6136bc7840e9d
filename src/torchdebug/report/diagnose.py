"""The HTML report of ``torchdebug.diagnose``: the answer, the stage ladder, the values, the graph breaks."""

from __future__ import annotations

import traceback
from typing import Any, Protocol

from torchdebug.report import render

__all__ = ["render_diagnose"]


class Report(Protocol):
    """What the page reads of a ``torchdebug.diagnose.DiagnoseResult`` (passed down to this layer)."""

    stages: list[Any]
    finding: Any
    repro_path: Any
    compile_events: Any
    notes: list[str]
    failed_stage: Any
    stage: str | None
    error: BaseException | None
    user_frame: str | None


def render_diagnose(report: Report) -> str:
    """The complete HTML page for ``report`` (a string; the caller writes it)."""
    failed = report.failed_stage
    error = report.error
    return render(
        "diagnose.html.j2",
        title="torchdebug diagnose",
        stage=report.stage,
        error=f"{type(error).__name__}: {error}".splitlines()[0] if error is not None else None,
        traceback="".join(traceback.format_exception(error)) if error is not None else None,
        finding=report.finding,
        user_frame=report.user_frame,
        repro=str(report.repro_path) if report.repro_path else None,
        stages=[{"label": s.stage.label, "kind": s.kind, "seconds": s.seconds} for s in report.stages],
        checks=failed.checks if failed else [],
        compile_summary=report.compile_events.summary(),
        events=report.compile_events.events,
        notes=report.notes,
    )
