"""The torchdebug compile backend with a data dump, as the graph-dump tests build it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchdebug.compile import CompilerConfig, get_backend


def dump_backend(path: Path, *, run_eagerly: bool = False, **options: Any) -> Any:
    """A backend dumping ``task="statistics"`` (unless ``options`` say otherwise) into ``path``,
    which is created; ``options`` are further ``dump_config`` fields. ``run_eagerly``: the graphs
    inductor would compile run eagerly (``debug.run_eagerly``), for tests whose point is not
    inductor's generated code and that would otherwise wait on a C++ compile per kernel."""
    path.mkdir(parents=True, exist_ok=True)
    config = CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.dump_config.enable_dump = True
    config.dump_config.dump_path = str(path)
    config.dump_config.task = "statistics"
    for key, value in options.items():
        setattr(config.dump_config, key, value)
    return get_backend(config)
