"""Records of sharded tensors (DTensor: FSDP2, tensor parallelism) read as whole tensors.

A DTensor's record holds the statistics of its *local* tensor under the tensor's global shape
(``extra``: ``placements``, ``mesh``, ``mesh_coordinate``, ``local_shape``). Against a run of another
world size (a single process), compare reads each rank of a sharded run through
:class:`ShardedRank`, which puts the pieces back together from the records alone (capture adds no
collective of its own): ``Shard`` pieces merge (min, max, sums, counts), ``Replicate`` is kept,
``Partial`` keeps the mean alone (:func:`row_note`); plain tensors tensor parallelism hands between
its layers are read as pieces of their layout, a summand combined before any collective is this
rank's value (:func:`unreduced_summands`), Megatron-style blocks of a parameter are merged
(:func:`plain_shards`). The rules: docs/compare.md, "Sharded runs: FSDP2 and tensor parallelism".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from torchdebug.compare._comparable import parameter_values
from torchdebug.compare._shard_slots import (
    EMBEDDINGS,
    Layout,
    summand,
    unmerged,
    unreduced_summands,
    vocabulary_slots,
)
from torchdebug.compare._value_graph import identity
from torchdebug.records import COLLECTIVES, Record
from torchdebug.stats import COUNT_KEYS
from torchdebug.store import Run

__all__ = [
    "ShardedRank",
    "data_split",
    "layouts",
    "local_indices",
    "whole_tensors",
    "one_shard",
    "plain_shards",
    "row_note",
    "sharded",
]

_OUTPUTS = ("output", "parameter_grad")
_COMBINED_PARTIALS = {"P(sum)": False, "P(avg)": True}
"""Partial placements whose whole value's mean combines from the summands' (``True``: divided by their number)."""


def sharded(record: Record) -> bool:
    """Whether a record holds one piece of a DTensor split over ranks (Shard or Partial)."""
    placements = record.extra.get("placements") if record.extra else None
    return any(str(p).startswith(("S(", "P(")) for p in placements or ())


def local_indices(whole: Record, part: Record) -> bool:
    """Whether ``part``, a plain record, may hold the local indices of the DTensor embedding whose
    indices ``whole`` records: ``RowwiseParallel`` shards an embedding's table by rows, and inside
    the DTensor op, where eager capture does not see it, each rank shifts the global indices to its
    shard and zeroes those outside it (``MaskPartial``); a compiled graph holds those local ones.
    Not one value, though one slot: never compared, nor followed as one value."""
    return (
        whole.op in EMBEDDINGS
        and whole.arg == "1"
        and whole.extra.get("subclass") == "DTensor"
        and not part.extra.get("subclass")
        and (whole.dtype or "").startswith(("int", "uint"))
    )


def _native(record: Record) -> Layout | None:
    """The layout a DTensor record names, when it splits the value."""
    extra = record.extra
    coordinate = extra.get("mesh_coordinate")
    if not sharded(record) or coordinate is None or record.shape is None:
        return None
    local = extra.get("local_shape", record.shape)
    return Layout(tuple(extra["placements"]), tuple(extra["mesh"]), tuple(coordinate), tuple(record.shape), tuple(local))


def _follow(inputs: Sequence[tuple[Record, Layout | None]], shape: Sequence[int] | None) -> Layout | None:
    """The layout of a plain op's output: that of its inputs holding pieces, when they share one
    whose local shape is the output's and no plain input of that shape (another value) joins them."""
    found = {layout for _, layout in inputs if layout is not None}
    if len(found) != 1 or shape is None:
        return None
    layout = next(iter(found))
    if layout.local_shape != tuple(shape):
        return None
    if any(other is None and tuple(record.shape or ()) == layout.local_shape for record, other in inputs):
        return None
    return layout


_RESHAPES = frozenset(
    {
        *("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.flatten.using_ints"),
        *("aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default"),
    }
)
"""Ops that give the same elements, in the same order, another shape."""
_TRANSPOSES = frozenset({"aten.transpose.int", "aten.t.default", "aten.permute.default"})


