"""Rows holding the same pair of statistics (a tensor's output row and its consumers' input rows) share
one metrics dict, computed once; metrics written to one row later stay its own."""

from torchdebug.compare._config import CompareConfig
from torchdebug.compare._steps import apply_metrics, match_rank
from torchdebug.records import Record, make_name


class _Dump:
    """One rank's records, as compare reads them."""

    def __init__(self, records: list[Record]) -> None:
        self._records = records

    def records(self) -> list[Record]:
        return self._records


def _side(scale: float) -> list[Record]:
    """``mul`` makes a tensor that ``add`` reads: the two slots share one statistics dict, as a read dump's do."""
    made = {"min": -scale, "max": scale, "mean": 0.0, "norm": scale, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 0}
    weight = {**made, "max": 2.0 * scale}

    def slot(op: str, seq: int, io: str, arg: str, stats: dict) -> Record:
        name = make_name("forward", "m", op, 0, io, arg)
        return Record(name, 0, 0, "forward", "m", op, 0, seq, io, arg, dtype="float32", shape=[4], stats=stats)

    return [
        slot("aten.mul.Tensor", 0, "input", "0", weight),
        slot("aten.mul.Tensor", 0, "output", "0", made),
        slot("aten.add.Tensor", 1, "input", "0", made),
        slot("aten.add.Tensor", 1, "output", "0", weight),
    ]


def test_rows_of_one_pair_of_statistics_share_their_metrics_and_written_metrics_stay_their_own():
    rows = match_rank(0, _Dump(_side(1.0)), _Dump(_side(1.01)), CompareConfig())
    made_out, read_in = rows[1], rows[2]
    assert made_out.name.endswith("mul.Tensor#0/output.0") and read_in.name.endswith("add.Tensor#0/input.0")
    assert made_out.metrics is read_in.metrics and made_out.difference == read_in.difference > 0.0
    assert rows[0].metrics is not made_out.metrics  # other statistics: other metrics

    apply_metrics([[read_in]], [{"cosine": 0.5, "error": 0.25}])
    assert read_in.metrics["cosine"] == 0.5 and read_in.difference == 0.25 and "error" not in read_in.metrics
    assert "cosine" not in made_out.metrics and made_out.difference != 0.25
    assert read_in.metrics["mean_diff"] == made_out.metrics["mean_diff"]  # the statistics metrics kept
