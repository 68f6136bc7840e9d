"""``CompilerConfig``: the options of the torchdebug compile backend.

The same kind of object as every torchdebug config (:mod:`torchdebug.options`): nested keyword-only
dataclasses whose options are checked when built and whenever assigned
(``config.debug.graph_dump.type = "py"``), cross-field rules included, so a typo or a bad
combination fails at the line that made it with one line naming the dotted key, not after a long
compile. ``dump_config`` speaks the eager dump's words (``task``, ``step``, ``data_mode``);
TorchAir's ``dump_data``, ``dump_step``, ``dump_mode`` and ``dump_layer`` still work, with a
``FutureWarning``, and stay the keys of TorchAir-style scene files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from torchdebug.config import CompileMode
from torchdebug.errors import ConfigError
from torchdebug.graph_dump import DataMode, DumpSettings, DumpStage, Task, read_scene_file, resolve
from torchdebug.options import Check, Folder, Indices, Options, Text, configclass, option

GraphPass = Callable[..., Any]
"""A user FX pass: a callable taking a ``torch.fx.Graph``."""


def _graph_pass(key: str, value: Any) -> Any:
    """A user FX pass: a callable taking a ``torch.fx.Graph`` (inductor's custom-pass contract)."""
    if value is not None and not callable(value):
        raise ConfigError(
            f"{key}: got {value!r}, expected None or a callable taking a torch.fx.Graph "
            "(an inductor CustomGraphPass keeps the FX graph cache usable)"
        )
    return value


def _writable_folder(key: str, value: Any) -> str:
    """An existing folder this process can write into (TorchAir's rule: it is not created for you)."""
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(f"{key}: got {value!r}, expected an existing writable folder path")
    folder = Path(value)
    if not folder.is_dir():
        raise ConfigError(f"{key}: got {str(value)!r}, which is not an existing folder; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: got {str(value)!r}, which this process cannot write to; choose a writable folder")
    return str(value)


def _node_names(key: str, value: Any) -> str | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = " ".join(value)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{key}: got {value!r}, expected node names separated by spaces, e.g. 'addmm mul_3'")
    return value


def _scene_file(key: str, value: Any) -> str | None:
    """A scene file is read and checked when assigned, so a bad one fails at that line."""
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value):
        raise ConfigError(f"{key}: got {value!r}, expected the path of a JSON dump config file or None")
    read_scene_file(str(value))
    return str(value)


@configclass
class DumpConfig(Options):
    """``dump_config``: op input/output data dumps inside compiled graphs (TorchAir's data dump)."""

    _ALIASES = {"dump_data": "task", "dump_step": "step", "dump_mode": "data_mode", "dump_layer": "nodes"}
    _ALIAS_VALUES = {"dump_data": {"stats": "statistics"}}

    enable_dump: bool = option("Turn graph data dumps on.", default=False)
    task: Task = option(
        "statistics: statistics only, computed inside the compiled graph (was dump_data 'stats'); tensor: "
        "tensors and statistics of the selected nodes (a scene file without dump_data: tensor, TorchAir's default).",
        default="statistics",
    )
    data_mode: list[DataMode] = option("Slots of the selected nodes: any of all, input, output (was dump_mode).", default=["all"])
    dump_path: Annotated[str, Text("an existing writable folder path")] = option(
        "An existing writable folder (checked once set, or once dumps are enabled); each run goes in a new subfolder.",
        default=".",
    )
    step: Indices = option("Steps to dump, e.g. '0|3-5|10' or [0, '3-5']; None: every step (was dump_step).", default=None)
    nodes: Annotated[str | None, Check(_node_names, schema={"type": ["string", "array", "null"]})] = option(
        "Node names as printed in the graph dumps, separated by spaces (was dump_layer); with "
        "torchdebug.scope.data_dump() blocks the selection is the union; neither: every node.",
        default=None,
    )
    dump_stage: DumpStage = option(
        "optimized: values of the compiled kernels; original: an FX interpreter over the graph before "
        "the backend's passes (the golden side).",
        default="optimized",
    )
    dump_config_path: Annotated[str | None, Check(_scene_file, schema={"type": ["string", "null"]})] = option(
        "A TorchAir-style JSON scene file (torchdebug.graph_dump._settings); options set here win over it.", default=None
    )

    def check(self) -> None:
        if self.enable_dump or "dump_path" in self.assigned:
            _writable_folder(self._key("dump_path"), self.dump_path)
        self.settings()  # the scene file and the options must make one dump

    def settings(self) -> DumpSettings:
        """The resolved dump: the scene file merged under the options set on this object."""
        file = read_scene_file(self.dump_config_path) if self.dump_config_path else None
        values = {name: getattr(self, name) for name in ("task", "data_mode", "dump_path", "step", "nodes", "dump_stage")}
        return resolve(file, values, self.assigned, prefix=self._key(""))


