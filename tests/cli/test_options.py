"""Options declared once: ``torchdebug compare`` and ``torchdebug diagnose`` flags, and the keyword
options of ``compare()``, ``compare_distributed()``, ``compare_ranks()``, ``compare_ranks_distributed()``
and ``diagnose()``, come from the config fields."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys

import pytest

from torchdebug.cli import build_parser, main
from torchdebug.cli.arguments import options_of
from torchdebug.compare._config import CompareConfig, RanksConfig
from torchdebug.compare._tolerances import Tolerance
from torchdebug.diagnose._config import DiagnoseConfig
from torchdebug.errors import ConfigError
from torchdebug.options import specs

CONFIGS = {"compare": CompareConfig, "diagnose": DiagnoseConfig}
POSITIONALS = {"compare": ["a", "b"], "diagnose": ["script.py:make"]}


def _actions(command: str) -> dict[str, object]:
    parser = build_parser([command])
    subparser = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {action.dest: action for action in subparser._actions if action.help != argparse.SUPPRESS}


@pytest.mark.parametrize("command", list(CONFIGS))
def test_each_option_is_a_flag_with_the_fields_word_help_choices_and_default(command):
    actions = _actions(command)
    for spec in specs(CONFIGS[command]):
        action = actions[spec.name]
        word = "--" + (spec.flag.word or spec.name).replace("_", "-")
        assert word in action.option_strings, spec.name
        assert action.help.startswith(spec.doc.replace("%", "%%")), spec.name
        assert action.default == spec.default, spec.name
        enum = spec.schema.get("enum")
        assert action.choices == (None if enum is None else [value for value in enum if value is not None]), spec.name
        if isinstance(spec.default, bool):
            assert action.option_strings[-1] == f"--no-{word[2:]}", spec.name


@pytest.mark.parametrize("command", list(CONFIGS))
def test_the_flags_defaults_build_the_default_config(command):
    args = build_parser().parse_args([command, *POSITIONALS[command]])
    assert CONFIGS[command](**options_of(args, CONFIGS[command])).to_dict() == CONFIGS[command]().to_dict()


def test_compare_flags_give_the_config_the_python_keywords_give():
    argv = ["compare", "a", "b", "--tolerance", "bfloat16=0.02", "--tolerance", "float32=1e-5,1e-6", "--growth", "4"]
    argv += ["--no-tensors", "--threads", "2", "--workers", "3", "--rerun"]
    config = CompareConfig(**options_of(build_parser().parse_args(argv), CompareConfig))
    expected = CompareConfig(
        tolerances={"bfloat16": 0.02, "float32": {"rtol": 1e-5, "atol": 1e-6}},
        growth=4.0,
        tensors=False,
        threads=2,
        workers=3,
        rerun=True,
    )
    assert config.to_dict() == expected.to_dict()
    assert config.tolerances == {"bfloat16": Tolerance(0.02, 1e-5), "float32": Tolerance(1e-5, 1e-6)}


def test_diagnose_flags_give_the_config_the_python_keywords_give():
    argv = ["diagnose", "s.py:f", "--backend", "aot_eager", "--no-train", "--compile-mode", "max-autotune"]
    argv += ["--accuracy-tolerance", "0.01", "-o", "out", "--no-repro"]
    config = DiagnoseConfig(**options_of(build_parser().parse_args(argv), DiagnoseConfig))
    expected = DiagnoseConfig(
        backend="aot_eager", train=False, compile_mode="max-autotune", accuracy_tolerance=0.01, output_dir="out", repro=False
    )
    assert config.to_dict() == expected.to_dict()


@pytest.mark.parametrize(
    ("argv", "dest", "value", "new"),
    [
        (["compare", "a", "b", "--replay"], "rerun", True, "--rerun"),
        (["compare", "a", "b", "--no-replay"], "rerun", False, "--no-rerun"),
    ],
)
def test_an_old_flag_still_works_and_warns_naming_the_new_one(argv, dest, value, new):
    old = argv[-1]
    with pytest.warns(FutureWarning, match=f"^{old} is deprecated; use {new}$"):
        assert getattr(build_parser().parse_args(argv), dest) == value


def test_an_old_flag_is_hidden_from_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "--rerun" in out
    assert "--replay" not in out and "--no-replay" not in out


def test_an_old_flag_on_the_command_line_warns_in_one_line(capsys):
    assert main(["compare", "no-such-dump-a", "no-such-dump-b", "--replay"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == "torchdebug: warning: --replay is deprecated; use --rerun"


def test_the_flags_and_names_of_0_1_0_development_are_gone():
    import torchdebug
    import torchdebug.diagnose

    for old in ("--forward-only", "--mode"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["diagnose", "s.py:f", old, "x"])
    for old in ("--statistics-only", "--stats-only"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["compare", "a", "b", old])
    with pytest.raises(ConfigError, match="mode"):
        DiagnoseConfig(mode="reduce-overhead")
    for package in (torchdebug, torchdebug.diagnose):
        with pytest.raises(AttributeError, match="DiagnoseReport"):
            package.DiagnoseReport  # noqa: B018


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["compare", "a", "b", "--growth", "0.5"], "argument --growth: got '0.5', expected a finite number >= 1"),
        (["compare", "a", "b", "--growth", "inf"], "argument --growth: got 'inf', expected a finite number >= 1"),
        (["compare", "a", "b", "--threads", "0"], "argument --threads: got '0', expected an integer >= 1"),
        (["compare", "a", "b", "--tolerance", "bf16"], "argument --tolerance: got 'bf16', expected DTYPE=RTOL or"),
        (
            ["diagnose", "s.py:f", "--compile-mode", "fast"],
            "argument --compile-mode: got 'fast', expected one of 'default', 'reduce-overhead'",
        ),
        (
            ["diagnose", "s.py:f", "--accuracy-tolerance", "0"],
            "argument --accuracy-tolerance: got '0', expected a finite number > 0",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_and_what_it_takes(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert f"torchdebug {argv[0]}: error: {line}" in err


def test_compare_takes_a_config_or_keyword_options_checked_by_it(tmp_path):
    from torchdebug.compare import compare, compare_distributed

    for function in (compare, compare_distributed):
        parameters = inspect.signature(function).parameters
        assert list(parameters) == ["a", "b", "config", *(f.name for f in dataclasses.fields(CompareConfig))]
        assert parameters["growth"].default == 16.0 and parameters["tensors"].default is True
        assert all(f"    {f.name}: " in function.__doc__ for f in dataclasses.fields(CompareConfig))
    missing = tmp_path / "missing"  # options are checked before the dumps are opened
    with pytest.raises(ConfigError, match=r"^growht: unknown option, expected one of 'tolerances'"):
        compare(missing, missing, growht=2)
    with pytest.raises(ConfigError, match=r"^growth: got 0\.5, expected a finite number >= 1$"):
        compare(missing, missing, config=CompareConfig(rerun=True), growth=0.5)
    with pytest.raises(ConfigError, match=r"^config: got 'fast', expected a CompareConfig"):
        compare(missing, missing, config="fast")


def test_compare_ranks_takes_a_config_or_keyword_options_it_shares_with_compare(tmp_path):
    from torchdebug.compare import compare_ranks, compare_ranks_distributed

    for function in (compare_ranks, compare_ranks_distributed):
        parameters = inspect.signature(function).parameters
        assert list(parameters) == ["dump", "config", "ranks", "tolerances", "tensors", "threads", "workers"]
    shared = {f.name: f.metadata["doc"] for f in dataclasses.fields(CompareConfig)}
    assert all(shared[f.name] == f.metadata["doc"] for f in dataclasses.fields(RanksConfig) if f.name != "ranks")
    missing = tmp_path / "missing"  # options are checked before the dump is opened
    with pytest.raises(ConfigError, match=r"^ranks: got 'x', expected a non-negative integer"):
        compare_ranks(missing, ranks="x")
    with pytest.raises(ConfigError, match=r"^growth: unknown option"):
        compare_ranks(missing, growth=2)
    with pytest.raises(ConfigError, match=r"^workers: got 0, expected"):
        compare_ranks(missing, workers=0)
    assert RanksConfig(ranks=[0, "2-3"]).ranks == {0, 2, 3}


def test_compare_across_ranks_flags_give_the_config_the_python_keywords_give():
    argv = ["compare", "--across-ranks", "d", "--ranks", "0,2-3", "--tolerance", "float32=0.1", "--no-tensors"]
    config = RanksConfig(**options_of(build_parser().parse_args(argv), RanksConfig))
    expected = RanksConfig(ranks=[0, 2, 3], tolerances={"float32": 0.1}, tensors=False)
    assert config.to_dict() == expected.to_dict()


def test_keyword_options_win_over_the_config_they_come_with():
    config = CompareConfig(rerun=True, growth=8)
    merged = CompareConfig.build(config, growth=2)
    assert (merged.growth, merged.rerun, config.growth) == (2, True, 8)
    assert CompareConfig.build(config) is config and CompareConfig.build(growth=3).growth == 3


def test_diagnose_takes_a_config_or_keyword_options_checked_by_it():
    from torchdebug.diagnose import diagnose

    parameters = inspect.signature(diagnose).parameters
    assert list(parameters) == ["fn", "example_inputs", "config", *(f.name for f in dataclasses.fields(DiagnoseConfig))]
    assert parameters["train"].default is True and parameters["output_dir"].default == "torchdebug_diagnose"
    with pytest.raises(ConfigError, match=r"^trian: unknown option"):
        diagnose(abs, 1.0, trian=False)


def test_the_option_classes_the_command_line_imports_load_no_torch():
    code = "import sys, torchdebug.compare._config, torchdebug.diagnose._config; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_diagnoses_tolerance_is_now_accuracy_tolerance_with_a_warning():
    """compare's --tolerance is per dtype (DTYPE=RTOL); diagnose's is the one tol of PyTorch's accuracy check."""
    with pytest.warns(FutureWarning, match=r"^--tolerance is deprecated; use --accuracy-tolerance$"):
        assert build_parser().parse_args(["diagnose", "s.py:f", "--tolerance", "0.01"]).accuracy_tolerance == 0.01
    with pytest.warns(FutureWarning, match=r"^tolerance is deprecated; use accuracy_tolerance$"):
        assert DiagnoseConfig(tolerance=0.01).accuracy_tolerance == 0.01


def test_compares_replay_is_now_rerun_with_a_warning():
    """The monitor's replay runs a whole step again; compare's runs single op calls: ``rerun``."""
    with pytest.warns(FutureWarning, match=r"^--replay is deprecated; use --rerun$"):
        assert build_parser().parse_args(["compare", "a", "b", "--replay"]).rerun is True
    with pytest.warns(FutureWarning, match=r"^--no-replay is deprecated; use --no-rerun$"):
        assert build_parser().parse_args(["compare", "a", "b", "--no-replay"]).rerun is False
    with pytest.warns(FutureWarning, match=r"^replay is deprecated; use rerun$"):
        assert CompareConfig(replay=True).rerun is True
