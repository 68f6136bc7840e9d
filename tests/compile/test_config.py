"""CompilerConfig checks every option when it is built or assigned and names the dotted key in errors."""

from __future__ import annotations

import pytest

from torchdebug.compile import CompilerConfig
from torchdebug.errors import ConfigError


def test_compiler_config_defaults_to_inductor_without_extra_dumps() -> None:
    config = CompilerConfig()
    assert config.backend == "inductor" and config.compile_mode is None
    assert config.debug.graph_dump.type is None
    assert config.debug.run_eagerly is False
    assert config.post_grad_custom_pre_pass is None


def test_compiler_config_rejects_unknown_backend_and_compile_mode() -> None:
    with pytest.raises(ConfigError, match=r"^backend: got 'fast', expected one of 'inductor', 'aot_eager', 'eager'$"):
        CompilerConfig().backend = "fast"
    with pytest.raises(ConfigError, match=r"^compile_mode: got 'fast', expected one of 'default', 'reduce-overhead'"):
        CompilerConfig().compile_mode = "fast"


def test_torch_compile_modes_are_inductors_only() -> None:
    with pytest.raises(ConfigError, match=r"^compile_mode: got 'max-autotune' with backend='aot_eager', expected None"):
        CompilerConfig(backend="aot_eager", compile_mode="max-autotune")


@pytest.mark.parametrize(
    ("mode", "backend", "compile_mode", "message"),
    [
        ("max-autotune", "inductor", None, r"^mode is deprecated; use backend \('max-autotune' is now 'inductor'\)$"),
        (
            "reduce-overhead",
            "inductor",
            "reduce-overhead",
            r"^mode='reduce-overhead' is deprecated; use backend='inductor', compile_mode='reduce-overhead'$",
        ),
        ("aot_eager", "aot_eager", None, r"^mode is deprecated; use backend$"),
    ],
)
def test_the_old_mode_still_works_and_warns_naming_what_it_now_is(mode, backend, compile_mode, message) -> None:
    """``mode="max-autotune"`` was plain inductor, so it becomes ``backend="inductor"``, not torch's
    autotuning ``compile_mode``; ``reduce-overhead`` takes two options now."""
    for build in (lambda: CompilerConfig(mode=mode), lambda: CompilerConfig.from_dict({"mode": mode})):
        with pytest.warns(FutureWarning, match=message):
            config = build()
        assert (config.backend, config.compile_mode) == (backend, compile_mode)
    config = CompilerConfig(backend="eager")
    with pytest.warns(FutureWarning, match=message):
        config.mode = mode
    assert (config.backend, config.compile_mode) == (backend, compile_mode)


def test_compiler_config_rejects_unknown_graph_dump_type_listing_the_valid_ones() -> None:
    config = CompilerConfig()
    expected = "debug.graph_dump.type: got 'svg', expected one of 'txt', 'py', 'json', 'dot'"
    with pytest.raises(ConfigError) as error:
        config.debug.graph_dump.type = "svg"
    assert str(error.value) == expected


def test_compiler_config_rejects_unknown_option_by_its_dotted_key() -> None:
    with pytest.raises(ConfigError, match=r"^debug\.graph_dumps: unknown option, expected one of 'graph_dump', 'run_eagerly'$"):
        CompilerConfig().debug.graph_dumps = "py"


def test_compiler_config_rejects_non_bool_run_eagerly() -> None:
    with pytest.raises(ConfigError, match=r"^debug\.run_eagerly: got 1, expected True or False$"):
        CompilerConfig().debug.run_eagerly = 1


def test_compiler_config_rejects_non_callable_user_pass() -> None:
    with pytest.raises(ConfigError, match=r"^post_grad_custom_pre_pass: got 'dce', expected None or a callable"):
        CompilerConfig().post_grad_custom_pre_pass = "dce"


def test_compiler_config_refuses_to_replace_an_option_group() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^debug: got \{\}, expected a DebugConfig \(a group of options: set its fields, e\.g\. debug\.graph_dump\)$",
    ):
        CompilerConfig().debug = {}


def test_compiler_config_rejects_empty_graph_dump_path() -> None:
    with pytest.raises(ConfigError, match=r"^debug\.graph_dump\.path: got '', expected a folder path"):
        CompilerConfig().debug.graph_dump.path = ""


def test_compiler_config_accepts_top_level_options_as_keywords() -> None:
    config = CompilerConfig(backend="aot_eager")
    assert config.backend == "aot_eager"
    with pytest.raises(ConfigError, match=r"^moed: unknown option"):
        CompilerConfig(moed="eager")


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        CompilerConfig().backend = "jit"


def test_compiler_config_to_dict_names_user_passes() -> None:
    def strip_asserts(graph):  # noqa: ANN001 - a user pass
        return None

    config = CompilerConfig()
    config.post_grad_custom_post_pass = strip_asserts
    config.debug.graph_dump.type = "json"
    as_dict = config.to_dict()
    assert as_dict["debug"]["graph_dump"] == {"type": "json", "path": None}
    assert as_dict["post_grad_custom_post_pass"].endswith("strip_asserts")