@configclass
class GraphDumpConfig(Options):
    """``debug.graph_dump``: extra graph dumps in one format."""

    type: Literal["txt", "py", "json", "dot"] | None = option(
        "None (off), txt, py (runnable repro), json or dot (plus .svg when Graphviz is installed); written "
        "for the first and last graph of every phase, with the stem of the matching .txt dump.",
        default=None,
    )
    path: Folder | None = option(
        "Folder for these dumps when TORCH_COMPILE_DEBUG is off (default ./torchdebug_graphs); with it on, "
        "they go into the debug folder next to the .txt dumps.",
        default=None,
    )


@configclass
class DebugConfig(Options):
    """``debug``: what to dump and how to run."""

    graph_dump: GraphDumpConfig = option("Extra graph dumps.", default_factory=GraphDumpConfig)
    run_eagerly: bool = option(
        "Run each AOT graph after the pass pipeline eagerly instead of generating code (separates a pass "
        "bug from a code-generation bug).",
        default=False,
    )


@configclass
class CompilerConfig(Options):
    """Options of :func:`torchdebug.get_backend`.

    Example::

        config = CompilerConfig()                  # or CompilerConfig(backend="aot_eager")
        config.debug.graph_dump.type = "py"
        model = torch.compile(model, backend=torchdebug.get_backend(config))
    """

    _ALIASES = {"mode": "backend"}
    _ALIAS_VALUES = {
        "mode": {"max-autotune": "inductor", "reduce-overhead": {"backend": "inductor", "compile_mode": "reduce-overhead"}}
    }  # mode="max-autotune" was plain inductor: compile_mode="max-autotune" is torch's, which searches kernels

    backend: Literal["inductor", "aot_eager", "eager"] = option(
        "The torch.compile backend the graphs go to after our passes: inductor compiles them; aot_eager: AOT "
        "autograd, then the ATen graphs run eagerly; eager: the Dynamo graph runs as is.",
        default="inductor",
    )
    compile_mode: CompileMode | None = option(
        "torch.compile's mode, for inductor (None: inductor's defaults): reduce-overhead records CUDA graphs "
        "(a graph without CUDA tensors runs without them, and a warning says so once); max-autotune searches "
        "kernels and records CUDA graphs; max-autotune-no-cudagraphs searches kernels only.",
        default=None,
    )
    debug: DebugConfig = option("What to dump and how to run.", default_factory=DebugConfig)
    dump_config: DumpConfig = option("Op data dumps inside compiled graphs.", default_factory=DumpConfig)
    post_grad_custom_pre_pass: Annotated[GraphPass | None, Check(_graph_pass)] = option(
        "A user FX pass on each AOT graph before the pipeline's own passes; dumped like ours.", default=None
    )
    post_grad_custom_post_pass: Annotated[GraphPass | None, Check(_graph_pass)] = option(
        "A user FX pass on each AOT graph after the pipeline's own passes; dumped like ours.", default=None
    )

    def check(self) -> None:
        if self.compile_mode is not None and self.backend != "inductor":
            raise ConfigError(
                f"{self._key('compile_mode')}: got {self.compile_mode!r} with {self._key('backend')}={self.backend!r}, "
                "expected None: torch.compile's modes are inductor's"
            )