def _sharded_dim(layout: Layout) -> tuple[int, int] | None:
    """The mesh dimension and the tensor dimension of a layout that shards one dimension over one
    mesh dimension and replicates along the others (``None`` otherwise)."""
    if len(layout.split) != 1 or layout.partial:
        return None
    mesh_dim = layout.split[0]
    dim = int(layout.placements[mesh_dim][2:-1])
    return mesh_dim, dim % len(layout.local_shape) if layout.local_shape else dim


def _moved(layout: Layout, mesh_dim: int, dim: int, local_shape: Sequence[int]) -> Layout:
    """``layout`` (sharded over ``mesh_dim``) with its sharded dimension at ``dim`` of a tensor of local
    shape ``local_shape``."""
    placements = list(layout.placements)
    placements[mesh_dim] = f"S({dim})"
    shape = list(local_shape)
    shape[dim] *= layout.mesh[mesh_dim]
    return Layout(tuple(placements), layout.mesh, layout.coordinate, tuple(shape), tuple(local_shape))


def _reshaped(layout: Layout, shape: Sequence[int]) -> Layout | None:
    """The layout of a view of a piece as ``shape``: a piece holds a contiguous block of the whole
    tensor along its sharded dimension, so the view's dimension that starts where that one does (the
    outermost of those it splits into, or the one it merges into with the dimensions after it) holds
    the ranks' blocks in turn. ``None`` when the sharded dimension merges into one before it (its
    blocks no longer contiguous) or the layout splits otherwise (Partial: see :func:`_viewed`)."""
    found = _sharded_dim(layout)
    if found is None or math.prod(shape) != math.prod(layout.local_shape):
        return None
    before = math.prod(layout.local_shape[: found[1]])
    for dim in range(len(shape)):
        if math.prod(shape[:dim]) == before:
            return _moved(layout, found[0], dim, shape) if dim < len(shape) else None
    return None


def _transposed(layout: Layout, op: str, args: dict[str, Any], shape: Sequence[int]) -> Layout | None:
    """The layout of a transpose or permutation of a piece: its sharded dimension moved with it."""
    found = _sharded_dim(layout)
    rank = len(layout.local_shape)
    if found is None or rank != len(shape):
        return None
    order = list(range(rank))
    if op == "aten.permute.default":
        order = [int(d) % rank for d in args.get("1") or ()]
    else:
        first, second = (0, 1) if op == "aten.t.default" else (args.get("1"), args.get("2"))
        if not isinstance(first, int) or not isinstance(second, int) or rank == 0:
            return None
        first, second = first % rank, second % rank
        order[first], order[second] = order[second], order[first]
    if sorted(order) != list(range(rank)):
        return None
    return _moved(layout, found[0], order.index(found[1]), shape)


def _viewed(layout: Layout, op: str, args: dict[str, Any], shape: Sequence[int] | None) -> Layout | None:
    """The layout of a view (:data:`_RESHAPES`, :data:`_TRANSPOSES`) of a piece as ``shape``: its
    sharded dimension follows the view (a projection's local columns seen as its local heads)."""
    if shape is None:
        return None
    if op in _TRANSPOSES:
        return _transposed(layout, op, args, shape)
    return _reshaped(layout, shape)


def _arguments(records: Sequence[Record]) -> dict[tuple[int, str], dict[str, Any]]:
    """``(step, call name)`` → the argument values of the views among ``records`` (by argument)."""
    found: dict[tuple[int, str], dict[str, Any]] = {}
    for record in records:
        if record.kind != "tensor" and record.io == "input" and record.op in _TRANSPOSES:
            found.setdefault((record.step, record.call_name), {})[record.arg] = record.value
    return found


