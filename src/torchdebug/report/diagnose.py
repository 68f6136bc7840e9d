"""The HTML report of ``torchdebug.diagnose``: the answer, the stage ladder, the values, the graph breaks."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from torchdebug.report import render

if TYPE_CHECKING:
    from torchdebug.diagnose.report import DiagnoseReport

__all__ = ["render_diagnose"]


def render_diagnose(report: DiagnoseReport) -> str:
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
