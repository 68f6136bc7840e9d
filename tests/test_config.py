import json
from typing import Annotated, Any, Literal

import pytest

from torchdebug.config import DebuggerConfig
from torchdebug.errors import ConfigError
from torchdebug.options import AtLeast, Options, configclass, index_set, option


def test_index_set_accepts_the_seed_string_form():
    assert index_set("step", "0|3-5|10") == {0, 3, 4, 5, 10}


def test_index_set_accepts_lists_of_ints_and_ranges():
    assert index_set("step", [0, "3-5"]) == {0, 3, 4, 5}


def test_index_set_empty_means_everything():
    assert index_set("step", None) is None and index_set("step", []) is None


@pytest.mark.parametrize("bad", ["5-3", "x", [-1], True, 1.5])
def test_index_set_rejects_bad_entries_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"^rank: got"):
        index_set("rank", bad)


def test_config_rejects_unknown_task_listing_the_allowed_values():
    with pytest.raises(ConfigError, match=r"task: got 'tensors', expected one of 'statistics', 'tensor', 'structure'"):
        DebuggerConfig(task="tensors")


def test_config_rejects_unknown_keys_by_name():
    with pytest.raises(ConfigError, match=r"^tsk: unknown config key, expected one of dump_path, task"):
        DebuggerConfig.from_dict({"tsk": "tensor"})


def test_config_rejects_bad_level_and_data_mode():
    with pytest.raises(ConfigError, match="level: got 'L1'"):
        DebuggerConfig(level="L1")
    with pytest.raises(ConfigError, match="data_mode: got 'fwd'"):
        DebuggerConfig(data_mode=["fwd"])


def test_config_compiled_code_takes_as_run_or_eager_and_names_them_on_a_bad_value():
    assert DebuggerConfig().compiled_code == "as_run" and DebuggerConfig(compiled_code="eager").compiled_code == "eager"
    with pytest.raises(ConfigError, match=r"^compiled_code: got 'eagerly', expected one of 'as_run', 'eager'$"):
        DebuggerConfig(compiled_code="eagerly")
    assert DebuggerConfig.json_schema()["properties"]["compiled_code"]["enum"] == ["as_run", "eager"]


def test_config_on_write_error_takes_continue_or_raise_and_names_them_on_a_bad_value():
    assert DebuggerConfig().on_write_error == "continue" and DebuggerConfig(on_write_error="raise").on_write_error == "raise"
    with pytest.raises(ConfigError, match=r"^on_write_error: got 'ignore', expected one of 'continue', 'raise'$"):
        DebuggerConfig(on_write_error="ignore")
    assert DebuggerConfig.json_schema()["properties"]["on_write_error"]["enum"] == ["continue", "raise"]


def test_config_rejects_a_range_without_two_names():
    with pytest.raises(ConfigError, match=r"range: got \['a'\], expected two call names"):
        DebuggerConfig(range=["a"])


def test_config_rejects_an_invalid_regex_pattern():
    with pytest.raises(ConfigError, match="list: pattern 're:\\(' is not a valid regex"):
        DebuggerConfig(list=["re:("])


def test_config_tensor_list_needs_the_tensor_task():
    with pytest.raises(ConfigError, match="tensor_list: needs task='tensor'"):
        DebuggerConfig(tensor_list=["mm"])


def test_config_rejects_negative_sample_stride():
    with pytest.raises(ConfigError, match="sample_stride: got -1"):
        DebuggerConfig(sample_stride=-1)


def test_config_loads_json_files_and_lets_keywords_override(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"task": "tensor", "step": "0|2", "list": ["mm"]}))
    config = DebuggerConfig.from_file(path, task="statistics")
    assert config.task == "statistics" and config.step == {0, 2} and config.list == ["mm"]