def layouts(records: Sequence[Record], shards: Mapping[str, tuple[int, ...]] | None = None, world: int = 0) -> dict[int, Layout]:
    """``id(record)`` → layout, for one rank's records (in execution order) holding a piece of a
    split value: DTensor records, the plain slots named in ``shards`` (a parameter's slots, with the
    whole value's shape: see :func:`plain_shards`, over ``world`` ranks), and the plain slots that
    follow them (module docstring)."""
    found: dict[int, Layout] = {}
    made: dict[tuple, Layout] = {}  # local identity and shape of the pieces made in this step
    step = call = None
    inputs: list[tuple[Record, Layout | None]] = []
    on_subclass = False
    arguments = _arguments(records)
    for record in records:
        if record.kind != "tensor":
            continue
        if record.step != step:
            step = record.step
            made.clear()
        name = record.call_name
        if name != call:
            call, inputs, on_subclass = name, [], False
        layout = _native(record)
        whole = shards.get(record.name) if shards else None
        if record.extra.get("subclass"):
            on_subclass = True  # a DTensor op: its records name their own layouts
        elif whole is not None:
            layout = _plain_shard(record, whole, world)
        elif not on_subclass:
            if record.io == "input":
                layout = made.get((identity(record), tuple(record.shape or ())))
            elif record.io in _OUTPUTS and (record.op in _RESHAPES or record.op in _TRANSPOSES):
                pieces = [held for _, held in inputs if held is not None]
                if len(inputs) == 1 and pieces:
                    layout = _viewed(pieces[0], record.op, arguments.get((record.step, name), {}), record.shape)
            elif record.io in _OUTPUTS and not record.op.startswith(COLLECTIVES):
                # (a collective's output is another value: an all-reduce makes P(sum) pieces whole)
                layout = _follow(inputs, record.shape)
        if record.io == "input":
            inputs.append((record, layout))
        if layout is not None:
            found[id(record)] = layout
            if record.io in _OUTPUTS and not layout.partial:
                # (a summand read by a plain op is what that op computes on: only a collective makes it whole)
                # (keyed with the local shape too: views of one saved tensor share its key)
                made[(identity(record, layout.local_shape), layout.local_shape)] = layout
    return found


@dataclass(slots=True)
class _Pieces:
    """The pieces found so far of one slot of the compared rank."""

    record: Record
    layout: Layout
    parts: dict[tuple[int, ...], tuple[int, Record, Layout]]
    """piece → (rank, record, its layout)."""
    ambiguous: bool = False


def _count(parts: Sequence[tuple[dict[str, Any], int]], key: str) -> int | None:
    """A count of the whole value: the sum of its pieces' (``None`` when a piece's record predates the count)."""
    total = 0
    for stats, _ in parts:
        value = stats.get(key)
        if value is None:
            return None
        total += value
    return total


def _whole_stats(parts: Sequence[tuple[dict[str, Any] | None, int]], layout: Layout) -> dict[str, Any] | None:
    """Min, max, mean, norm and counts of the whole value from its pieces' statistics and
    element counts; with Partial placements, the mean alone (``None`` without statistics)."""
    known = [(stats, numel) for stats, numel in parts if stats and (stats.get("mean") is not None or not numel)]
    if len(known) < len(parts):
        return None
    numel = sum(n for _, n in known)
    total = sum(stats["mean"] * n for stats, n in known if n)
    counts = {key: _count(known, key) for key in COUNT_KEYS}
    if layout.partial:
        summands = math.prod(layout.mesh[i] for i, p in enumerate(layout.placements) if p.startswith("P("))
        averaged = any(_COMBINED_PARTIALS.get(p) for p in layout.partial)
        if not all(p in _COMBINED_PARTIALS for p in layout.partial) or not numel:
            return {"min": None, "max": None, "mean": None, "norm": None, **counts}
        mean = total / (numel / summands) / (summands if averaged else 1)
        return {"min": None, "max": None, "mean": mean, "norm": None, **counts}
    present = [stats for stats, n in known if n]
    return {
        "min": min(stats["min"] for stats in present),
        "max": max(stats["max"] for stats in present),
        "mean": total / numel if numel else None,
        "norm": math.sqrt(sum((stats.get("norm") or 0.0) ** 2 for stats in present)),
        **counts,
    }


def _split_dim(local: Sequence[int], whole: Sequence[int], world: int) -> int | None:
    """The one dimension ``whole`` has ``world`` times as large as ``local`` (the others equal)."""
    if len(local) != len(whole) or world < 2:
        return None
    differ = [d for d, (size, total) in enumerate(zip(local, whole)) if size != total]
    return differ[0] if len(differ) == 1 and whole[differ[0]] == local[differ[0]] * world else None


def _plain_shard(record: Record, whole: tuple[int, ...], world: int) -> Layout | None:
    """The layout of a plain slot holding this rank's block of a value of shape ``whole``."""
    local = tuple(record.shape or ())
    dim = _split_dim(local, whole, world)
    return None if dim is None else Layout((f"S({dim})",), (world,), (record.rank,), whole, local)


