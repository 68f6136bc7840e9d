"""Every input error of every subcommand: one line on stderr, ``torchdebug COMMAND: error: ...``, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import torchdebug
from torchdebug.cli import main


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    with torchdebug.dump(root / "dump"):
        torch.ones(2, 3).exp()
    (root / "file.txt").write_text("not a folder")
    (root / "entry.py").write_text("def make():\n    return 3\n")
    return root


def _error(argv: list[str], capsys) -> str:
    """Run the command line; assert exit status 2 and one line on stderr; return that line."""
    try:
        status = main(argv)
    except SystemExit as exit_:  # errors argparse finds while parsing
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


# argv (DUMP: the dump, ROOT: its folder) -> what the line says
CASES = {
    "show DUMP --name re:layers[0": "torchdebug show: error: argument --name: pattern 're:layers[0' is not a valid regex",
    "show DUMP --name ": "argument --name: got '', expected a substring or 're:REGEX' of record names",
    "show DUMP --step x": "argument --step: got 'x', expected a non-negative integer or an inclusive range",
    "show DUMP --step 5-3": "argument --step: got '5-3'",
    "show DUMP --rank -1": "argument --rank: got '-1'",
    "show DUMP --rank 7": "--rank: got 7, the run has ranks 0",
    "show DUMP --limit -1": "argument --limit: got '-1', expected an integer >= 0",
    "show ROOT/missing": "ROOT/missing: no such dump folder",
    "show ROOT/file.txt": "not a folder",
    "show ROOT": "no torchdebug dump here",
    "check ROOT/missing": "torchdebug check: error: ROOT/missing: no such dump folder",
    "convert DUMP ROOT/out --to csv": "argument --to: invalid choice: 'csv'",
    "convert DUMP ROOT/out": "--to: required for an output folder",
    "convert DUMP ROOT/file.txt --to npy": "ROOT/file.txt: exists and is not a folder",
    "convert DUMP ROOT/out --to npy --name re:(": "argument --name: pattern 're:(' is not a valid regex",
    "config check ROOT/missing.json": "torchdebug config check: error: cannot read ROOT/missing.json",
    "config bogus": "argument ACTION: invalid choice: 'bogus'",
    "compare": "give two dumps A B, or one with --across-ranks",
    "compare ROOT/missing DUMP": "ROOT/missing: no such dump folder",
    "compare DUMP DUMP --format xml": "argument --format: got 'xml'",
    "compare DUMP DUMP --workers 0": "argument --workers: got '0', expected an integer >= 1",
    "compare DUMP DUMP --threads many": "argument --threads: got 'many'",
    "compare DUMP DUMP --growth nan": "argument --growth: got 'nan', expected a finite number >= 1",
    "compare DUMP DUMP --tolerance bfloat16": "argument --tolerance: got 'bfloat16'",
    "compare --across-ranks DUMP --ranks 0,x": "argument --ranks: got 'x'",
    "compare DUMP DUMP -o ROOT/file.txt": "-o ROOT/file.txt: exists and is not a folder",
    "compare DUMP DUMP --mapping ROOT/missing.yaml": "argument --mapping: cannot read ROOT/missing.yaml (No such file",
    "compare DUMP DUMP --tolerance bfloat16=-1": "got rtol=-1.0, atol=1e-05; both must be >= 0",
    "diagnose ROOT/entry.py:make --compile-mode fast": (
        "argument --compile-mode: got 'fast', expected one of 'default', 'reduce-overhead'"
    ),
    "report ROOT/missing": "torchdebug report: error: ROOT/missing: no such folder",
    "report DUMP -o ROOT": "-o ROOT: is a folder",
    "diagnose model": "ENTRY 'model' must look like path/to/script.py:function or package.module:function",
    "diagnose ROOT/missing.py:make": "no script at ROOT/missing.py",
    "diagnose no_such_package_xyz.models:make": "no module named 'no_such_package_xyz'",
    "diagnose ROOT/entry.py:make --accuracy-tolerance 0": "argument --accuracy-tolerance: got '0', expected a finite number > 0",
    "bogus": "torchdebug: error: argument COMMAND: invalid choice: 'bogus'",
    "-q -v show DUMP": "--quiet and --verbose: give one of them",
    "diagnose ROOT/entry.py:make --output ROOT": "unrecognized arguments: --output",  # no prefix of --output-dir
}


@pytest.mark.parametrize("command", list(CASES))
def test_an_input_error_is_one_line_naming_it_with_exit_status_2(command, dump, capsys):
    def fill(text: str) -> str:
        return text.replace("DUMP", str(dump / "dump")).replace("ROOT", str(dump))

    words = command.split(" ")
    assert fill(CASES[command]) in _error([fill(word) for word in words], capsys)


def test_a_function_that_returns_no_model_is_one_line(dump, capsys):
    line = _error(["diagnose", f"{dump / 'entry.py'}:make"], capsys)
    assert line.endswith("must return (model_or_fn, example_inputs), got int")


def test_a_bad_regex_from_a_shell_is_one_line_on_stderr(dump):
    """The issue's case, as a user runs it: no traceback, exit 2."""
    result = subprocess.run(
        [sys.executable, "-m", "torchdebug", "show", str(dump / "dump"), "--name", "re:layers[0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "torchdebug show: error: argument --name: pattern 're:layers[0' is not a valid regex "
        "(unterminated character set at position 6) (see torchdebug show --help)"
    ]


def test_show_takes_step_and_rank_selections_as_the_config_writes_them(dump, capsys):
    for spec in ("0", "0-2", "0|3", "0,3"):
        assert main(["show", str(dump / "dump"), "--step", spec, "--rank", spec, "--no-stack"]) == 0
        assert "forward/-/aten.exp.default#0/output.0" in capsys.readouterr().out
    assert main(["show", str(dump / "dump"), "--step", "1-4"]) == 0
    assert "no records match" in capsys.readouterr().out