def test_config_loads_yaml_files(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "cfg.yaml"
    path.write_text("task: tensor\nlevel: mix\nrank: [0, '2-3']\n")
    config = DebuggerConfig.from_file(path)
    assert (config.task, config.level, config.rank) == ("tensor", "mix", {0, 2, 3})


def test_config_reports_malformed_json_with_its_line(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text('{"task": \n')
    with pytest.raises(ConfigError, match="is not valid JSON"):
        DebuggerConfig.from_file(path)


def test_config_schema_lists_every_option_with_its_allowed_values():
    schema = DebuggerConfig.json_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["task"]["enum"] == ["statistics", "tensor", "structure", "overflow_check", "checksum"]
    assert set(schema["properties"]) >= {
        "step",
        "rank",
        "list",
        "range",
        "tensor_list",
        "stack",
        "sample_stride",
        "overflow_nums",
        "checksum",
    }
    json.dumps(schema)  # serialisable as printed by `torchdebug config schema`


def test_config_checks_each_assignment_and_keeps_the_old_value_on_error():
    config = DebuggerConfig()
    with pytest.raises(ConfigError, match=r"^task: got 'tensors', expected one of"):
        config.task = "tensors"
    with pytest.raises(ConfigError, match=r"^tensor_list: needs task='tensor', got task='statistics'$"):
        config.tensor_list = ["mm"]
    assert config.task == "statistics" and config.tensor_list == []
    config.step = "1-2"
    assert config.step == {1, 2}


def test_config_rejects_assigning_an_unknown_option_by_name():
    with pytest.raises(ConfigError, match=r"^tsk: unknown option, expected one of 'dump_path', 'task'"):
        DebuggerConfig().tsk = "tensor"


def test_config_files_may_use_ptdbg_level_codes(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0"}))
    assert DebuggerConfig.from_file(path).level == "module"


def test_every_config_is_checked_when_built_with_one_error_shape():
    from torchdebug.compare._config import CompareConfig
    from torchdebug.compile import CompilerConfig
    from torchdebug.diagnose._config import DiagnoseConfig
    from torchdebug.monitor import MonitorConfig

    cases = [
        (lambda: CompareConfig(growth=0.5), r"^growth: got 0\.5, expected a finite number >= 1$"),
        (lambda: CompareConfig(threads=0), r"^threads: got 0, expected an integer >= 1$"),
        (lambda: CompareConfig(tolerances={"bfloat16": "loose"}), r"^tolerances\.bfloat16: got 'loose', expected a number"),
        (lambda: CompareConfig(tensor=False), r"^tensor: unknown option, expected one of 'tolerances', 'mapping'"),
        (lambda: DiagnoseConfig(accuracy_tolerance=0), r"^accuracy_tolerance: got 0, expected a finite number > 0$"),
        (lambda: DiagnoseConfig(compile_mode="fast"), r"^compile_mode: got 'fast', expected one of 'default', 'reduce-overhead'"),
        (lambda: DiagnoseConfig(backend=3), r"^backend: got 3, expected None \(inductor\), a backend name or a callable"),
        (lambda: CompilerConfig(backend="jit"), r"^backend: got 'jit', expected one of 'inductor'"),
        (lambda: DebuggerConfig(step="x"), r"^step: got 'x', expected a non-negative integer"),
        (lambda: MonitorConfig(window=1), r"^window: got 1, expected an integer >= 2$"),
        (lambda: MonitorConfig(on_anomaly="stop"), r"^on_anomaly: got 'stop', expected one of 'continue', 'skip', 'raise'$"),
    ]
    for build, message in cases:
        with pytest.raises(ConfigError, match=message):
            build()


def test_configs_survive_pickling_for_worker_processes():
    import pickle

    from torchdebug.compare._config import CompareConfig

    config = CompareConfig(tolerances={"bfloat16": 0.02}, threads=2)
    copy = pickle.loads(pickle.dumps(config))
    assert copy.to_dict() == config.to_dict() and copy.tolerances == config.tolerances
    with pytest.raises(ConfigError, match=r"^threads: got -1"):
        copy.threads = -1  # still checked after the round trip


def test_diagnose_rejects_a_bad_option_before_running_anything():
    import torchdebug

    calls = []
    with pytest.raises(ConfigError, match=r"^accuracy_tolerance: got -1"):
        torchdebug.diagnose(lambda x: calls.append(x), 1.0, accuracy_tolerance=-1)
    assert calls == []


def test_config_accepts_the_overflow_check_and_checksum_tasks():
    config = DebuggerConfig(task="overflow_check", overflow_nums=-1, checksum=True)
    assert (config.task, config.overflow_nums, config.checksum) == ("overflow_check", -1, True)
    assert DebuggerConfig(task="checksum").overflow_nums == 1


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "3"])
def test_config_overflow_nums_must_be_positive_or_minus_one(value):
    with pytest.raises(ConfigError, match=r"^overflow_nums: got .*, expected an integer >= 1, or -1 for no limit$"):
        DebuggerConfig(task="overflow_check", overflow_nums=value)


def test_config_overflow_nums_needs_the_overflow_check_task():
    with pytest.raises(ConfigError, match=r"^overflow_nums: needs task='overflow_check', got task='statistics'$"):
        DebuggerConfig(overflow_nums=5)


def test_config_overflow_check_checks_op_calls_only():
    with pytest.raises(ConfigError, match=r"^level: task='overflow_check' checks op calls, expected level='op', got 'mix'$"):
        DebuggerConfig(task="overflow_check", level="mix")


def test_config_checksum_is_a_boolean_and_needs_a_task_that_reads_values():
    with pytest.raises(ConfigError, match=r"^checksum: got 'yes', expected True or False$"):
        DebuggerConfig(checksum="yes")
    with pytest.raises(ConfigError, match=r"^checksum: needs task='statistics', 'tensor', 'overflow_check' or 'checksum'"):
        DebuggerConfig(task="structure", checksum=True)


def test_an_option_reads_its_rule_from_its_annotation():
    @configclass
    class Knobs(Options):
        size: Annotated[int, AtLeast(2)] = option("A size.", default=2)
        mode: Literal["a", "b"] | None = option("A mode.", default=None)

    with pytest.raises(ConfigError, match=r"^size: got 1, expected an integer >= 2$"):
        Knobs(size=1)
    with pytest.raises(ConfigError, match=r"^mode: got 'c', expected one of 'a', 'b'$"):
        Knobs(mode="c")
    schema = Knobs.json_schema()["properties"]
    assert schema["size"]["minimum"] == 2 and schema["mode"]["enum"] == ["a", "b", None]


def test_an_option_whose_annotation_names_no_rule_is_refused_when_its_class_is_made():
    with pytest.raises(TypeError, match=r"^Loose\.anything: no check for"):

        @configclass
        class Loose(Options):
            anything: Any = option("Anything at all.", default=None)