def plain_shards(records: Sequence[Record], twins: Iterable[Record], world: int) -> dict[str, tuple[int, ...]]:
    """Slot name → the whole value's shape, for the plain slots of a rank holding a parameter, its
    gradient or optimizer state (Megatron-style tensor parallelism on local tensors: a vocabulary or
    a projection split by rows) whose twin slot in the other run (``twins``: its records) is
    ``world`` times as large along one dimension: the sharded run's ranks each hold one block."""
    parameters = parameter_values(records)
    local = {
        r.name: r.shape
        for r in records
        if r.kind == "tensor" and r.shape and not r.extra.get("subclass") and identity(r) in parameters
    }
    found: dict[str, tuple[int, ...]] = {}
    for twin in twins:
        shape = local.get(twin.name)
        if shape is not None and twin.shape and _split_dim(shape, twin.shape, world) is not None:
            found[twin.name] = tuple(twin.shape)
    return found


def _pieces_of(records: Sequence[Record], found: Mapping[int, Layout]) -> dict[tuple[int, str], _Pieces]:
    """The split slots of the compared rank (``found``: their :func:`layouts`), keyed by ``(step, name)``,
    each with its own piece."""
    pending = {}
    for record in records:
        layout = found.get(id(record))
        if layout is not None:
            pending[(record.step, record.name)] = _Pieces(record, layout, {layout.piece: (record.rank, record, layout)})
    return pending


def _gather(
    pending: dict[tuple[int, str], _Pieces], rank: int, run: Run, shards: Mapping[str, tuple[int, ...]] | None = None
) -> None:
    """Add the other ranks' pieces to ``pending``, one rank at a time (only the pieces are kept).
    Stops once every slot is complete when each mesh spans the world (a coordinate names one rank);
    with a sub-mesh, reads every rank to notice pieces that several ranks offer."""
    world = _world_size(run)
    unique = all(math.prod(entry.layout.mesh) == world for entry in pending.values())
    missing = sum(1 for entry in pending.values() if len(entry.parts) < entry.layout.pieces)
    for other in sorted(run.ranks, key=lambda r: (abs(r - rank), r)):
        if unique and not missing:
            return
        if other == rank:
            continue
        dump = run.ranks[other]
        records = dump.passing_records() if hasattr(dump, "passing_records") else dump.records()
        found = layouts(records, shards, world)
        for record in records:
            layout = found.get(id(record))
            entry = pending.get((record.step, record.name)) if layout is not None else None
            if layout is None or entry is None or layout.group != entry.layout.group:
                continue
            held = entry.parts.get(layout.piece)
            if held is not None:
                entry.ambiguous = entry.ambiguous or held[0] != other
                continue
            entry.parts[layout.piece] = (other, record, layout)
            missing -= len(entry.parts) == entry.layout.pieces


def _merged(entry: _Pieces) -> Record:
    """The whole-tensor record of one slot, or its own record marked when its pieces are not all there."""
    record, layout = entry.record, entry.layout
    if entry.ambiguous or len(entry.parts) < layout.pieces:
        why = f"holds one piece ({'/'.join(layout.placements)} over mesh {list(layout.mesh)}) of a " + (
            "value whose other pieces several ranks hold (a sub-mesh): the dump does not say which ranks form its group"
            if entry.ambiguous
            else f"value whose other pieces are not in the dump ({len(entry.parts)} of {layout.pieces} found)"
        )
        return dataclasses.replace(record, extra={**record.extra, "one_shard": why})
    parts = [(r.stats, math.prod(piece.local_shape)) for _, r, piece in entry.parts.values()]
    ranks = sorted(rank for rank, _, _ in entry.parts.values())
    extra = {key: value for key, value in record.extra.items() if key not in ("local_shape", "mesh_coordinate")}
    extra["merged_ranks"] = ranks
    return dataclasses.replace(
        record,
        shape=list(layout.shape),
        stride=None,
        stats=_whole_stats(parts, layout),
        checksum=None,  # a fingerprint of one piece's bytes
        tensor=None,  # one piece saved: the whole value is compared by its statistics
        extra=extra,
    )


