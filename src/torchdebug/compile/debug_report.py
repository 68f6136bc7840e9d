"""One offline HTML page for a ``TORCH_COMPILE_DEBUG`` run of the torchdebug backend.

Reads the tree :mod:`torchdebug.compile.debug_dir` writes (models, phases, ``passes.json``,
numbered dumps, ``graph_breaks.json``, ``recompiles.json``, ``model.json``) and renders models and
phases, the pass pipeline with node-count changes, a diff between consecutive pass dumps, graph
breaks and recompiles with source lines, and compile times. Self-contained: inline CSS, no
scripts from elsewhere; every name is HTML-escaped (jinja2 autoescape).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchdebug.errors import DumpError

MAX_DIFF_LINES = 400
_PHASE_ORDER = {"joint": 0, "forward": 1, "backward": 2}


def find_torchdebug_folder(path: Path) -> Path:
    """The ``torchdebug/`` folder for ``path``: itself, a run folder holding it, or the newest run
    under a ``torch_compile_debug`` root."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such folder; pass a torch_compile_debug/run_* folder")
    for candidate in (path, path / "torchdebug"):
        if (candidate / "debug.log").exists() or any(candidate.glob("model__*")):
            return candidate
    runs = sorted(path.glob("run_*/torchdebug"), key=lambda p: p.stat().st_mtime)
    if runs:
        return runs[-1]
    raise DumpError(
        f"{path}: no torchdebug debug output here; run with TORCH_COMPILE_DEBUG=1 and pass the "
        "torch_compile_debug/run_* folder it prints"
    )


def _read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


@dataclass
class PassStep:
    index: int
    name: str
    owner: str
    seconds: float
    nodes_before: int
    nodes_after: int
    added: list[str]
    removed: list[str]
    diff: list[str] = field(default_factory=list)
    diff_truncated: bool = False


@dataclass
class Phase:
    name: str
    compile_seconds: float | None
    steps: list[PassStep]
    entry_nodes: int | None


@dataclass
class Model:
    name: str
    summary: dict[str, Any]
    phases: list[Phase]


def _diff(before: Path | None, after: Path | None) -> tuple[list[str], bool]:
    if before is None or after is None or not before.is_file() or not after.is_file():
        return [], False
    lines = list(difflib.unified_diff(before.read_text().splitlines(), after.read_text().splitlines(),
                                      before.name, after.name, lineterm="", n=2))
    return lines[:MAX_DIFF_LINES], len(lines) > MAX_DIFF_LINES


def _phase(folder: Path) -> Phase:
    passes = _read_json(folder / "passes.json", {})
    entry = next(iter(sorted(folder.glob("000_aot_*_graph.txt"))), None)
    steps = []
    previous = entry
    for record in passes.get("passes", []):
        current = folder / record["file"] if record.get("file") else None
        diff, truncated = _diff(previous, current)
        steps.append(PassStep(
            index=record["index"], name=record["name"], owner=record["owner"], seconds=record["seconds"],
            nodes_before=record["nodes_before"], nodes_after=record["nodes_after"], added=record["added"],
            removed=record["removed"], diff=diff, diff_truncated=truncated,
        ))
        previous = current or previous
    return Phase(folder.name, passes.get("compile_seconds"), steps, steps[0].nodes_before if steps else None)


