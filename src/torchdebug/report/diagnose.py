"""The HTML report of ``torchdebug.diagnose``: the answer, the stage ladder, the values, the graph breaks."""

from __future__ import annotations

import traceback
from typing import Any, Protocol

from torchdebug.report import render

__all__ = ["render_diagnose"]


class Result(Protocol):
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


def render_diagnose(result: Result) -> str:
    """The complete HTML page for ``result`` (a string; the caller writes it)."""
    failed = result.failed_stage
    error = result.error
    return render(
        "diagnose.html.j2",
        title="torchdebug diagnose",
        stage=result.stage,
        error=f"{type(error).__name__}: {error}".splitlines()[0] if error is not None else None,
        traceback="".join(traceback.format_exception(error)) if error is not None else None,
        finding=result.finding,
        user_frame=result.user_frame,
        repro=str(result.repro_path) if result.repro_path else None,
        stages=[{"label": s.stage.label, "kind": s.kind, "seconds": s.seconds} for s in result.stages],
        checks=failed.checks if failed else [],
        compile_summary=result.compile_events.summary(),
        events=result.compile_events.events,
        notes=result.notes,
    )