class ShardedRank:
    """One rank of a sharded run whose split slots read as whole tensors (the module docstring);
    everything else is the rank's own (:class:`~torchdebug.store.RankRecords`).

    Each pass is linear: one over the compared rank's records, then one over each other rank's, read
    one at a time and not kept. A slot whose pieces are not all in the dump (a rank folder alone, a
    rank missing), or whose pieces several ranks offer (a sub-mesh: its coordinates do not name the
    ranks of the group), keeps its local statistics and is ``incomparable`` (:func:`one_shard`).
    """

    def __init__(self, run: Run, rank: int, other: Run | None = None) -> None:
        """``other``: the run compared with, whose slots' shapes tell a plain parameter's blocks (:func:`plain_shards`)."""
        self._run, self._rank, self._other = run, rank, other
        self._dump = run.ranks[rank]
        self._records: list[Record] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dump, name)

    @property
    def rank(self) -> int:
        return self._dump.rank

    def records(self) -> list[Record]:
        """The rank's records, split slots merged with their pieces on the other ranks."""
        if self._records is None:
            own = self._dump.records()
            world = _world_size(self._run)
            shards = plain_shards(own, self._twins(), world)
            found = layouts(own, shards, world)
            pending = _pieces_of(own, found)
            _gather(pending, self._rank, self._run, shards)
            unreduced = unreduced_summands(own, found)
            merged = {id(entry.record): _merged(entry) for entry in pending.values() if id(entry.record) not in unreduced}
            merged.update((id(record), summand(record, unreduced[id(record)])) for record in own if id(record) in unreduced)
            vocabulary = vocabulary_slots(own, found)
            merged.update((id(record), unmerged(record, vocabulary[id(record)])) for record in own if id(record) in vocabulary)
            self._records = [merged.get(id(record), record) for record in own] if merged else own
        return self._records

    def _twins(self) -> list[Record]:
        """The records of the other run's rank of this number (else its first), read as written."""
        if self._other is None or not self._other.ranks:
            return []
        dump = self._other.ranks.get(self._rank) or self._other.ranks[min(self._other.ranks)]
        return (dump._dump if isinstance(dump, ShardedRank) else dump).records()

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())


def _world_size(run: Run) -> int:
    """The run's world size: its manifests' (a run read from one rank folder has the others too)."""
    return max([len(run.ranks), *(getattr(dump, "world_size", 0) for dump in run.ranks.values())])


def data_split(dump_a: Any, dump_b: Any) -> Fraction | None:
    """A's world size over B's when they differ (a data-parallel rank holds its share of the batch,
    so its activations' sizes change by that ratio); ``None`` when they agree."""
    size_a, size_b = getattr(dump_a, "world_size", 0), getattr(dump_b, "world_size", 0)
    if not size_a or not size_b or size_a == size_b:
        return None
    return Fraction(size_a, size_b)


def whole_tensors(run: Run, other: Run) -> Run:
    """``run`` with its ranks read through :class:`ShardedRank` when ``other`` has another world
    size (a single process against a sharded run); as it is otherwise (shards pair with shards)."""
    if _world_size(run) == _world_size(other):
        return run
    return Run(path=run.path, ranks={rank: ShardedRank(run, rank, other) for rank in run.ranks})


def one_shard(row: Any) -> str | None:
    """Why a row cannot be compared when a side holds one piece of a split value (its other pieces
    are not in the dump); ``None`` otherwise."""
    for side, record in (("A", row.record_a), ("B", row.record_b)):
        why = record.extra.get("one_shard") if record is not None and record.extra else None
        if why:
            return f"{side} {why}"
    return None


def row_note(row: Any) -> str | None:
    """What a row's words must say of a merged Partial value: its summands' sums combine into the
    whole value's mean, their min, max and norm do not."""
    for side, record in (("A", row.record_a), ("B", row.record_b)):
        extra = record.extra if record is not None else None
        if extra and extra.get("unreduced"):
            placements = "/".join(extra.get("placements", ()))
            return (
                f"{side} holds this rank's summand ({placements}), which {extra['unreduced']} combines with another value "
                "before any collective sums the ranks' summands: a missing all-reduce"
            )
        if extra and extra.get("merged_ranks") and extra.get("partial"):
            placements = "/".join(extra.get("placements", ()))
            return (
                f"{side} is a partial value ({placements}): the sum of its summands on ranks {extra['merged_ranks']} "
                "gives the whole value's mean; min, max and norm of summands do not combine, so only the mean is compared"
            )
    return None
