"""Cross-rank check on a three-rank data-parallel run with rank 1's parameter update perturbed."""

from __future__ import annotations

import json

import pytest

from tests.compare.replicas import PERTURBED_RANK, WORLD_SIZE
from torchdebug.cli import main
from torchdebug.compare import RanksConfig, compare, compare_ranks
from torchdebug.compare._across_ranks import ranks_in_process, replicated
from torchdebug.compare._rank_rows import SlotRows
from torchdebug.records import Record


def test_healthy_replicas_agree_on_every_replicated_slot(replicas):
    result = compare(replicas["healthy"])
    assert result.ranks == list(range(WORLD_SIZE))
    assert result.counts()["pass"] == len(result.rows) > 0
    assert result.first_divergence is None and not result.diverged


def test_the_summary_makes_no_row_of_a_rank_that_agrees(replicas, monkeypatch):
    """Counts, the first divergence and the summary read the kept rows: a row of an agreeing rank is
    made only when someone reads it (64 ranks of 60k slots would make millions); coverage makes the
    reference's row of each slot, as many as there are slots whatever the ranks."""
    result = compare(replicas["perturbed"])
    made = []
    original = SlotRows.row

    def counted(self, rank):
        made.append(rank)
        return original(self, rank)

    monkeypatch.setattr(SlotRows, "row", counted)
    assert "rank 1" in result.summary() and result.counts()["error"] > 0
    assert len(made) <= len(result.rows.slots)


def test_the_checked_slots_are_optimizer_parameters_and_collective_outputs(replicas):
    result = compare(replicas["healthy"])
    kinds = {(row.phase, row.io, row.op.split(".")[0]) for row in result.rows}
    assert ("optimizer", "output", "aten") in kinds and ("optimizer", "input", "aten") in kinds
    assert ("forward", "parameter", "module") in kinds
    assert ("forward", "output", "c10d") in kinds
    assert not any(row.op.startswith("c10d") and row.io == "input" for row in result.rows)
    assert {row.step for row in result.rows} == {0, 1}


def test_a_perturbed_update_names_the_rank_and_the_optimizer_op(replicas):
    result = compare(replicas["perturbed"])
    first = result.first_divergence
    assert (first.rank, first.step, first.phase, first.op, first.io) == (
        PERTURBED_RANK,
        0,
        "optimizer",
        "aten.add_.Tensor",
        "output",
    )
    assert "ranks 0, 2 hold the reference value" in first.message
    assert first.metrics["max_abs_err"] > 0


def test_only_the_perturbed_rank_has_errors_and_its_later_slots_are_inherited(replicas):
    result = compare(replicas["perturbed"])
    assert result.counts(0)["error"] == result.counts(2)["error"] == 0
    assert result.counts(PERTURBED_RANK)["error"] == 1
    inherited = [row for row in result.rank_rows(PERTURBED_RANK) if row.attribution == "inherited"]
    assert any(row.step == 1 and row.io == "parameter" for row in inherited)
    assert all("already diverged at optimizer/-/aten.add_.Tensor#0/output.0" in row.message for row in inherited)


def test_statistics_only_dumps_find_the_same_divergence(replicas):
    first = compare(replicas["perturbed_stats"]).first_divergence
    assert (first.rank, first.phase, first.op, first.io) == (PERTURBED_RANK, "optimizer", "aten.add_.Tensor", "output")
    assert "norm_rel" in first.metrics


def test_with_two_ranks_the_lower_rank_is_the_reference(replicas):
    result = compare(replicas["perturbed"], ranks=[0, PERTURBED_RANK])
    assert result.first_divergence.rank == PERTURBED_RANK
    assert not compare(replicas["perturbed"], ranks="0|2").diverged


def test_ranks_are_refused_with_two_dumps(replicas):
    with pytest.raises(ValueError, match=r"^ranks: chooses the ranks of one dump"):
        compare(replicas["healthy"], replicas["perturbed"], ranks=[0, 1])


def test_cli_ranks_choose_the_ranks_compared(replicas, capsys):
    assert main(["compare", "--across-ranks", str(replicas["perturbed"]), "--ranks", "0,2"]) == 0
    assert main(["compare", "--across-ranks", str(replicas["perturbed"]), "--ranks", f"0,{PERTURBED_RANK}"]) == 1
    capsys.readouterr()


def test_a_tolerance_wider_than_the_perturbation_lets_the_ranks_agree(replicas):
    assert not compare(replicas["perturbed"], tolerances={"float32": 0.1}).diverged


def test_compare_ranks_is_the_former_spelling_of_compare_with_one_dump_and_warns_naming_it(replicas):
    with pytest.warns(FutureWarning, match=r"compare_ranks\(dump\) is deprecated; use torchdebug.compare\(dump\)$"):
        old = compare_ranks(replicas["perturbed"], ranks=[0, PERTURBED_RANK])
    assert [row.to_dict() for row in old.rows] == [
        row.to_dict() for row in ranks_in_process(replicas["perturbed"], RanksConfig(ranks=[0, PERTURBED_RANK])).rows
    ]


@pytest.mark.parametrize("option", [{"mapping": {"modules": {"a": "b"}}}, {"rerun": True}, {"growth": 2.0}])
def test_options_that_need_a_reference_dump_are_refused_with_one_dump(replicas, option):
    with pytest.raises(ValueError, match=f"^{next(iter(option))}: applies to a comparison with a reference dump B"):
        compare(replicas["healthy"], **option)


def test_one_rank_is_refused(replicas):
    with pytest.raises(ValueError, match=r"ranks \[0\] only; comparing across ranks needs two or more"):
        ranks_in_process(replicas["healthy"], RanksConfig(ranks=[0]))
    with pytest.raises(ValueError, match=r"ranks: \[7\] not in"):
        ranks_in_process(replicas["healthy"], RanksConfig(ranks=[0, 7]))


def test_reduce_scatter_outputs_and_parameter_grads_are_not_replicated():
    def record(**fields):
        defaults = {"phase": "forward", "op": "aten.mm.default", "io": "output"}
        return Record(name="x", step=0, rank=0, module="-", call=0, seq=0, arg="0", **{**defaults, **fields})

    assert replicated(record(op="c10d.allreduce_.default"))
    assert not replicated(record(op="c10d._reduce_scatter_base_.default"))
    assert not replicated(record(io="parameter_grad", phase="backward"))
    assert replicated(record(phase="optimizer", io="input"))
    assert not replicated(record(phase="optimizer", kind="value"))


def test_cli_exit_status_is_0_for_agreeing_ranks_and_1_for_a_divergence(replicas, tmp_path, capsys):
    assert main(["compare", "--across-ranks", str(replicas["healthy"])]) == 0
    assert main(["compare", "--across-ranks", str(replicas["perturbed"]), "-o", str(tmp_path), "--format", "json,html"]) == 1
    out = capsys.readouterr().out
    assert "compare the ranks of" in out and f"first divergence (rank {PERTURBED_RANK}, step 0, optimizer)" in out
    report = json.loads((tmp_path / "compare.json").read_text())
    assert report["first_divergence"]["rank"] == PERTURBED_RANK
    assert "--across-ranks" in (tmp_path / "compare.html").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "0"], "comparing across ranks needs two or more"),
        (["A"], "--across-ranks takes one dump"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(replicas, capsys, argv, message):
    args = ["compare", *[a for a in argv if a == "A"], "--across-ranks", str(replicas["healthy"]), *[a for a in argv if a != "A"]]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
