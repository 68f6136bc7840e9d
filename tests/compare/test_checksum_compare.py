"""Checksum dumps compare bit for bit: identical runs agree, the first op making a difference is named."""

import json
from pathlib import Path

import torch

import torchdebug
from torchdebug.checksum import FINGERPRINT_VERSION
from torchdebug.cli import main
from torchdebug.compare._checksums import fingerprint_versions


class Net(torch.nn.Module):
    def __init__(self, nudge: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.nudge = nudge

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.nudge:  # another "kernel": same inputs, output bits off by rounding
            h = h * (1 + 2**-20)
        else:
            h = h * 1.0
        return self.fc2(h)


def _run(path, *, nudge=False, ulp=False, **options):
    torch.manual_seed(0)
    model = Net(nudge)
    if ulp:
        with torch.no_grad():
            model.fc2.weight[1, 3] = torch.nextafter(model.fc2.weight[1, 3], torch.tensor(9.0))
    x = torch.randn(5, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(path, model=model, **{"task": "checksum", **options}) as debugger:
        model(x).sum().backward()
        optimizer.step()
    return debugger.run_dir


def test_two_identical_runs_show_no_divergence(tmp_path):
    result = torchdebug.compare(_run(tmp_path / "a"), _run(tmp_path / "b"))
    assert not result.diverged and result.first_divergence is None
    assert all(row.verdict == "pass" for row in result.rows)


def test_a_weight_one_ulp_apart_names_the_first_op_reading_it(tmp_path):
    result = torchdebug.compare(_run(tmp_path / "a"), _run(tmp_path / "b", ulp=True))
    first = result.first_divergence
    assert result.diverged
    assert first.name == "forward/fc2/aten.t.default#0/input.0"
    assert "input bits already differ before this op" in first.message
    assert [r.name for r in result.rows if r.attribution == "blamed"] == [first.name]


def test_the_first_op_whose_output_bits_differ_with_equal_inputs_is_blamed(tmp_path):
    result = torchdebug.compare(_run(tmp_path / "a"), _run(tmp_path / "b", nudge=True))
    first = result.first_divergence
    assert first.name == "forward/<root>/aten.mul.Tensor#0/output.0"
    assert "inputs' bits agree: this op makes the difference" in first.message


def test_statistics_dumps_with_checksums_compare_bit_for_bit(tmp_path):
    a = _run(tmp_path / "a", task="statistics", checksum=True)
    b = _run(tmp_path / "b", task="statistics", checksum=True, nudge=True)
    records = torchdebug.load(a).ranks[0].records()
    assert all(r.checksum and r.stats for r in records if r.kind == "tensor")
    result = torchdebug.compare(a, b)
    assert result.first_divergence.name == "forward/<root>/aten.mul.Tensor#0/output.0"


def test_compare_exits_one_on_a_bit_difference(tmp_path):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", ulp=True)
    assert main(["compare", str(a), str(_run(tmp_path / "c")), "-q"]) == 0
    assert main(["compare", str(a), str(b), "-q"]) == 1


def _run_autocast(path, **options):
    """A bf16 autocast run of :class:`Net` (its linears in bf16, the rest in float32)."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdebug.dump(path, model=model, **{"task": "checksum", **options}) as debugger:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()
        optimizer.step()
    return debugger.run_dir


def test_runs_in_different_dtypes_are_said_to_be_so_and_nothing_is_blamed(tmp_path):
    result = torchdebug.compare(_run_autocast(tmp_path / "bf16"), _run(tmp_path / "fp32"))
    note = result.summary().splitlines()[1]
    assert note.startswith("note: checksums compare bits, and A and B hold different dtypes")
    assert "bfloat16 in A where B has float32" in note and "nothing is blamed" in note
    assert result.first_divergence is None and result.counts()["error"] == 0
    first_linear = next(row for row in result.rows if row.call_name == "forward/fc1/aten.addmm.default#0" and row.arg == "0")
    assert first_linear.verdict == "incomparable" and "dtypes differ (bfloat16 vs float32)" in first_linear.message
    assert not any("input bits already differ" in row.message for row in result.rows)


def test_with_statistics_the_slots_of_other_dtypes_keep_their_statistics_verdicts(tmp_path):
    a = _run_autocast(tmp_path / "bf16", task="statistics", checksum=True)
    result = torchdebug.compare(a, _run(tmp_path / "fp32", task="statistics", checksum=True))
    assert "keep their statistics verdicts" in result.summary().splitlines()[1]
    assert not any("bits" in row.message for row in result.rows if row.dtype_a != row.dtype_b)
    assert not any("input bits already differ" in row.message for row in result.rows)


# -- dumps whose checksums follow different definitions ----------------------------------------------------
def _as_fingerprint_1(run_dir):
    """Make ``run_dir`` read as a dump from before fingerprint 2: its ranks' manifests lose the entry
    (the checksums stay as they are: what matters is that compare does not set them side by side)."""
    for manifest_path in Path(run_dir).glob("*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        assert manifest.pop("fingerprint") == FINGERPRINT_VERSION
        manifest_path.write_text(json.dumps(manifest))
    return run_dir


def test_each_ranks_manifest_says_which_fingerprint_its_checksums_follow(tmp_path):
    dump = torchdebug.load(_run(tmp_path / "a")).ranks[0]
    assert dump.manifest["fingerprint"] == FINGERPRINT_VERSION == 2
    assert fingerprint_versions(dump, torchdebug.load(_as_fingerprint_1(_run(tmp_path / "b"))).ranks[0]) == (2, 1)


def test_an_old_fingerprint_dump_against_a_new_one_is_said_to_be_so_and_nothing_mismatches(tmp_path):
    """Equal bits, two definitions: a checksum-only compare reports no error and no pass by checksum,
    every slot incomparable with the reason, and the summary opens with a line that says so."""
    old, new = _as_fingerprint_1(_run(tmp_path / "old")), _run(tmp_path / "new")
    for a, b, sides in ((old, new, (1, 2)), (new, old, (2, 1))):
        result = torchdebug.compare(a, b)
        note = result.summary().splitlines()[1]
        assert note.startswith("note: checksums compare bits only under one definition, and A's checksums are fingerprint")
        assert f"fingerprint {sides[0]}, B's fingerprint {sides[1]}" in note and "'incomparable'" in note
        assert result.first_divergence is None and not result.diverged
        tensors = [row for row in result.rows if row.kind == "tensor" and row.record_a and row.record_b]
        assert tensors and all(row.verdict == "incomparable" for row in tensors)
        assert all("two definitions give different numbers for the same bits" in row.message for row in tensors)
        assert main(["compare", str(a), str(b), "-q"]) == 0


def test_an_old_fingerprint_dump_with_statistics_keeps_the_statistics_verdicts(tmp_path):
    """With statistics on both sides, the slots are judged by them (a real difference still shows),
    and each says why its checksums were not compared."""
    old = _as_fingerprint_1(_run(tmp_path / "old", task="statistics", checksum=True))
    same = torchdebug.compare(old, _run(tmp_path / "same", task="statistics", checksum=True))
    assert "keep their statistics verdicts" in same.summary().splitlines()[1]
    assert not same.diverged and same.counts()["error"] == 0
    tensors = [row for row in same.rows if row.kind == "tensor" and row.record_a and row.record_b]
    assert all(row.verdict == "pass" and "checksums not compared" in row.message for row in tensors)
    nudged = torchdebug.compare(old, _run(tmp_path / "nudged", task="statistics", checksum=True, nudge=True, ulp=True))
    assert all("bits" not in row.attribution for row in nudged.rows)
    assert not any("bits differ" in row.message for row in nudged.rows)


def test_two_old_fingerprint_dumps_still_compare_bit_for_bit(tmp_path):
    old = _as_fingerprint_1(_run(tmp_path / "a"))
    result = torchdebug.compare(old, _as_fingerprint_1(_run(tmp_path / "b", ulp=True)))
    assert result.diverged and result.first_divergence.name == "forward/fc2/aten.t.default#0/input.0"
