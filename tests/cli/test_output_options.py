"""--quiet and --verbose: progress bars on a terminal, what a long command is doing, nothing left behind."""

from __future__ import annotations

import logging

import pytest
import torch

import torchdebug
from tests.terminal import on_terminal
from torchdebug import progress
from torchdebug.cli import main


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    for name, scale in (("a", 1.01), ("b", 1.0)):
        with torchdebug.dump(root / name, task="tensor"):
            (torch.arange(16.0).reshape(4, 4) * scale).exp().sum()
    return str(root / "a"), str(root / "b")


def test_a_compare_on_a_terminal_draws_bars(dumps, monkeypatch):
    screen = on_terminal(monkeypatch)
    assert main(["compare", *dumps]) == 1
    assert "torchdebug: compare" in screen.getvalue() and "torchdebug: tensor metrics" in screen.getvalue()


def test_quiet_draws_no_bar_before_or_after_the_subcommand(dumps, monkeypatch, capsys):
    for argv in (["-q", "compare", *dumps], ["compare", *dumps, "--quiet"]):
        screen = on_terminal(monkeypatch)
        assert main(argv) == 1
        assert screen.getvalue() == ""
        assert "first divergence" in capsys.readouterr().out  # the results still print


def test_verbose_tells_what_compare_is_doing(dumps, capsys):
    assert main(["compare", *dumps, "--rerun", "-v"]) == 1
    err = capsys.readouterr().err
    assert "torchdebug.compare: rank 0: reading and pairing records" in err
    assert "tensor metrics of" in err and "op calls again in float64" in err


def test_quiet_and_verbose_together_are_a_usage_error(dumps, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *dumps, "-q", "-v"])
    assert exit_.value.code == 2
    assert "--quiet and --verbose" in capsys.readouterr().err


def test_a_command_leaves_logging_and_bars_as_it_found_them(dumps):
    logger = logging.getLogger("torchdebug")
    before = logger.handlers[:], logger.level, logger.propagate
    main(["compare", *dumps, "-q"])
    assert (logger.handlers, logger.level, logger.propagate) == before
    assert progress.set_enabled(True) is True


def test_convert_on_a_terminal_draws_a_bar(dumps, tmp_path, monkeypatch):
    screen = on_terminal(monkeypatch)
    assert main(["convert", dumps[0], str(tmp_path / "npy"), "--to", "npy"]) == 0
    assert "torchdebug: converting rank 0" in screen.getvalue()