def collect(folder: Path) -> dict[str, Any]:
    """Everything the page shows, read from one ``torchdebug/`` folder."""
    models = []
    model_folders = sorted(folder.glob("model__*"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    for model_folder in model_folders:
        phases = sorted((p for p in model_folder.iterdir() if p.is_dir()), key=lambda p: _PHASE_ORDER.get(p.name, 9))
        models.append(Model(model_folder.name, _read_json(model_folder / "model.json", {}), [_phase(p) for p in phases]))
    return {
        "folder": str(folder),
        "models": models,
        "graph_breaks": _read_json(folder / "graph_breaks.json", []),
        "recompiles": _read_json(folder / "recompiles.json", []),
    }


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>torchdebug compile report</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
h1{font-size:1.4em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#f4f4f4}.num{text-align:right;font-variant-numeric:tabular-nums}
.up{color:#0a7d20}.down{color:#b3261e}.muted{color:#888}code,pre{font:12px/1.35 ui-monospace,monospace}
pre{background:#f8f8f8;padding:.5em;overflow:auto;max-height:40em}.add{color:#0a7d20}.del{color:#b3261e}
details{margin:.2em 0}summary{cursor:pointer}
</style></head><body>
<h1>torchdebug compile report</h1>
<p class="muted">{{ folder }}</p>
<h2>Models</h2>
<table><tr><th>model</th><th>compile id</th><th>mode</th><th class="num">backend s</th><th>phases (s)</th></tr>
{% for m in models %}<tr><td><a href="#{{ m.name }}">{{ m.name }}</a></td><td>{{ m.summary.get("compile_id") or "" }}</td>
<td>{{ m.summary.get("mode") or "" }}</td><td class="num">{{ "%.3f"|format(m.summary.get("backend_seconds") or 0) }}</td>
<td>{% for name, s in (m.summary.get("phase_seconds") or {}).items() %}{{ name }} {{ "%.3f"|format(s) }}{% if not loop.last %}, {% endif %}{% endfor %}</td></tr>
{% endfor %}</table>
<h2>Graph breaks ({{ graph_breaks|length }})</h2>
{% for b in graph_breaks %}<details><summary>{{ b.model }} ({{ b.compile_id }}):
{% set f = b.user_stack[-1] if b.user_stack else None %}{% if f %}<code>{{ f.file }}:{{ f.line }}</code> <code>{{ f.code }}</code>{% endif %}</summary>
<pre>{{ b.reason }}</pre>{% for f in b.user_stack %}<div><code>{{ f.file }}:{{ f.line }} in {{ f.function }}: {{ f.code }}</code></div>{% endfor %}</details>
{% else %}<p class="muted">none</p>{% endfor %}
<h2>Recompiles ({{ recompiles|length }})</h2>
{% for r in recompiles %}<details><summary>{{ r.model }} ({{ r.compile_id }}): {{ r.reason }}</summary>
{% for f in r.user_stack %}<div><code>{{ f.file }}:{{ f.line }} in {{ f.function }}: {{ f.code }}</code></div>{% endfor %}</details>
{% else %}<p class="muted">none</p>{% endfor %}
{% for m in models %}<h2 id="{{ m.name }}">{{ m.name }}</h2>
{% for p in m.phases %}<h3>{{ p.name }}{% if p.compile_seconds is not none %} <span class="muted">({{ "%.3f"|format(p.compile_seconds) }} s)</span>{% endif %}</h3>
<table><tr><th class="num">#</th><th>pass</th><th>owner</th><th class="num">ms</th><th class="num">nodes</th><th>added</th><th>removed</th><th>diff</th></tr>
{% for s in p.steps %}<tr><td class="num">{{ "%03d"|format(s.index) }}</td><td>{{ s.name }}</td><td>{{ s.owner }}</td>
<td class="num">{{ "%.2f"|format(s.seconds * 1000) }}</td>
<td class="num">{{ s.nodes_before }} &rarr; {{ s.nodes_after }}{% set d = s.nodes_after - s.nodes_before %}{% if d > 0 %} <span class="up">+{{ d }}</span>{% elif d < 0 %} <span class="down">{{ d }}</span>{% endif %}</td>
<td>{{ s.added|join(", ") }}</td><td>{{ s.removed|join(", ") }}</td>
<td>{% if s.diff %}<details><summary>{{ s.diff|length }} lines</summary><pre>{% for line in s.diff %}<span class="{{ 'add' if line.startswith('+') else 'del' if line.startswith('-') else '' }}">{{ line }}</span>
{% endfor %}{% if s.diff_truncated %}&hellip; (cut at {{ max_diff }} lines){% endif %}</pre></details>{% else %}<span class="muted">no change</span>{% endif %}</td></tr>
{% else %}<tr><td colspan="8" class="muted">no passes recorded</td></tr>{% endfor %}</table>
{% endfor %}{% endfor %}
</body></html>
"""


def render_report(folder: Path) -> str:
    """The HTML page for the ``torchdebug/`` folder of a debug run."""
    import jinja2  # lazily: only the report needs it (it comes with torch)

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return environment.from_string(_TEMPLATE).render(**collect(folder), max_diff=MAX_DIFF_LINES)
